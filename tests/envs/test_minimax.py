"""Minimax: forced wins in one, blocking a loss in one, perfect tic-tac-toe, a symmetric heuristic,
and the batched full-width search giving the alpha-beta's best moves and the same games."""

from __future__ import annotations

import numpy as np
import pytest

from rlstack.envs.games import CONNECT_FOUR, TICTACTOE, Boards, ConnectFour, TicTacToe, game_spec
from rlstack.envs.minimax import NO_MOVE, WIN, Minimax, perfect_player, planes_to_bits
from rlstack.envs.players import RandomPlayer


def position(game, moves):
    for m in moves:
        game.step(m)
    return game


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_connect_four_takes_the_win_in_one(depth):
    # Player 0 has three in the bottom row (columns 1-3); column 0 and column 4 both win.
    game = position(ConnectFour(), [1, 1, 2, 2, 3, 3])
    player = Minimax(CONNECT_FOUR, depth, seed=0)
    me, opp = planes_to_bits(game.observe()["observation"])
    assert sorted(player.best_moves(me, opp)) == [0, 4]
    move = player.choose(game.observe()["observation"])
    game.step(move)
    assert game.winner == 0


@pytest.mark.parametrize("depth", [2, 3, 5])
def test_connect_four_blocks_a_loss_in_one(depth):
    # Player 0 threatens a vertical four in column 6; player 1 (to move) must block there.
    game = position(ConnectFour(), [6, 0, 6, 1, 6])
    move = Minimax(CONNECT_FOUR, depth, seed=0).choose(game.observe()["observation"])
    assert move == 6


def test_tictactoe_win_in_one_is_preferred_over_blocking():
    # X: 0, 1 (threatens 2); O: 3, 4 (threatens 5); X to move wins at 2 rather than blocking 5.
    game = position(TicTacToe(), [0, 3, 1, 4])
    assert perfect_player(TICTACTOE, seed=0).choose(game.observe()["observation"]) == 2


def test_tictactoe_blocks_a_loss_in_one():
    # X: 0, 1 threaten 2; O to move must block at 2.
    game = position(TicTacToe(), [0, 4, 1])
    player = perfect_player(TICTACTOE, seed=0)
    me, opp = planes_to_bits(game.observe()["observation"])
    assert player.best_moves(me, opp) == [2]


def test_perfect_tictactoe_player_draws_itself_and_never_loses_to_random():
    player = perfect_player(TICTACTOE, seed=1)
    assert player.value(0, 0) == 0  # tic-tac-toe is a draw
    me, opp = 0, 0
    assert sorted(player.best_moves(me, opp)) == list(range(9))  # every opening draws
    rng = np.random.default_rng(0)
    random = RandomPlayer(TICTACTOE)
    for g in range(40):
        game, perfect_seat = TicTacToe(), g % 2
        while not game.done:
            obs = game.flat_obs()[None]
            mover = player if game.current_player == perfect_seat else random
            game.step(int(mover.act(obs, rng)[0]))
        assert game.reward(perfect_seat) >= 0.0
    for _ in range(5):
        game = TicTacToe()
        while not game.done:
            game.step(player.choose(game.observe()["observation"]))
        assert game.winner is None


def test_heuristic_is_zero_sum():
    player = Minimax(CONNECT_FOUR, 2)
    game = position(ConnectFour(), [3, 3, 2, 4, 4, 1, 5])
    me, opp = planes_to_bits(game.observe()["observation"])
    assert player.heuristic(me, opp) == -player.heuristic(opp, me)
    assert player.heuristic(me, opp) != 0


def test_depth_two_beats_random_at_connect_four():
    player, random = Minimax(CONNECT_FOUR, 2, seed=0), RandomPlayer(CONNECT_FOUR)
    rng = np.random.default_rng(0)
    wins = 0
    for g in range(10):
        game, seat = ConnectFour(), g % 2
        while not game.done:
            mover = player if game.current_player == seat else random
            game.step(int(mover.act(game.flat_obs()[None], rng)[0]))
        wins += game.reward(seat) == 1.0
    assert wins >= 9


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Minimax(CONNECT_FOUR, 0)


def random_games(spec, n, seed):
    """Games in progress after a random number of random legal moves (fewer than n: finished
    games are dropped)."""
    rng = np.random.default_rng(seed)
    boards = Boards(spec, n)
    plies = rng.integers(0, spec.n_cells, n)
    for _ in range(spec.n_cells):
        live = np.flatnonzero(~boards.over & (boards.n_moves < plies))
        if not len(live):
            break
        mask = boards.legal_mask(live)
        boards.play(np.where(mask, rng.random(mask.shape), -1.0).argmax(1), live)
    return boards.take(np.flatnonzero(~boards.over))


def pieces(boards):
    """The mover's and the opponent's pieces, bool [n, n_cells] each."""
    planes = boards.planes().reshape(boards.n, -1, 2) > 0
    return planes[..., 0], planes[..., 1]


@pytest.mark.parametrize(("game", "depth"), [("connect4", 1), ("connect4", 2), ("connect4", 3), ("connect4", 4),
                                             ("tictactoe", 1), ("tictactoe", 2), ("tictactoe", 3)])
def test_batched_search_finds_the_alpha_beta_best_moves(game, depth):
    spec = game_spec(game)
    boards = random_games(spec, 600 if spec.gravity else 360, seed=depth)
    assert boards.n >= 250
    me, opp = pieces(boards)
    values = Minimax(spec, depth).move_values(me, opp)  # [n, n_actions]
    legal = boards.legal_mask()
    assert ((values == NO_MOVE) == ~legal).all()
    assert (np.abs(values[legal]) <= WIN - 1).all()
    best = values == values.max(1, keepdims=True)
    alpha_beta = Minimax(spec, depth)
    wins_now = 0
    for i, planes in enumerate(boards.planes()):
        bits = planes_to_bits(planes)
        assert np.flatnonzero(best[i]).tolist() == sorted(alpha_beta.best_moves(*bits)), boards.render(i)
        assert values[i].max() == alpha_beta.value(*bits), boards.render(i)
        wins_now += values[i].max() == WIN - 1
    assert 0 < wins_now < boards.n  # both kinds of position were compared


# A Connect Four game that fills the board without a winner.
DRAWN = [4, 6, 6, 1, 0, 0, 5, 6, 6, 4, 6, 6, 0, 0, 5, 0, 5, 4, 4, 2, 0, 3, 4, 2, 4, 2, 3, 1, 2, 2, 1, 5, 5,
         1, 5, 3, 1, 2, 3, 3, 1, 3]


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_batched_search_scores_a_full_board_as_a_draw(depth):
    # Near the end of a drawn game a move can fill the board: a draw, 0, whatever the centre holds.
    lengths = np.arange(30, len(DRAWN))  # game i stops after lengths[i] moves
    boards = Boards(CONNECT_FOUR, len(lengths))
    for t, move in enumerate(DRAWN[:-1]):
        idx = np.flatnonzero(lengths > t)
        boards.play(np.full(len(idx), move), idx)
    values = Minimax(CONNECT_FOUR, depth).move_values(*pieces(boards))
    alpha_beta = Minimax(CONNECT_FOUR, depth)
    for i, planes in enumerate(boards.planes()):
        bits = planes_to_bits(planes)
        assert np.flatnonzero(values[i] == values[i].max()).tolist() == sorted(alpha_beta.best_moves(*bits))
        assert values[i].max() == alpha_beta.value(*bits)
    assert values[-1].max() == 0  # the last move fills the board


def test_act_plays_the_same_moves_batched_as_one_by_one():
    boards = random_games(CONNECT_FOUR, 300, seed=7)
    batched = Minimax(CONNECT_FOUR, 3, seed=0)
    one_by_one = Minimax(CONNECT_FOUR, 3, seed=0, leaf_budget=0)
    # A position with tied best moves, six times over: each occurrence draws its own move.
    tied = next(i for i, p in enumerate(boards.planes()) if len(one_by_one.best_moves(*planes_to_bits(p))) > 1)
    obs = np.concatenate([boards.flat_obs(np.full(6, tied)), boards.flat_obs()])
    for _ in range(2):  # the second time from the cache
        moves = batched.act(obs, np.random.default_rng(1))
        assert (moves == one_by_one.act(obs, np.random.default_rng(1))).all()
        assert batched.nodes == 0 and one_by_one.nodes > 0  # alpha-beta ran only one by one
    assert boards.legal_mask()[np.arange(boards.n), moves[6:]].all()
    assert len(set(moves[:6].tolist())) > 1


def test_perfect_tictactoe_player_searches_the_opening_with_alpha_beta():
    player = perfect_player(TICTACTOE, seed=0)
    player.act(Boards(TICTACTOE, 8).flat_obs(), np.random.default_rng(0))  # 9 ** 9 leaves: too many
    assert player.nodes > 0
    # Late positions fit the budget and are searched together, with the same moves.
    boards = random_games(TICTACTOE, 400, seed=3)
    late = boards.flat_obs(np.flatnonzero(boards.n_moves >= 5))
    batched, one_by_one = perfect_player(TICTACTOE, seed=2), perfect_player(TICTACTOE, seed=2)
    one_by_one.leaf_budget = 0
    moves = batched.act(late, np.random.default_rng(4))
    assert len(late) > 50 and batched.nodes == 0
    assert (moves == one_by_one.act(late, np.random.default_rng(4))).all()


def test_move_values_refuses_finished_games():
    player = Minimax(TICTACTOE, 2)
    game = position(TicTacToe(), [0, 3, 1, 4, 2])  # X has the top row
    me, opp = pieces(game.boards)
    with pytest.raises(ValueError, match="games in progress"):
        player.move_values(me, opp)
    # The player still answers the position as before, from the alpha-beta.
    assert player.act(game.boards.flat_obs(), np.random.default_rng(0)).shape == (1,)
    assert player.nodes > 0

"""Game rules: wins in every direction, draws, illegal moves, masks, mover-perspective planes."""

from __future__ import annotations

import numpy as np
import pytest

from rlstack.envs.games import (
    CONNECT_FOUR,
    TICTACTOE,
    Boards,
    ConnectFour,
    IllegalMoveError,
    TicTacToe,
    boards_from_planes,
    game_spec,
)
from rlstack.spaces import MaskedBox

# A full Connect Four game without four in a row (found by a seeded random search, checked below).
C4_DRAW = [5, 5, 5, 0, 5, 4, 4, 6, 6, 3, 5, 1, 3, 5, 2, 1, 2, 3, 0, 4, 1, 4, 3, 0, 2, 2, 2, 1, 0, 0,
           0, 2, 1, 6, 1, 3, 4, 4, 3, 6, 6, 6]


def play(game, moves):
    for m in moves:
        assert not game.done, f"game ended before move {m}"
        game.step(m)
    return game


# ----- wins in all four directions -----------------------------------------------------------

@pytest.mark.parametrize("moves, direction", [
    ([0, 0, 1, 1, 2, 2, 3], "horizontal"),
    ([6, 5, 6, 5, 6, 5, 6], "vertical"),
    # X builds the / diagonal (0,0)-(1,1)-(2,2)-(3,3) from the bottom row up.
    ([0, 1, 1, 2, 2, 3, 2, 3, 3, 6, 3], "diagonal /"),
    # X builds the \ diagonal (0,3)-(1,2)-(2,1)-(3,0) from the bottom row up.
    ([3, 2, 2, 1, 1, 0, 1, 0, 0, 6, 0], "diagonal \\"),
])
def test_connect_four_win_in_each_direction(moves, direction):
    game = play(ConnectFour(), moves)
    assert game.done, direction
    assert game.winner == 0
    assert game.reward(0) == 1.0 and game.reward(1) == -1.0


def test_connect_four_second_player_wins_and_gets_plus_one():
    game = play(ConnectFour(), [0, 1, 0, 1, 2, 1, 2, 1])
    assert game.winner == 1
    assert (game.reward(0), game.reward(1)) == (-1.0, 1.0)


def test_three_in_a_row_is_not_a_connect_four_win():
    game = play(ConnectFour(), [0, 0, 1, 1, 2, 2])
    assert not game.done and game.winner is None


@pytest.mark.parametrize("moves", [
    [0, 3, 1, 4, 2],          # top row
    [0, 1, 3, 2, 6],          # left column
    [0, 1, 4, 2, 8],          # main diagonal
    [2, 0, 4, 1, 6],          # anti-diagonal
])
def test_tictactoe_wins(moves):
    game = play(TicTacToe(), moves)
    assert game.done and game.winner == 0 and game.reward(0) == 1.0 and game.reward(1) == -1.0


def test_windows_count_every_line():
    # 8 lines in tic-tac-toe; Connect Four: 24 horizontal + 21 vertical + 2 * 12 diagonal = 69.
    assert TICTACTOE.windows().shape == (8, 9)
    assert CONNECT_FOUR.windows().shape == (69, 42)


# ----- draws ------------------------------------------------------------------------------------

def test_tictactoe_draw():
    game = play(TicTacToe(), [0, 4, 8, 2, 6, 3, 5, 7, 1])
    assert game.done and game.winner is None
    assert game.reward(0) == game.reward(1) == 0.0


def test_connect_four_draw_fills_the_board():
    game = play(ConnectFour(), C4_DRAW)
    assert game.done and game.winner is None
    assert game.reward(0) == game.reward(1) == 0.0
    assert game.observe()["action_mask"].sum() == 0


# ----- illegal moves ----------------------------------------------------------------------------

def test_occupied_cell_is_refused_and_not_played():
    game = play(TicTacToe(), [4])
    before = game.boards.stones.copy()
    with pytest.raises(IllegalMoveError, match=r"illegal move cell 4 \(occupied\); legal cells: \[0, 1, 2, 3, 5"):
        game.step(4)
    assert np.array_equal(game.boards.stones, before)
    assert game.current_player == 1


def test_full_column_is_refused():
    game = play(ConnectFour(), [3, 3, 3, 3, 3, 3])
    with pytest.raises(IllegalMoveError, match=r"column 3 \(full\); legal columns: \[0, 1, 2, 4, 5, 6\]"):
        game.step(3)
    assert game.boards.n_moves[0] == 6


@pytest.mark.parametrize("bad", [-1, 7, 100])
def test_out_of_range_move_is_refused(bad):
    with pytest.raises(IllegalMoveError, match="out of range 0..6"):
        ConnectFour().step(bad)


def test_fractional_move_is_refused():
    with pytest.raises(IllegalMoveError, match="integers"):
        TicTacToe().boards.play(np.array([1.5]))


def test_no_move_after_the_game_is_over():
    game = play(TicTacToe(), [0, 3, 1, 4, 2])
    with pytest.raises(IllegalMoveError, match="the game is over"):
        game.step(8)


def test_batched_illegal_move_plays_nothing_in_any_game():
    boards = Boards(TICTACTOE, 3)
    boards.play(np.array([0, 1, 2]))
    with pytest.raises(IllegalMoveError):
        boards.play(np.array([5, 1, 6]))  # game 1 repeats cell 1
    assert boards.n_moves.tolist() == [1, 1, 1]


# ----- masks and planes ---------------------------------------------------------------------------

def test_masks_follow_the_board():
    game = play(ConnectFour(), [2, 2, 2, 2, 2, 2])
    assert game.observe()["action_mask"].tolist() == [1, 1, 0, 1, 1, 1, 1]
    ttt = play(TicTacToe(), [0, 8])
    assert ttt.observe()["action_mask"].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 0]
    assert ttt.legal_actions() == [1, 2, 3, 4, 5, 6, 7]


def test_planes_are_from_the_movers_perspective():
    game = ConnectFour()
    game.step(3)  # player 0 drops into column 3: bottom row (row 5)
    obs = game.observe()["observation"]
    assert obs.shape == (6, 7, 2) and obs.dtype == np.int8
    # Player 1 is to move: its own plane is empty, the opponent's piece is in plane 1.
    assert obs[..., 0].sum() == 0
    assert obs[5, 3, 1] == 1 and obs[..., 1].sum() == 1
    game.step(3)  # player 1 on top of it (row 4)
    obs = game.observe()["observation"]
    assert obs[5, 3, 0] == 1 and obs[4, 3, 1] == 1  # player 0 again: its piece in plane 0
    assert obs.sum() == 2


def test_observation_matches_pettingzoo_spaces():
    for game in (TicTacToe(), ConnectFour()):
        obs = game.observe()
        assert game.observation_space.contains(obs)
        assert set(obs) == {"observation", "action_mask"}


def test_flat_obs_layout_is_planes_then_mask():
    game = play(ConnectFour(), [0, 6, 6])
    flat = game.flat_obs()
    space = CONNECT_FOUR.flat_space()
    assert isinstance(space, MaskedBox) and space.contains(flat)
    assert np.array_equal(space.flatten(game.observe()), flat)
    back = space.unflatten(flat)
    assert np.array_equal(back["observation"], game.observe()["observation"])
    assert np.array_equal(back["action_mask"], game.observe()["action_mask"] > 0)


def test_boards_from_planes_rebuilds_the_position():
    game = play(ConnectFour(), [3, 3, 4, 2, 0])
    rebuilt = boards_from_planes(CONNECT_FOUR, game.observe()["observation"][None])
    assert rebuilt.to_move[0] == 1
    assert np.array_equal(rebuilt.planes()[0], game.observe()["observation"])
    assert np.array_equal(rebuilt.heights, game.boards.heights)


def test_batched_boards_match_single_games():
    rng = np.random.default_rng(3)
    boards, games = Boards(CONNECT_FOUR, 5), [ConnectFour() for _ in range(5)]
    for _ in range(12):
        live = np.flatnonzero(~boards.over)
        if not len(live):
            break
        moves = np.array([rng.choice(np.flatnonzero(boards.legal_mask([i])[0])) for i in live])
        boards.play(moves, live)
        for i, m in zip(live, moves, strict=True):
            games[i].step(int(m))
    for i, g in enumerate(games):
        assert np.array_equal(boards.planes([i])[0], g.observe()["observation"])
        assert bool(boards.over[i]) == g.done


def test_unknown_game_names_the_valid_ones():
    assert game_spec("connect_four") is CONNECT_FOUR
    with pytest.raises(ValueError, match="expected one of: tictactoe, connect4"):
        game_spec("chess")


def test_render_shows_pieces_and_columns():
    text = play(ConnectFour(), [0, 1]).render()
    assert text.splitlines()[-1] == "0 1 2 3 4 5 6"
    assert text.splitlines()[-2].startswith("X O .")


@pytest.mark.parametrize("spec", [TICTACTOE, CONNECT_FOUR], ids=lambda s: s.name)
def test_threats_are_the_moves_that_win_at_once_for_either_player(spec):
    rng = np.random.default_rng(3)
    boards = Boards(spec, 300)
    for _ in range(spec.n_cells):  # random games, some finished, many mid-game
        live = np.flatnonzero(~boards.over & (rng.random(boards.n) < 0.8))
        if len(live):
            moves = [rng.choice(np.flatnonzero(m)) for m in boards.legal_mask(live)]
            boards.play(np.array(moves), live)
    mine, theirs = boards.threats()
    for g in range(boards.n):
        for player, threats in ((boards.to_move[g], mine), (1 - boards.to_move[g], theirs)):
            expect = np.zeros(spec.n_actions, bool)
            if not boards.over[g]:
                for move in np.flatnonzero(boards.legal_mask([g])[0]):
                    trial = boards.take([g])
                    trial.to_move[0] = player  # as if `player` were to move
                    trial.play(np.array([move]))
                    expect[move] = trial.winner[0] == player
            assert threats[g].tolist() == expect.tolist(), (g, player)


@pytest.mark.parametrize("spec, count", [(CONNECT_FOUR, 2), (TICTACTOE, 8)], ids=["connect4", "tictactoe"])
def test_symmetries_carry_every_position_and_move_over(spec, count):
    """A game replayed with every move transformed is, ply by ply, the transformed position: the
    observation permuted, the threats permuted with the moves, the same winner."""
    obs_perm, move_perm = spec.symmetries()
    assert len(obs_perm) == len(move_perm) == count
    assert len({tuple(p) for p in obs_perm}) == count  # distinct, the identity first
    assert obs_perm[0].tolist() == list(range(obs_perm.shape[1]))
    rng = np.random.default_rng(5)
    for obs_k, move_k in zip(obs_perm, move_perm, strict=True):
        inverse = np.argsort(move_k)
        original, moved = Boards(spec, 40), Boards(spec, 40)
        while not original.over.all():
            live = np.flatnonzero(~original.over)
            moves = np.array([rng.choice(np.flatnonzero(m)) for m in original.legal_mask(live)])
            original.play(moves, live)
            moved.play(inverse[moves], live)
            assert np.array_equal(moved.flat_obs(), original.flat_obs()[:, obs_k])
            for got, want in zip(moved.threats(), original.threats(), strict=True):
                assert np.array_equal(got, want[:, move_k])
        assert np.array_equal(moved.winner, original.winner)

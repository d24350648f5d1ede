"""The game interface for search and self-play on games given as one-game states: a hand-made
game, OpenSpiel's games (against the built-in rules where they are the same game), the search on
them, the MCTS and perfect opponents, and the self-play env."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from rlstack.config import load_config
from rlstack.envs.games import CONNECT_FOUR, TICTACTOE, IllegalMoveError, game_spec
from rlstack.envs.minimax import Minimax
from rlstack.envs.players import RandomPlayer, make_player
from rlstack.envs.selfplay import SelfPlayVectorEnv
from rlstack.envs.state_games import (
    GameError,
    MCTSPlayer,
    OnBuiltinBoards,
    PerfectPlayer,
    StateGame,
)
from rlstack.search import SearchSettings, search
from rlstack.selfplay_eval import play_match, reference_opponent


class TakeAway:
    """A pile of stones; a move takes 1 or 2 (moves 0 and 1); who takes the last stone wins. The
    observation is the pile's size, one-hot."""

    def __init__(self, pile: int = 5, player: int = 0):
        self.pile, self.player = pile, player

    def current_player(self) -> int:
        return -4 if self.is_terminal() else self.player

    def legal_actions(self) -> list[int]:
        return [a for a in (0, 1) if a + 1 <= self.pile]

    def apply_action(self, action: int) -> None:
        self.pile -= action + 1
        self.player = 1 - self.player

    def is_terminal(self) -> bool:
        return self.pile == 0

    def returns(self) -> list[float]:
        if not self.is_terminal():
            return [0.0, 0.0]
        winner = 1 - self.player  # the player who took the last stone
        return [1.0 if winner == 0 else -1.0, 1.0 if winner == 1 else -1.0]

    def clone(self) -> TakeAway:
        return TakeAway(self.pile, self.player)

    def observation_tensor(self, player: int) -> list[float]:
        return [float(i == self.pile) for i in range(6)]


class TwiceInARow(TakeAway):
    """Breaks the interface: player 0 moves twice at the start."""

    def apply_action(self, action: int) -> None:
        self.pile -= action + 1
        self.player = 0 if self.pile == 4 else 1 - self.player

    def clone(self) -> TwiceInARow:
        return TwiceInARow(self.pile, self.player)


def take_away() -> StateGame:
    return StateGame("takeaway", TakeAway, 2, (6,))


def uniform(n: int):
    def evaluate(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        legal = obs[:, -n:] > 0.5
        return legal / np.maximum(legal.sum(1, keepdims=True), 1), np.zeros(len(obs))
    return evaluate


def test_a_hand_made_game_plays_by_its_rules_and_the_search_finds_its_winning_move():
    game = take_away()
    assert game_spec(game) is game and game_spec(f"{__name__}:take_away") == game
    p = game.positions(3)
    assert p.flat_obs().shape == (3, 6 + 2) and p.legal_mask().all()
    p.play([1, 0, 1])  # piles 3, 4, 3; player 1 to move
    assert p.to_move.tolist() == [1, 1, 1] and p.n_moves.tolist() == [1, 1, 1]
    copy = p.take([1, 1])
    copy.play([1, 0])  # the copies go on, the original does not
    assert p.states[1].pile == 4 and [s.pile for s in copy.states] == [2, 3]
    p.play([1, 1, 1], [0, 1, 2])  # piles 1, 2, 1
    p.play([0, 1, 0])  # every pile empty: player 0 took the last stones
    assert p.over.all() and p.winner.tolist() == [0, 0, 0]
    assert p.result_for(0).tolist() == [1, 1, 1] and p.result_for(1).tolist() == [-1, -1, -1]
    assert not p.legal_mask().any()
    with pytest.raises(IllegalMoveError, match="game is over"):
        p.play([0], [0])
    fresh = game.positions(1)
    fresh.play([1])
    fresh.play([1])  # pile 1: taking 2 is not legal
    with pytest.raises(IllegalMoveError, match=r"illegal move 1; legal moves: \[0\]"):
        fresh.play([1])
    # From 5 stones, taking 2 leaves the opponent a lost pile of 3: the search finds it with no prior.
    result = search(game.positions(2), uniform(2), SearchSettings(simulations=200))
    assert (result.visits.argmax(1) == 1).all() and (result.value > 0.5).all()


def test_a_game_whose_players_do_not_alternate_is_refused_when_it_happens():
    game = StateGame("twice", TwiceInARow, 2, (6,))
    p = game.positions(1)
    with pytest.raises(GameError, match="player 0 moved .* player 0 is to move.*alternate"):
        p.play([0])


@pytest.mark.parametrize("name", ["kuhn_poker", "matrix_rps", "pig"])
def test_openspiel_games_search_cannot_play_are_refused_naming_why(name):
    with pytest.raises(GameError, match=f"openspiel:{name} has .*(hidden information|simultaneous|chance)"):
        game_spec(f"openspiel:{name}")
    with pytest.raises(GameError, match="no_such_game"):
        game_spec("openspiel:no_such_game")


@pytest.mark.parametrize("name, builtin", [("openspiel:tic_tac_toe", TICTACTOE), ("openspiel:connect_four", CONNECT_FOUR),
                                           ("pettingzoo:classic.tictactoe_v3", TICTACTOE),
                                           ("pettingzoo:classic.connect_four_v3", CONNECT_FOUR)])
def test_openspiel_and_pettingzoo_rules_match_the_builtin_games_over_random_games(name, builtin):
    """The same moves in OpenSpiel's (PettingZoo's) game and the built-in one: the same legal
    moves, finished games, winners and results at every ply, and copies that go on by themselves
    (a PettingZoo env is copied attribute by attribute: pickling it would rebuild a fresh game)."""
    game = game_spec(name)
    n = 200 if name.startswith("openspiel") else 40
    assert game.n_actions == builtin.n_actions
    ours, theirs = builtin.positions(n), game.positions(n)
    rng = np.random.default_rng(0)
    while not ours.over.all():
        assert np.array_equal(ours.legal_mask(), theirs.legal_mask())
        idx = np.flatnonzero(~ours.over)
        mask = ours.legal_mask(idx)
        moves = np.where(mask, rng.random(mask.shape), -1.0).argmax(1)
        ours.play(moves, idx)
        theirs.play(moves, idx)
        for key in ("over", "winner", "to_move", "n_moves"):
            assert np.array_equal(getattr(ours, key), getattr(theirs, key)), key
        assert np.array_equal(ours.result_for(0), theirs.result_for(0))
        if name.startswith("pettingzoo"):  # PettingZoo's observation is the built-in games' own
            assert np.array_equal(ours.flat_obs(), theirs.flat_obs())
        if ours.n_moves.max() == 3:  # copies mid-game go on from where they were
            copy = theirs.take(np.arange(3))
            assert np.array_equal(copy.flat_obs(), theirs.flat_obs(np.arange(3)))  # not a fresh game
            live = np.flatnonzero(~copy.over)
            copy.play(copy.legal_mask(live).argmax(1), live)
            assert np.array_equal(copy.n_moves[live], theirs.n_moves[live] + 1)
    assert {0, 1} <= set(ours.winner.tolist())
    if name.startswith("openspiel"):
        restored = pickle.loads(pickle.dumps(theirs.take(np.arange(5))))  # how a checkpoint holds games
        assert np.array_equal(restored.flat_obs(), theirs.flat_obs(np.arange(5)))


def test_openspiel_observations_are_the_movers_tensor_in_pettingzoo_layout_then_the_mask():
    game = game_spec("openspiel:othello")
    assert game.obs_shape == (8, 8, 3) and game.flat_space().shape == (8 * 8 * 3 + 65,)
    p = game.positions(1)
    p.play([19])  # black plays d3; white to move
    state = p.states[0]
    obs = p.flat_obs()[0]
    tensor = np.asarray(state.observation_tensor(1), np.float32).reshape(3, 8, 8)
    assert np.array_equal(obs[:192].reshape(8, 8, 3), tensor.transpose(1, 2, 0))
    mask = np.zeros(65, np.float32)
    mask[state.legal_actions()] = 1
    assert np.array_equal(obs[192:], mask)
    assert np.array_equal(p.flat_obs(player=[0])[0, :192].reshape(8, 8, 3),
                          np.asarray(state.observation_tensor(0), np.float32).reshape(3, 8, 8).transpose(1, 2, 0))


def test_search_on_an_openspiel_game_backs_up_exact_results():
    """Connect Four through OpenSpiel, X to move with three in a row open: with no prior and no
    value the search still finds the win from the finished games it reaches."""
    game = game_spec("openspiel:connect_four")
    p = game.positions(1)
    p.play([0])
    p.play([6])
    p.play([1])
    p.play([6])
    p.play([2])
    p.play([5])  # X has columns 0-2 on the bottom row: column 3 wins
    result = search(p, uniform(7), SearchSettings(simulations=100))
    assert result.visits[0].argmax() == 3 and result.value[0] > 0.5


def test_mcts_and_perfect_players_on_tic_tac_toe():
    game = game_spec("openspiel:tic_tac_toe")
    rng = np.random.default_rng(1)
    perfect = PerfectPlayer(game, seed=0)
    assert perfect.value(game.initial) == 0.0  # tic-tac-toe is a draw
    result = play_match(game, perfect, RandomPlayer(game), 50, rng)
    assert result.losses == 0 and result.wins > 30
    assert play_match(game, perfect, PerfectPlayer(game, seed=1), 20, rng).draws == 20
    mcts = MCTSPlayer(game, 100, seed=0)
    assert mcts.name == "mcts100"
    assert play_match(game, mcts, RandomPlayer(game), 20, rng).losses <= 2
    with pytest.raises(GameError, match="OpenSpiel's games only"):
        MCTSPlayer(take_away(), 10)


def test_the_selfplay_env_plays_an_openspiel_game_against_an_opponent():
    envs = SelfPlayVectorEnv(8, game="openspiel:othello")
    obs, info = envs.reset(seed=0)
    assert obs.shape == (8, 257)
    rng = np.random.default_rng(0)
    finished = 0
    for _ in range(80):
        mask = obs[:, -65:] > 0.5
        assert mask.any(1).all()  # the learner is to move in every game
        obs, reward, done, _, info = envs.step(np.where(mask, rng.random(mask.shape), -1.0).argmax(1))
        assert set(np.unique(reward[done])) <= {-1.0, 0.0, 1.0} and not reward[~done].any()
        finished += done.sum()
    assert finished >= 8
    with pytest.raises(ValueError, match="minimax plays the built-in"):
        SelfPlayVectorEnv(2, game="openspiel:othello", opponent="minimax:2")


def test_players_by_name_on_openspiel_games():
    """`make_player` builds every opponent by name on the games it plays, and names the games it
    does not: minimax on OpenSpiel's Connect Four plays the built-in minimax's moves."""
    tictactoe, connect_four, othello = (game_spec(f"openspiel:{name}")
                                        for name in ("tic_tac_toe", "connect_four", "othello"))
    assert isinstance(make_player(tictactoe, "perfect", seed=0), PerfectPlayer)
    mcts = make_player(othello, "mcts:50", seed=0)
    assert isinstance(mcts, MCTSPlayer) and mcts.name == "mcts50"
    assert make_player(othello, "mcts").name == "mcts100"
    minimax = make_player(connect_four, "minimax:3", seed=0)
    assert isinstance(minimax, OnBuiltinBoards) and minimax.name == Minimax(CONNECT_FOUR, 3).name
    rng = np.random.default_rng(5)
    ours, builtin = connect_four.positions(16), CONNECT_FOUR.positions(16)
    for _ in range(12):  # random openings of different lengths, then each minimax's move on them
        live = np.flatnonzero(~ours.over & (rng.random(16) < 0.75))
        moves = np.where(ours.legal_mask(live), rng.random((len(live), 7)), -1.0).argmax(1)
        ours.play(moves, live)
        builtin.play(moves, live)
    live = np.flatnonzero(~ours.over)
    same = Minimax(CONNECT_FOUR, 3, seed=0).act(builtin.take(live).flat_obs(), np.random.default_rng(1))
    assert np.array_equal(minimax.act_positions(ours.take(live), np.random.default_rng(1)), same)  # ties: same draws
    reference = reference_opponent(connect_four, load_config("alphazero_openspiel_connect4"))
    assert isinstance(reference, OnBuiltinBoards) and reference.player.depth == 4  # selfplay.reference: auto
    with pytest.raises(ValueError, match="minimax plays the built-in"):
        make_player(othello, "minimax:2")
    with pytest.raises(ValueError, match="OpenSpiel's games"):
        make_player(CONNECT_FOUR, "mcts:10")
    with pytest.raises(ValueError, match="expected mcts:N"):
        make_player(othello, "mcts:many")


@pytest.mark.parametrize("name, count, plies", [("tic_tac_toe", 8, 6), ("connect_four", 2, 6), ("othello", 8, 6),
                                                ("hex(board_size=5)", 2, 14)])
def test_openspiel_board_symmetries_map_positions_to_positions(name, count, plies):
    """A symmetry of the board applied to a game's moves gives the position its observation
    permutation gives (over every symmetry that keeps the opening position; Hex's half turn after
    enough moves that groups touch its edges)."""
    game = game_spec(f"openspiel:{name}")
    obs_perm, move_perm = game.symmetries()
    assert len(obs_perm) == count and np.array_equal(obs_perm[0], np.arange(obs_perm.shape[1]))
    rng = np.random.default_rng(3)
    original = game.positions(20)
    history = []
    for _ in range(plies):
        live = np.flatnonzero(~original.over)
        mask = original.legal_mask(live)
        moves = np.full(original.n, -1)
        moves[live] = np.where(mask, rng.random(mask.shape), -1.0).argmax(1)
        original.play(moves[live], live)
        history.append(moves)
    opening = game.positions(1).flat_obs()[0]
    kept = [k for k in range(count) if np.array_equal(opening[obs_perm[k]], opening)]
    assert len(kept) >= 2
    for k in kept:
        inverse = np.argsort(move_perm[k])  # original move -> its image
        image = game.positions(20)
        for moves in history:
            live = np.flatnonzero(moves >= 0)
            image.play(inverse[moves[live]], live)
        assert np.array_equal(image.flat_obs(), original.flat_obs()[:, obs_perm[k]]), k
    assert game_spec("openspiel:breakthrough(rows=6,columns=6)").symmetries() is None

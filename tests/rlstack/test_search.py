"""Tree search batched over games: wins and blocks in one, proper targets, the graph's priors, whole games."""

from __future__ import annotations

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from rlstack.acting import load_policy
from rlstack.artifact import export_policy
from rlstack.envs.games import CONNECT_FOUR, TICTACTOE, Boards
from rlstack.network import NetSpec, Network
from rlstack.search import (
    SearchSettings,
    SelfPlayGames,
    choose,
    outcome_targets,
    policy_value,
    search,
)


def uniform(spec):
    """A hand-built evaluator: uniform prior over the legal moves, value 0 everywhere."""
    def evaluate(obs):
        legal = obs[:, -spec.n_actions:] > 0.5
        return legal / legal.sum(1, keepdims=True), np.zeros(len(obs))
    return evaluate


def positions(spec, games):
    boards = Boards(spec, len(games))
    for i, moves in enumerate(games):
        for move in moves:
            boards.play(np.array([move]), [i])
    return boards


@pytest.mark.parametrize("simulations", [8, 16])
def test_search_takes_a_win_in_one_and_blocks_a_loss_in_one(simulations):
    rng = np.random.default_rng(0)
    # Tic-tac-toe: X (0, 1) wins at 2 rather than blocking O's 3-4-5; O must block X's 0-1-2;
    # X (4, 8) must block O's 0-1-2 at 1.
    ttt = positions(TICTACTOE, [[0, 3, 1, 4], [0, 4, 1], [4, 0, 8, 2]])
    result = search(ttt, uniform(TICTACTOE), SearchSettings(simulations=simulations))
    assert choose(result, rng).tolist() == [2, 2, 1]
    # Connect Four: three in the bottom row (columns 1-3), both ends win; a vertical three in
    # column 6 must be blocked.
    c4 = positions(CONNECT_FOUR, [[1, 1, 2, 2, 3, 3], [6, 0, 6, 1, 6]])
    result = search(c4, uniform(CONNECT_FOUR), SearchSettings(simulations=simulations))
    moves = choose(result, rng)
    assert moves[0] in (0, 4) and moves[1] == 6
    assert result.value[0] > 0.5  # the winner to move knows it


@pytest.mark.parametrize("simulations", [8, 16])
def test_search_makes_a_double_threat_and_values_facing_one_as_lost(simulations):
    rng = np.random.default_rng(0)
    # Connect Four, X to move with two in the bottom row (columns 2-3, O above them): column 1 or
    # 4 makes three with both ends open, two winning moves that O cannot both block.
    c4 = positions(CONNECT_FOUR, [[2, 2, 3, 3]])
    result = search(c4, uniform(CONNECT_FOUR), SearchSettings(simulations=simulations))
    assert choose(result, rng)[0] in (1, 4)
    assert result.value[0] > 0.5
    # O to move facing that double threat (no win of its own): lost, whatever it plays.
    facing = positions(CONNECT_FOUR, [[2, 2, 3, 3, 4]])
    mine, theirs = facing.threats()
    assert theirs[0].nonzero()[0].tolist() == [1, 5] and not mine[0].any()
    result = search(facing, uniform(CONNECT_FOUR), SearchSettings(simulations=simulations))
    assert result.value[0] < -0.5


def random_positions(spec, n, rng):
    boards = Boards(spec, n)
    for i in range(n):
        for _ in range(rng.integers(0, spec.n_cells - 1)):
            legal = np.flatnonzero(boards.legal_mask([i])[0])
            trial = boards.take([i])
            move = rng.choice(legal)
            trial.play(np.array([move]))
            if trial.over[0]:
                break
            boards.play(np.array([move]), [i])
    return boards


@pytest.mark.parametrize("spec", [TICTACTOE, CONNECT_FOUR], ids=lambda s: s.name)
@pytest.mark.parametrize("noise", [0.0, 0.25])
def test_search_targets_are_distributions_over_the_legal_moves(spec, noise):
    rng = np.random.default_rng(1)
    boards = random_positions(spec, 40, rng)
    settings = SearchSettings(simulations=24, dirichlet_fraction=noise)
    result = search(boards, uniform(spec), settings, rng)
    legal = boards.legal_mask()
    assert result.policy.dtype == np.float32 and result.policy.shape == (40, spec.n_actions)
    assert np.all(result.policy >= 0) and np.allclose(result.policy.sum(1), 1.0, atol=1e-6)
    assert np.all(result.policy[~legal] == 0)
    assert np.all(result.visits.sum(1) == settings.simulations)
    assert result.calls <= settings.simulations + 1
    with pytest.raises(ValueError, match="finished game"):
        done = positions(TICTACTOE, [[0, 3, 1, 4, 2]])
        search(done, uniform(TICTACTOE), settings)


def test_priors_and_values_come_from_the_exported_graph_in_one_call(tmp_path):
    ms.set_seed(3)
    space, actions = TICTACTOE.flat_space(), gym.spaces.Discrete(9)
    net = Network(space, actions, NetSpec(hidden=(32, 32)))
    bias = np.linspace(-2, 2, 9).astype(np.float32)
    net.pi[-1].bias.set_data(Tensor(bias))  # priors far from uniform
    export_policy(net, tmp_path / "policy", algorithm="alphazero", obs_space=space, action_space=actions,
                  device="cpu", fusion=False, config_hash="t", extra={"env_id": "rlstack/TicTacToe-v0"})
    acting = load_policy(tmp_path)
    boards = random_positions(TICTACTOE, 20, np.random.default_rng(2))
    obs = boards.flat_obs()
    calls = []
    run, priors = acting.run, acting.priors
    acting.run = lambda *a, **k: calls.append("run") or run(*a, **k)
    acting.priors = lambda *a, **k: calls.append("priors") or priors(*a, **k)
    prior, value = policy_value(acting, obs)
    assert calls == ["priors"]  # the priors entry point (tests/rlstack/test_priors.py)
    legal = boards.legal_mask()
    # The live network's masked softmax and value head on the same positions.
    logp_all = np.stack([net.evaluate(Tensor(obs), Tensor(np.full(20, a, np.int32)))[0].asnumpy() for a in range(9)], 1)
    expected = np.where(legal, np.exp(logp_all), 0.0)
    np.testing.assert_allclose(prior, expected / expected.sum(1, keepdims=True), atol=1e-5)
    assert np.all(prior[~legal] == 0) and np.allclose(prior.sum(1), 1.0)
    np.testing.assert_allclose(value, net.evaluate(Tensor(obs), Tensor(np.zeros(20, np.int32)))[2].asnumpy(), atol=1e-5)


def test_outcome_targets_alternate_back_from_each_games_end():
    # Game 1: 5 moves, the 5th wins (first player won); game 2: 4 moves, drawn (no reward).
    reward = np.array([0, 0, 0, 0, 1, 0, 0, 0, 0], np.float32)
    terminated = np.array([0, 0, 0, 0, 1, 0, 0, 0, 1], bool)
    assert outcome_targets(reward, terminated).tolist() == [1, -1, 1, -1, 1, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="whole games"):
        outcome_targets(reward[:3], terminated[:3])


def test_self_play_returns_whole_games_with_consistent_outcomes():
    rng = np.random.default_rng(4)
    games = SelfPlayGames(TICTACTOE, uniform(TICTACTOE), SearchSettings(simulations=8, dirichlet_fraction=0.25),
                          games=16, temperature_moves=9, rng=rng)
    record = games.play(20)
    assert len(record.lengths) >= 20 and record.terminated.sum() == len(record.lengths)
    assert record.lengths.sum() == len(record.action) and record.terminated[-1]
    # Replaying each game's moves reproduces its observations and its result.
    start = 0
    z = outcome_targets(record.reward, record.terminated)
    for length, first in zip(record.lengths, record.first_player_results, strict=True):
        board = Boards(TICTACTOE, 1)
        for t in range(start, start + length):
            np.testing.assert_array_equal(board.flat_obs()[0], record.obs[t])
            assert record.policy[t, record.action[t]] > 0
            board.play(np.array([record.action[t]]))
        assert board.over[0] and float(board.result_for(0)[0]) == first
        assert z[start] == first  # the first mover's target is the game's result for them
        start += length
    assert games.calls > 0

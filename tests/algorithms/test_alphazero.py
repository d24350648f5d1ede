"""AlphaZero: its settings checked, and tic-tac-toe learnt to perfect play from a fixed seed."""

from __future__ import annotations

import numpy as np
import pytest

from rlstack.acting import load_policy
from rlstack.bench.seeds import LEARNING_RUNS
from rlstack.config import ConfigError, load_config
from rlstack.envs.games import TICTACTOE
from rlstack.envs.minimax import perfect_player
from rlstack.envs.players import PolicyPlayer, RandomPlayer
from rlstack.search import SearchPlayer
from rlstack.selfplay_eval import play_match


@pytest.mark.parametrize("override, words", [
    (["actors=1"], "actors: 0"),
    (["env.id=CartPole-v1"], "rlstack/TicTacToe-v0"),
    (["train.batch_size=512", "train.replay_positions=256"], "replay_positions"),
    (["train.simulations=0"], "train.simulations"),
    (["train.dirichlet_fraction=2"], "dirichlet_fraction"),
    (["selfplay.eval_search=-1"], None),
])
def test_alphazero_settings_are_checked(override, words, tmp_path):
    if words is None:  # checked when the evaluation hook is built, before training
        from rlstack.trainer import Trainer

        with pytest.raises(ConfigError, match="selfplay.eval_search"):
            Trainer(load_config("alphazero_tictactoe", override), tmp_path / "run").train()
        return
    with pytest.raises(ConfigError, match=words):
        load_config("alphazero_tictactoe", override)


def test_replay_samples_each_position_in_one_of_the_boards_symmetries():
    """Augmented samples are the stored rows with obs and policy target permuted together by one
    symmetry of the board, the outcome kept; every symmetry turns up."""
    from rlstack.algorithms.alphazero import PositionReplay
    from rlstack.envs.games import CONNECT_FOUR

    obs_perm, move_perm = CONNECT_FOUR.symmetries()
    d, n = obs_perm.shape[1], move_perm.shape[1]
    rng = np.random.default_rng(0)
    rows = rng.random((50, d + n + 1)).astype(np.float32)  # distinct values: a permutation is visible
    replay = PositionReplay(50, d + n + 1, CONNECT_FOUR.symmetries())
    replay.add(rows)
    seen = set()
    for row in replay.sample(400, rng):
        source = rows[np.flatnonzero(np.isin(rows[:, -1], row[-1]))[0]]
        k = [i for i in range(len(obs_perm))
             if np.array_equal(row[:d], source[:d][obs_perm[i]]) and np.array_equal(row[d:d + n], source[d:d + n][move_perm[i]])]
        assert len(k) == 1, "a sampled row is not one symmetry of a stored row"
        seen.add(k[0])
    assert seen == {0, 1}
    plain = PositionReplay(50, d + n + 1)
    plain.add(rows)
    assert all(any(np.array_equal(row, r) for r in rows) for row in plain.sample(50, rng))


# ----- learning -----------------------------------------------------------------------------------
# configs/alphazero_tictactoe.yaml at half its budget (20k positions, ~2,500 self-play games of 32
# simulations per move); seeds 0-4 pass there (docs/PERFORMANCE.md#learning-tests-budgets).
# `python -m rlstack.bench seeds --runs alphazero_tictactoe` trains it from other seeds.

@pytest.mark.learning
@pytest.mark.timeout(900)
def test_alphazero_tictactoe_never_loses_to_perfect_play_with_or_without_search(tmp_path):
    run = LEARNING_RUNS["alphazero_tictactoe"]
    summary = run.train(0, tmp_path / "run")
    assert summary["total_steps"] >= 20_000 and summary["updates"] >= 30
    # The final evaluation played every line of perfect play with the searching agent too.
    search = summary["selfplay/search"]
    assert search["simulations"] == 32 and search["vs_every_perfect_line"]["losses"] == 0
    acting = load_policy(tmp_path / "run")  # the exported graph
    rng = np.random.default_rng(7)
    searching = SearchPlayer(acting, TICTACTOE, 32)
    for agent in (PolicyPlayer(acting, sample=False), searching):
        # 100 games, seats alternating, the perfect player choosing among its optimal moves.
        result = play_match(TICTACTOE, agent, perfect_player(TICTACTOE, seed=123), 100, rng)
        assert result.games == 100 and result.losses == 0, f"{agent.name} lost to perfect play: {result}"
    # The random player reaches positions self-play rarely visits (the policy alone lost 2 of 100
    # in one measurement); the search covers them.
    result = play_match(TICTACTOE, searching, RandomPlayer(TICTACTOE), 100, rng)
    assert result.losses == 0, f"{searching.name} lost to the random player: {result}"


# The same run through OpenSpiel's tic_tac_toe (`env.id: rlstack/Game-v0`, `env.kwargs.game:
# openspiel:tic_tac_toe`): the generic game path, without the search's win-in-one shortcut,
# evaluated against the solved game (`selfplay.reference: perfect`); `python -m rlstack.bench seeds
# --runs alphazero_openspiel_tictactoe` trains it from other seeds (docs/PERFORMANCE.md#your-own-game).

@pytest.mark.learning
@pytest.mark.timeout(900)
def test_alphazero_on_openspiel_tictactoe_never_loses_to_perfect_play(tmp_path):
    from rlstack.bench.seeds import tictactoe_match

    run = LEARNING_RUNS["alphazero_openspiel_tictactoe"]
    summary = run.train(0, tmp_path / "run")
    assert summary["total_steps"] >= 40_000
    # The evaluation played the solved game with the searching agent too.
    assert summary["selfplay/search"]["simulations"] == 32 and "vs_perfect" in summary["selfplay/search"]
    for search in (0, 32):  # the policy's own moves, and the agent searching on its graph
        perfect = tictactoe_match(tmp_path / "run", "perfect", game=run.game, search=search)
        assert perfect.games == 100 and perfect.losses == 0, f"search {search}: lost to perfect play: {perfect}"
        random = tictactoe_match(tmp_path / "run", "random", game=run.game, search=search)
        assert random.losses == 0, f"search {search}: lost to the random player: {random}"

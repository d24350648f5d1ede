"""The PettingZoo AEC adapter: PettingZoo's own API test, perspective, rewards and illegal moves."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test import api_test

from rlstack.envs.games import IllegalMoveError
from rlstack.envs.pettingzoo_env import aec_env


@pytest.mark.parametrize("game", ["connect4", "tictactoe"])
def test_passes_pettingzoo_api_test(game):
    api_test(aec_env(game), num_cycles=300)


def test_connect4_vertical_win_rewards_and_terminates_both_players():
    env = aec_env("connect4")
    env.reset(seed=0)
    for move in [3, 0, 3, 0, 3, 0, 3]:  # player_0 stacks column 3
        env.step(move)
    assert env.terminations == {"player_0": True, "player_1": True}
    assert env.rewards == {"player_0": 1.0, "player_1": -1.0}
    # player_1 is to move and sees its loss; then player_0 collects its win.
    obs, reward, terminated, truncated, _ = env.last()
    assert env.agent_selection == "player_1" and reward == -1.0 and terminated and not truncated
    assert not obs["action_mask"].any()
    env.step(None)
    obs, reward, terminated, _, _ = env.last()
    assert env.agent_selection == "player_0" and reward == 1.0 and terminated
    env.step(None)
    assert env.agents == []


def test_observation_is_from_each_agents_own_perspective():
    env = aec_env("connect4")
    env.reset()
    env.step(2)  # player_0 drops in column 2: bottom row (5)
    mover = env.observe("player_1")
    other = env.observe("player_0")
    assert mover["observation"][5, 2].tolist() == [0, 1]  # player_1 sees the opponent's piece
    assert other["observation"][5, 2].tolist() == [1, 0]
    assert mover["action_mask"].tolist() == [1] * 7
    assert other["action_mask"].tolist() == [0] * 7  # not player_0's turn
    assert mover["observation"].dtype == np.int8 and mover["observation"].shape == (6, 7, 2)


def test_full_board_draw_gives_zero_rewards():
    env = aec_env("tictactoe")
    env.reset()
    for move in [0, 1, 2, 4, 3, 5, 7, 6, 8]:  # X 0 2 3 7 8, O 1 4 5 6: no three in a row
        assert not any(env.terminations.values())
        env.step(move)
    assert all(env.terminations.values())
    assert env.rewards == {"player_0": 0.0, "player_1": 0.0}


def test_illegal_move_is_refused_and_nothing_is_played():
    env = aec_env("tictactoe", render_mode="ansi")
    env.reset()
    env.step(4)
    before = env.render()
    with pytest.raises(IllegalMoveError, match="occupied"):
        env.step(4)
    assert env.render() == before
    assert env.agent_selection == "player_1"
    env.step(0)  # the game goes on
    assert env.agent_selection == "player_0"

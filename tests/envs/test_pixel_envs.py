"""MinAtar and Atari ids by name: MinAtar's bool planes as they are; Atari with the standard
preprocessing (84x84 grayscale uint8, 4 frames stacked, FIRE at reset and after a lost life), a
lost life ending the episode and rewards clipped to their sign in training only."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlstack.envs import EnvError, make_env, make_vector_env

BREAKOUT = "BreakoutNoFrameskip-v4"  # RL Baselines3 Zoo's id


def test_minatar_ids_work_by_name_in_a_vector_env():
    envs = make_vector_env("MinAtar/Breakout-v1", 2)
    obs, _ = envs.reset(seed=0)
    assert envs.single_observation_space == gym.spaces.Box(0, 1, (10, 10, 4), bool)
    assert obs.shape == (2, 10, 10, 4) and obs.dtype == bool
    envs.close()
    with pytest.raises(EnvError, match="MinAtar/Breakout-v1"):  # a close match is offered
        make_env("MinAtar/Breakout-v9")


def _play_until_a_life_is_lost(env: gym.Env, rng: np.random.Generator) -> tuple[bool, list[float], int]:
    """Random play until the ALE reports a lost life: (terminated then, the rewards, lives left)."""
    env.reset(seed=0)
    ale = env.unwrapped.ale
    start, rewards = ale.lives(), []
    while True:
        _, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        rewards.append(float(reward))
        if ale.lives() < start or terminated or truncated:
            return terminated, rewards, ale.lives()


@pytest.mark.parametrize("env_id", [BREAKOUT, "ALE/Breakout-v5"])
def test_atari_frames_are_stacked_84x84_uint8_and_training_differs_from_evaluation(env_id):
    train, evaluate = make_env(env_id), make_env(env_id, training=False)
    for env in (train, evaluate):
        assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    # training: a lost life ends the episode and rewards are their sign; evaluation plays on
    terminated, rewards, lives = _play_until_a_life_is_lost(train, np.random.default_rng(1))
    assert terminated and lives == 4 and set(rewards) <= {0.0, 1.0}
    terminated, _, lives = _play_until_a_life_is_lost(evaluate, np.random.default_rng(1))
    assert not terminated and lives == 4
    # after the lost life the ball is in play again (FIRE pressed): the frames move under NOOPs
    before = evaluate.step(0)[0]
    after = evaluate.step(0)[0]
    assert not np.array_equal(before[-1], after[-1])
    train.close()
    evaluate.close()

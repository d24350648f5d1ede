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


def test_atari_training_reset_after_a_lost_life_continues_the_game_and_games_are_reported_whole():
    """As Stable-Baselines3's `EpisodicLifeEnv`: the episode that a lost life ends is followed by
    the same game's next life (gymnasium's `terminal_on_life_loss` would reset the whole game), and
    each whole game's unclipped score reaches `info` when the game is over."""
    from rlstack.envs.make import finished_games

    env = make_env(BREAKOUT)
    rng = np.random.default_rng(1)
    terminated, _, lives = _play_until_a_life_is_lost(env, rng)
    assert terminated and lives == 4
    env.reset()
    assert env.unwrapped.ale.lives() == 4  # the game went on
    env.close()

    envs = make_vector_env(BREAKOUT, 2)
    envs.reset(seed=0)
    episodes, games = 0, []
    while len(games) < 4:
        _, reward, terminated, truncated, info = envs.step(rng.integers(0, 4, 2))
        episodes += int((terminated | truncated).sum())
        games += finished_games(info)
        assert set(reward) <= {0.0, 1.0}
    envs.close()
    assert episodes >= 5 * len(games)  # five lives, five training episodes, a game
    assert any(score > 1 for score, _ in games)  # whole games' scores, not one life's


def test_the_collector_logs_whole_atari_games():
    """Training episodes of Atari end at lost lives with clipped rewards; the returns the
    collector reports (the training curve) are whole games' unclipped scores."""
    from rlstack.collector import Collector, allocate, trajectory_specs

    envs = make_vector_env(BREAKOUT, 2)

    class Uniform:
        updates = 0

        def random_actions(self, n, rng):
            return rng.integers(0, 4, n)

        def to_env(self, action):
            return action

        def episodes_ended(self, done):
            pass

    collector = Collector(envs, Uniform(), seed=0, off_policy=True)
    assert collector.game_episodes
    specs = trajectory_specs(600, 2, (4, 84, 84), (), "int64", off_policy=True, obs_dtype="uint8")
    returns, lengths, _, _ = collector.collect(allocate(specs), lambda t: True)
    envs.close()
    assert returns and len(returns) == len(lengths)
    assert all(length > 100 for length in lengths)  # five lives of random play, not one

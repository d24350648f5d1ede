"""Saving and restoring environments mid-episode (`rlstack.envs.state`): MuJoCo envs give back their
simulation state and RNG, bitwise; envs that would unpickle freshly built are refused, not
silently reset."""

import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from rlstack.envs import make_vector_env
from rlstack.envs import state as env_state


def _steps(envs, actions) -> list[np.ndarray]:
    out = []
    for action in actions:
        obs, reward, terminated, truncated, _ = envs.step(action)
        out += [obs, reward, terminated, truncated]
    return out


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5"])
def test_a_mujoco_env_restored_into_a_new_one_goes_on_bitwise(env_id):
    envs = make_vector_env(env_id, 2)
    envs.reset(seed=1)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (400, 2, envs.single_action_space.shape[0])).astype(np.float32)
    _steps(envs, actions[:150])
    blob = env_state.capture(envs)
    expected = _steps(envs, actions[150:])
    again = make_vector_env(env_id, 2)
    again.reset(seed=99)
    env_state.restore(again, blob)
    got = _steps(again, actions[150:])
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    if env_id == "Hopper-v5":  # episodes ended after the restore: their resets drew from the restored RNG
        assert sum(int(np.sum(t)) for t in expected[2::4]) > 0
    # the simulation time went on from the saved one, not from a fresh env's 0
    assert again.envs[0].unwrapped.data.time == envs.envs[0].unwrapped.data.time > 0


def test_an_env_that_pickles_as_its_constructor_arguments_is_refused():
    # ALE's env (EzPickle), bare, would pickle without error and unpickle as a new game: `capture`
    # says so instead of resuming it as a reset
    import ale_py

    gym.register_envs(ale_py)
    envs = SyncVectorEnv([lambda: gym.make("ALE/Breakout-v5")])
    envs.reset(seed=0)
    pickle.loads(pickle.dumps(envs.envs[0]))  # what made it silent
    with pytest.raises(env_state.NotSaved, match="AtariEnv pickles as its constructor arguments only"):
        env_state.capture(envs)

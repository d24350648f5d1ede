"""env.vectorization: the native CartPole vector env steps exactly as gym.make("CartPole-v1") copies
in a SyncVectorEnv (SAME_STEP), saves and restores its whole state, and is what training builds
by default."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlstack.config import ConfigError, load_config
from rlstack.envs import EnvError, make_vector_env
from rlstack.envs import state as env_state
from rlstack.envs.make import VECTORIZATIONS
from rlstack.envs.vectorized import SameStepCartPole
from rlstack.trainer import Trainer


def _balance(obs: np.ndarray) -> np.ndarray:
    """A linear controller that keeps the pole up for 500 steps (reaches the time limit)."""
    x, x_dot, theta, theta_dot = obs.T
    return (theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0).astype(np.int64)


def _copy_state(native: SameStepCartPole, sync: SyncVectorEnv, rows: np.ndarray) -> None:
    for i in rows:
        sync.envs[i].unwrapped.state = native.state[:, i].copy()


@pytest.mark.parametrize("kwargs", [{}, {"sutton_barto_reward": True}])
def test_native_cartpole_steps_as_gym_make_copies_in_a_same_step_sync_vector_env(kwargs):
    n = 4  # copies 0, 1 balance until the time limit; copies 2, 3 act at random and fall
    native = make_vector_env("CartPole-v1", n, kwargs=kwargs)
    sync = make_vector_env("CartPole-v1", n, kwargs=kwargs, vectorization="per_env")
    assert isinstance(native, SameStepCartPole) and isinstance(sync, SyncVectorEnv)
    assert native.metadata["autoreset_mode"] == sync.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, _ = native.reset(seed=0)
    sync.reset(seed=0)
    _copy_state(native, sync, np.arange(n))  # equal states: the two draw their resets differently
    rng = np.random.default_rng(1)
    starts, terminated_seen, truncated_at = [obs], 0, []
    length = np.zeros(n, np.int64)
    for _ in range(1100):
        action = np.concatenate([_balance(obs[:2]), rng.integers(0, 2, n - 2)])
        obs, reward, terminated, truncated, info = native.step(action)
        s_obs, s_reward, s_terminated, s_truncated, s_info = sync.step(action)
        length += 1
        done = terminated | truncated
        np.testing.assert_array_equal(terminated, s_terminated)
        np.testing.assert_array_equal(truncated, s_truncated)
        np.testing.assert_array_equal(reward, s_reward)
        assert reward.dtype == s_reward.dtype
        np.testing.assert_array_equal(obs[~done], s_obs[~done])
        assert info.keys() == s_info.keys()  # {} or final_obs, final_info and their masks
        if done.any():
            np.testing.assert_array_equal(info["_final_obs"], s_info["_final_obs"])
            np.testing.assert_array_equal(info["_final_info"], s_info["_final_info"])
            assert info["final_info"] == s_info["final_info"] == {}
            assert info["final_obs"].dtype == object and all(info["final_obs"][~done] == None)  # noqa: E711
            for i in np.flatnonzero(done):
                np.testing.assert_array_equal(info["final_obs"][i], s_info["final_obs"][i])
                assert info["final_obs"][i].dtype == np.float32
            truncated_at += length[truncated].tolist()
            terminated_seen += int(terminated.sum())
            starts.append(obs[done])
            length[done] = 0
            _copy_state(native, sync, np.flatnonzero(done))
    assert truncated_at and set(truncated_at) == {500}
    assert terminated_seen > 20
    starts = np.concatenate(starts)
    assert starts.dtype == np.float32 and np.all(np.abs(starts) <= 0.05)  # the reset distribution's support
    assert starts.std() > 0.02  # and spread over it, not a constant
    if kwargs:
        assert set(np.unique(reward)) <= {-1.0, 0.0}


@pytest.mark.filterwarnings("ignore:.*CartPole-v0 is out of date")
def test_time_limit_follows_the_id_and_the_kwargs():
    for env_id, kwargs, limit in (("CartPole-v0", {}, 200), ("CartPole-v1", {"max_episode_steps": 7}, 7)):
        envs = make_vector_env(env_id, 2, kwargs=kwargs)
        obs, _ = envs.reset(seed=3)
        for t in range(1, limit + 1):
            obs, _, terminated, truncated, _ = envs.step(_balance(obs))
            assert not terminated.any() and truncated.all() == (t == limit)


def _future(envs: gym.vector.VectorEnv, steps: int) -> list[np.ndarray]:
    rng, out = np.random.default_rng(7), []
    for _ in range(steps):
        obs, reward, terminated, truncated, info = envs.step(rng.integers(0, 2, envs.num_envs))
        out += [obs, reward, terminated, truncated, info.get("_final_obs", np.zeros(envs.num_envs, bool))]
    return out


def test_saved_state_gives_the_same_future_in_the_env_and_in_a_new_one():
    envs = make_vector_env("CartPole-v1", 8)
    envs.reset(seed=5)
    _future(envs, 30)
    state, blob = envs.get_state(), env_state.capture(envs)
    expected = _future(envs, 200)  # several episodes end: resets draw from the saved generator
    envs.set_state(state)
    again = make_vector_env("CartPole-v1", 8)
    again.reset(seed=99)
    env_state.restore(again, blob)
    for future in (_future(envs, 200), _future(again, 200)):
        assert len(future) == len(expected)
        for got, want in zip(future, expected, strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_state_saved_from_the_other_vectorization_is_refused_with_a_value_error():
    native, sync = make_vector_env("CartPole-v1", 2), make_vector_env("CartPole-v1", 2, vectorization="per_env")
    native.reset(seed=0)
    sync.reset(seed=0)
    with pytest.raises(ValueError, match="native"):
        env_state.restore(sync, env_state.capture(native))
    with pytest.raises(ValueError, match="SyncVectorEnv"):
        env_state.restore(native, env_state.capture(sync))
    with pytest.raises(ValueError, match="3 envs"):
        native.set_state(make_vector_env("CartPole-v1", 3).get_state())


def test_a_bad_value_names_the_key_and_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["env.vectorization=numpy"])
    assert "'env.vectorization'" in str(err.value) and "auto, native, per_env" in str(err.value)
    for value in VECTORIZATIONS:  # the config's choices and make_vector_env's agree
        assert load_config(None, [f"env.vectorization={value}"]).env.vectorization == value


def test_which_vector_env_each_value_builds():
    assert isinstance(make_vector_env("CartPole-v1", 2, vector="async"), SameStepCartPole)  # auto: native
    # kwargs only gym.make takes: auto falls back to per-env copies, native says which it rejects
    assert isinstance(make_vector_env("CartPole-v1", 2, kwargs={"disable_env_checker": True}), SyncVectorEnv)
    with pytest.raises(EnvError, match="disable_env_checker"):
        make_vector_env("CartPole-v1", 2, kwargs={"disable_env_checker": True}, vectorization="native")
    assert isinstance(make_vector_env("Pendulum-v1", 2), SyncVectorEnv)
    with pytest.raises(EnvError) as err:
        make_vector_env("Pendulum-v1", 2, vectorization="native")
    assert "'env.vectorization'" in str(err.value) and "Pendulum-v1" in str(err.value)
    assert "CartPole-v1" in str(err.value)  # the ids that have one
    with pytest.raises(EnvError, match="'env.vectorization' is 'per_env'"):  # its opponent pool lives there
        make_vector_env("rlstack/TicTacToe-v0", 2, vectorization="per_env")


def test_an_action_outside_the_space_is_refused():
    envs = make_vector_env("CartPole-v1", 2)
    with pytest.raises(gym.error.ResetNeeded):
        envs.step(np.array([0, 1]))
    envs.reset(seed=0)
    for bad in ([0, 2], [-1, 0], [0, 1, 1]):
        with pytest.raises(ValueError, match="actions in"):
            envs.step(np.array(bad))


def test_training_builds_the_native_env_by_default(tmp_path):
    cfg = load_config(None, ["train.total_steps=512", "train.n_epochs=1", "train.progress=off",
                             "env.eval_episodes=2"])
    assert cfg.env.vectorization == "auto"
    trainer = Trainer(cfg, tmp_path / "run")
    assert isinstance(trainer.envs, SameStepCartPole)
    summary = trainer.train()
    assert summary["total_steps"] >= 512 and np.isfinite(summary["eval/mean_return"])


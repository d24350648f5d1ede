"""The replay buffer (ring wraparound, terminated vs truncated, checkpoint file) and what the
trainer's off-policy loop stores in it."""

import gymnasium as gym
import numpy as np
import pytest

from rlstack.config import load_config
from rlstack.envs import make_vector_env
from rlstack.replay import REPLAY_FILE, FrameReplay, ReplayBatch, ReplayBuffer, make_replay
from rlstack.trainer import Trainer


def _step(t: int, n_envs: int = 2):
    """One vector step whose every field encodes (t, env): obs = 10 t + env."""
    obs = (10.0 * t + np.arange(n_envs, dtype=np.float32))[:, None].repeat(3, axis=1)
    action = np.full(n_envs, t, np.int32)
    reward = np.full(n_envs, float(t), np.float32)
    terminated = np.array([t % 3 == 0, False])
    truncated = np.array([False, t % 2 == 1])
    return obs, action, reward, obs + 0.5, terminated, truncated


def test_ring_buffer_wraps_around_and_overwrites_the_oldest():
    replay = ReplayBuffer(5, (3,), (), np.int32)
    for t in range(2):
        replay.add(*_step(t))
    assert (len(replay), replay.pos) == (4, 4)
    replay.add(*_step(2))  # rows 4, 0: the first transition of step 0 is overwritten
    assert (len(replay), replay.pos) == (5, 1)
    np.testing.assert_array_equal(replay.obs[:, 0], [21, 1, 10, 11, 20])
    np.testing.assert_array_equal(replay.action, [2, 0, 1, 1, 2])
    replay.add(*_step(3))  # rows 1, 2
    assert (len(replay), replay.pos) == (5, 3)
    np.testing.assert_array_equal(replay.obs[:, 0], [21, 30, 31, 11, 20])
    np.testing.assert_array_equal(replay.next_obs[:, 0], [21.5, 30.5, 31.5, 11.5, 20.5])
    np.testing.assert_array_equal(replay.reward, [2, 3, 3, 1, 2])


def test_terminated_and_truncated_are_stored_apart():
    replay = ReplayBuffer(16, (3,), (), np.int32)
    for t in range(4):
        replay.add(*_step(t))
    # env 0 terminates at t = 0, 3; env 1 is truncated at t = 1, 3
    np.testing.assert_array_equal(replay.terminated[:8], [1, 0, 0, 0, 0, 0, 1, 0])
    np.testing.assert_array_equal(replay.truncated[:8], [0, 0, 0, 1, 0, 0, 0, 1])
    batch = replay.gather(np.array([[0, 3], [6, 7]]))
    assert batch.obs.shape == (2, 2, 3) and batch.action.shape == (2, 2)
    assert batch.terminated.dtype == np.float32 and batch.truncated.dtype == np.float32
    np.testing.assert_array_equal(batch.terminated, [[1, 0], [1, 0]])
    np.testing.assert_array_equal(batch.truncated, [[0, 1], [0, 1]])


def test_sampling_is_uniform_over_filled_rows_and_seeded():
    replay = ReplayBuffer(100, (3,), (), np.int32)
    for t in range(5):
        replay.add(*_step(t))
    a = replay.sample_index((4, 64), np.random.default_rng(7))
    b = replay.sample_index((4, 64), np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (4, 64) and a.min() >= 0 and a.max() < 10
    assert len(np.unique(a)) == 10
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(4, (3,), (), np.int32).sample_index((1, 2), np.random.default_rng(0))


def test_memory_is_stated_in_bytes_per_transition():
    cartpole = ReplayBuffer.for_spaces(100_000, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    # obs + next_obs 2 * 4 * 4 B, action int32 4 B, reward float32 4 B, two bool flags 2 B
    assert cartpole.bytes_per_transition == 42
    assert cartpole.nbytes == 4_200_000
    assert cartpole.obs.nbytes + cartpole.next_obs.nbytes + cartpole.action.nbytes + cartpole.reward.nbytes \
        + cartpole.terminated.nbytes + cartpole.truncated.nbytes == cartpole.nbytes
    pendulum = ReplayBuffer.for_spaces(10, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-2, 2, (1,)))
    assert pendulum.bytes_per_transition == 2 * 12 + 4 + 4 + 2
    assert pendulum.action.dtype == np.float32 and pendulum.action.shape == (10, 1)


def test_save_and_load_round_trip_after_wraparound(tmp_path):
    replay = ReplayBuffer(5, (3,), (), np.int32)
    for t in range(4):
        replay.add(*_step(t))
    replay.save(tmp_path / REPLAY_FILE)
    loaded = ReplayBuffer(5, (3,), (), np.int32)
    loaded.load(tmp_path / REPLAY_FILE)
    assert (loaded.size, loaded.pos) == (replay.size, replay.pos)
    for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(replay, name))
    with pytest.raises(ValueError, match="does not fit"):
        ReplayBuffer(6, (3,), (), np.int32).load(tmp_path / REPLAY_FILE)


def test_off_policy_loop_stores_final_obs_and_flags(tmp_path):
    """Random-action collection on Pendulum cut at 7 steps: the stored next_obs of a truncated
    step is the episode's last observation (not the reset one), and it is flagged truncated,
    not terminated (so it is bootstrapped)."""
    cfg = load_config("configs/sac_pendulum.yaml", [
        "train.total_steps=40", "train.learning_starts=1000", "env.n_envs=2",
        "env.kwargs={max_episode_steps: 7}", "net.hidden=[16, 16]", "train.progress=off",
        "env.eval_episodes=1", "train.buffer_size=64"])
    trainer = Trainer(cfg, tmp_path / "run")
    summary = trainer.train()
    assert summary["total_steps"] == 40 and summary["episodes"] == 4
    with np.load(tmp_path / "run" / "checkpoints" / "step_0000000040" / REPLAY_FILE) as data:
        obs, next_obs = data["obs"].reshape(20, 2, 3), data["next_obs"].reshape(20, 2, 3)
        truncated = data["truncated"].reshape(20, 2)
        terminated = data["terminated"].reshape(20, 2)
        action = data["action"].reshape(20, 2, 1)
    assert not terminated.any()
    expected = np.zeros((20, 2), bool)
    expected[6::7] = True
    np.testing.assert_array_equal(truncated, expected)
    assert np.all(np.abs(action) <= 2.0)
    # Pendulum's obs is (cos, sin, angular velocity): a real transition keeps cos^2 + sin^2 = 1
    # and changes the angle a little; the reset obs after a cut is unrelated to next_obs.
    np.testing.assert_allclose(next_obs[..., 0] ** 2 + next_obs[..., 1] ** 2, 1.0, atol=1e-5)
    continuing = ~truncated[:-1]
    np.testing.assert_array_equal(next_obs[:-1][continuing], obs[1:][continuing])
    assert not np.any(np.all(next_obs[:-1][~continuing] == obs[1:][~continuing], axis=-1))


def test_frames_are_stored_as_uint8_and_come_back_as_stored(tmp_path):
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # Atari's stacked 84x84 frames
    replay = ReplayBuffer.for_spaces(8, frames, gym.spaces.Discrete(4))
    assert replay.obs.dtype == np.uint8 and replay.next_obs.dtype == np.uint8
    assert replay.bytes_per_transition == 2 * 4 * 84 * 84 + 4 + 4 + 1 + 1
    bools = gym.spaces.Box(0, 1, (10, 10, 4), bool)  # MinAtar's planes
    replay = ReplayBuffer.for_spaces(8, bools, gym.spaces.Discrete(3))
    rng = np.random.default_rng(0)
    obs, next_obs = rng.random((2, 2, 10, 10, 4)) < 0.5
    replay.add(obs, np.array([0, 2]), np.ones(2, np.float32), next_obs, np.zeros(2, bool), np.zeros(2, bool))
    batch = replay.gather(np.array([0, 1]))
    assert batch.obs.dtype == np.uint8 and np.array_equal(batch.obs, obs) and np.array_equal(batch.next_obs, next_obs)
    replay.save(tmp_path / "replay.npz")
    again = ReplayBuffer.for_spaces(8, bools, gym.spaces.Discrete(3))
    again.load(tmp_path / "replay.npz")
    assert np.array_equal(again.obs, replay.obs)
    floats = ReplayBuffer(8, (10, 10, 4), (), np.int32)  # a buffer of float32 observations refuses it
    with pytest.raises(ValueError, match="uint8"):
        floats.load(tmp_path / "replay.npz")


def _play(env_id: str, n_envs: int, steps: int, seed: int):
    """Vector steps of random play as the collector stores them: (obs, action, reward, next_obs,
    terminated, truncated), next_obs the final observation where an episode ended."""
    envs = make_vector_env(env_id, n_envs)
    rng = np.random.default_rng(seed)
    try:
        obs, _ = envs.reset(seed=seed)
        for _ in range(steps):
            action = rng.integers(0, envs.single_action_space.n, n_envs)
            after, reward, terminated, truncated, info = envs.step(action)
            next_obs = after.copy()
            for i in np.flatnonzero(terminated | truncated):
                next_obs[i] = info["final_obs"][i]
            yield obs, action, reward.astype(np.float32), next_obs, terminated, truncated
            obs = after
    finally:
        envs.close()


def _newest(replay) -> np.ndarray:
    return (replay.pos - replay.size + np.arange(replay.size)) % replay.capacity


def _assert_same_rows(frames: FrameReplay, plain: ReplayBuffer) -> None:
    """The frame replay holds the plain buffer's newest transitions, bit for bit."""
    assert 0 < frames.size <= plain.size and frames.pos == plain.pos
    rows = _newest(frames)
    for field, a, b in zip(ReplayBatch._fields, frames.gather(rows), plain.gather(rows), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b), field


@pytest.mark.parametrize(("env_id", "frames"), [("BreakoutNoFrameskip-v4", 4), ("MinAtar/Breakout-v1", 1)])
def test_frame_replay_reads_back_what_was_added_and_stores_each_frame_once(tmp_path, env_id, frames):
    """Atari's stacks of 4 frames ([4, 84, 84]: a lost life ends a training episode) and MinAtar's
    planes ([10, 10, 4], one unit per observation), two envs, past a wraparound of the ring: every
    transition read back equals the plain buffer's; a checkpoint mid-way resumes exactly."""
    capacity, n_envs = 96, 2
    steps = list(_play(env_id, n_envs, 160, seed=3))
    space = make_vector_env(env_id, 1).single_observation_space
    replay = make_replay(capacity, space, gym.spaces.Discrete(3), n_envs)
    plain = ReplayBuffer.for_spaces(capacity, space, gym.spaces.Discrete(3))
    assert isinstance(replay, FrameReplay) and replay.k == frames
    ends = 0
    for t, step in enumerate(steps):
        replay.add(*step)
        plain.add(*step)
        ends += int(np.sum(step[4] | step[5]))
        _assert_same_rows(replay, plain)
        if t == 100:
            replay.save(tmp_path / REPLAY_FILE)
            resumed = make_replay(capacity, space, gym.spaces.Discrete(3), n_envs)
            resumed.load(tmp_path / REPLAY_FILE)
    assert ends >= 2 and replay.size == capacity  # episodes ended, and the ring is full
    for step in steps[101:]:
        resumed.add(*step)
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    for a, b in zip(replay.sample((4, 32), rng_a), resumed.sample((4, 32), rng_b), strict=True):
        np.testing.assert_array_equal(a, b)
    # One unit per transition (an obs and its next obs share all but one), one more per episode.
    assert replay.count <= len(steps) * n_envs + ends + n_envs * frames


def test_frame_replay_never_reads_an_overwritten_frame(caplog, tmp_path):
    """Frames that share nothing (every unit new) fill the ring faster than transitions: the oldest
    transitions leave the buffer first, what stays reads back exactly, and a warning says so."""
    rng = np.random.default_rng(0)
    replay = FrameReplay(64, (4, 6, 6), (), np.int32, frames=4)
    plain = ReplayBuffer(64, (4, 6, 6), (), np.int32, np.uint8)
    for _ in range(100):
        obs, next_obs = rng.integers(0, 256, (2, 1, 4, 6, 6), dtype=np.uint8)
        step = (obs, rng.integers(0, 3, 1), rng.random(1).astype(np.float32), next_obs, np.zeros(1, bool),
                np.zeros(1, bool))
        replay.add(*step)
        plain.add(*step)
        _assert_same_rows(replay, plain)
    assert replay.size < replay.slots // 8  # 8 new units per transition
    assert "holds" in caplog.text and "a frame stack?" in caplog.text
    replay.save(tmp_path / REPLAY_FILE)
    with pytest.raises(ValueError, match="does not fit"):
        FrameReplay(64, (4, 6, 6), (), np.int32, frames=1).load(tmp_path / REPLAY_FILE)


def test_a_1m_atari_replay_needs_what_stable_baselines3s_does():
    """1M transitions of Atari's [4, 84, 84] frames: ~7.5 GB (each frame once), not the ~56 GB of
    an observation and a next observation per transition."""
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    nbytes = FrameReplay.nbytes_for(1_000_000, frames, gym.spaces.Discrete(4))
    assert 7.0e9 < nbytes < 7.6e9
    small = FrameReplay.for_spaces(1000, frames, gym.spaces.Discrete(4))
    assert small.nbytes == FrameReplay.nbytes_for(1000, frames, gym.spaces.Discrete(4))

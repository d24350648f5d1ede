"""`train.normalize_reward` (PPO): rewards scaled as Stable-Baselines3's VecNormalize scales them
(running std of the discounted return, reset at episode ends, clipped), for the learner only, and
the scaler's statistics carried through a checkpoint."""

import numpy as np
import pytest

from rlstack.algorithms.ppo import REWARD_SCALER_FILE
from rlstack.collector import RewardScaler, Trajectory
from rlstack.config import ConfigError, load_config
from rlstack.trainer import Trainer


def _chunk(reward: np.ndarray, done: np.ndarray, actor: int = -1) -> Trajectory:
    t, n = reward.shape
    zeros = np.zeros((t, n), np.float32)
    return Trajectory(obs=np.zeros((t, n, 1), np.float32), action=zeros, logp=zeros, value=zeros,
                      reward=reward.astype(np.float32), terminated=done, truncated=np.zeros_like(done),
                      final_value=zeros, next_obs=None, version=np.zeros(t, np.int64),
                      last_obs=np.zeros((n, 1), np.float32), last_value=np.zeros(n, np.float32),
                      episode_returns=np.zeros(0), episode_lengths=np.zeros(0), actor=actor, env_seconds=0.0,
                      act_seconds=0.0)


def _vecnormalize(rewards: np.ndarray, dones: np.ndarray, gamma: float, clip: float) -> np.ndarray:
    """SB3's VecNormalize.step_wait reward path, written out: returns = returns * gamma + r; the
    running mean/var (count 1e-4, Chan's parallel update) takes the returns of all envs; r / sqrt(var
    + 1e-8) clipped; returns of finished envs reset."""
    mean, var, count = 0.0, 1.0, 1e-4
    returns = np.zeros(rewards.shape[1])
    out = np.empty_like(rewards, dtype=np.float64)
    for t in range(len(rewards)):
        returns = returns * gamma + rewards[t]
        b_mean, b_var, b_count = returns.mean(), returns.var(), len(returns)
        delta, total = b_mean - mean, count + b_count
        mean, var = mean + delta * b_count / total, (var * count + b_var * b_count + delta**2 * count * b_count
                                                     / total) / total
        count = total
        out[t] = np.clip(rewards[t] / np.sqrt(var + 1e-8), -clip, clip)
        returns[dones[t]] = 0.0
    return out


def test_rewards_are_scaled_as_vecnormalize_scales_them_across_chunks_and_episode_ends(tmp_path):
    rng = np.random.default_rng(0)
    rewards = rng.normal(3.0, 2.0, (300, 2)) * (rng.random((300, 2)) < 0.9)
    rewards[150, 0] = 500.0  # one huge reward: clipped at 10 stds
    dones = rng.random((300, 2)) < 0.02
    expected = _vecnormalize(rewards, dones, 0.98, 10.0)
    scaler = RewardScaler(0.98, 10.0)
    first = scaler(_chunk(rewards[:128], dones[:128]))
    scaler.save(tmp_path / "scaler.json")
    resumed = RewardScaler(0.98, 10.0)
    resumed.load(tmp_path / "scaler.json")
    for s in (scaler, resumed):  # the rest in two more chunks, by the scaler and by its reloaded copy
        rest = np.concatenate([s(_chunk(rewards[128:200], dones[128:200])).reward,
                               s(_chunk(rewards[200:], dones[200:])).reward])
        np.testing.assert_allclose(np.concatenate([first.reward, rest]), expected, rtol=1e-6, atol=1e-6)
    assert first.reward.dtype == np.float32 and np.abs(expected).max() == 10.0
    assert 0.1 < np.abs(expected).mean() < 3  # scaled: rewards near 3 became about 0.3-1
    # chunks from another source (an actor) keep their own returns
    other = RewardScaler(0.98, 10.0)
    other(_chunk(rewards[:5], dones[:5], actor=0))
    assert set(other.returns) == {0}


def test_a_ppo_run_scales_its_rewards_only_for_the_learner_and_checkpoints_the_scaler(tmp_path):
    cfg = load_config("ppo_pendulum", ["train.normalize_reward=true", "train.total_steps=8192",
                                       "train.n_steps=512", "train.progress=off", "env.eval_episodes=2"])
    trainer = Trainer(cfg, tmp_path / "run")
    summary = trainer.train()
    scaler = trainer.algo.reward_scaler
    assert scaler.rms.count > 8000 and scaler.rms.var > 1.0  # Pendulum's returns are large and negative
    # what is logged and evaluated is the env's return (Pendulum: -100 to -1,700 an episode)
    assert summary["rollout/ep_return_mean"] < -100 and summary["eval/mean_return"] < -50
    from rlstack import checkpoints

    assert (checkpoints.latest(tmp_path / "run") / REWARD_SCALER_FILE).is_file()
    resumed = Trainer.resume(tmp_path / "run", ["train.total_steps=9216"])
    assert resumed.algo.reward_scaler.rms.count == scaler.rms.count
    assert resumed.algo.reward_scaler.rms.var == scaler.rms.var


def test_clip_reward_must_be_positive():
    with pytest.raises(ConfigError, match="clip_reward"):
        load_config("ppo_pendulum", ["train.clip_reward=0"])

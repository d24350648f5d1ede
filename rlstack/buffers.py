"""Rollout storage and GAE for on-policy learning (the buffer stage of the data path)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class RolloutBatch(NamedTuple):
    """One rollout flattened to [T * N, ...] rows, ready for minibatching."""

    obs: np.ndarray  # [T*N, obs_dim] float32
    action: np.ndarray  # [T*N] int32 or [T*N, d] float32
    logp: np.ndarray  # [T*N] behaviour log-probability
    value: np.ndarray  # [T*N] V(s) at collection time
    adv: np.ndarray  # [T*N] GAE advantage
    ret: np.ndarray  # [T*N] adv + value (the value target)


def compute_gae(reward: np.ndarray, value: np.ndarray, done: np.ndarray, last_value: np.ndarray,
                gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    reward, value, done: [T, N]; last_value: [N] = V(obs after the last step).
    `done[t]` is True when the episode ended at step t (terminated *or* truncated): the
    recursion is cut there. Truncation is not a terminal state, so the caller has already
    added gamma * V(final_obs) to reward[t] for truncated steps (as SB3 does).
    Returns (adv, ret) [T, N] float32.
    """
    steps = reward.shape[0]
    adv = np.zeros_like(reward, dtype=np.float32)
    running = np.zeros(reward.shape[1], dtype=np.float32)
    for t in reversed(range(steps)):
        next_value = last_value if t == steps - 1 else value[t + 1]
        nonterminal = 1.0 - done[t].astype(np.float32)
        delta = reward[t] + gamma * next_value * nonterminal - value[t]
        running = delta + gamma * lam * nonterminal * running
        adv[t] = running
    return adv, (adv + value).astype(np.float32)


class RolloutBuffer:
    """Preallocated [T, N] arrays for one on-policy rollout."""

    def __init__(self, steps: int, n_envs: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: np.dtype):
        self.steps, self.n_envs = steps, n_envs
        self.obs = np.zeros((steps, n_envs, *obs_shape), np.float32)
        self.action = np.zeros((steps, n_envs, *action_shape), action_dtype)
        self.logp = np.zeros((steps, n_envs), np.float32)
        self.value = np.zeros((steps, n_envs), np.float32)
        self.reward = np.zeros((steps, n_envs), np.float32)
        self.done = np.zeros((steps, n_envs), bool)
        self.pos = 0

    def add(self, obs: np.ndarray, action: np.ndarray, logp: np.ndarray, value: np.ndarray,
            reward: np.ndarray, done: np.ndarray) -> None:
        t = self.pos
        self.obs[t], self.action[t], self.logp[t], self.value[t] = obs, action, logp, value
        self.reward[t], self.done[t] = reward, done
        self.pos += 1

    @property
    def full(self) -> bool:
        return self.pos == self.steps

    def finish(self, last_value: np.ndarray, gamma: float, lam: float) -> RolloutBatch:
        """Compute GAE and flatten; resets the buffer for the next rollout."""
        adv, ret = compute_gae(self.reward, self.value, self.done, last_value, gamma, lam)
        self.pos = 0
        rows = self.steps * self.n_envs
        return RolloutBatch(
            obs=self.obs.reshape(rows, *self.obs.shape[2:]).copy(),
            action=self.action.reshape(rows, *self.action.shape[2:]).copy(),
            logp=self.logp.reshape(rows).copy(),
            value=self.value.reshape(rows).copy(),
            adv=adv.reshape(rows),
            ret=ret.reshape(rows),
        )


class RunningMeanStd:
    """Running mean/variance of observations (parallel update of Chan et al.), as SB3's."""

    def __init__(self, shape: tuple[int, ...], epsilon: float = 1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        batch_mean, batch_var, n = batch.mean(0), batch.var(0), batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.var = m2 / total
        self.count = total

    def state(self) -> dict:
        return {"mean": self.mean.tolist(), "var": self.var.tolist(), "count": self.count}

    def load(self, state: dict) -> None:
        self.mean = np.asarray(state["mean"], np.float64)
        self.var = np.asarray(state["var"], np.float64)
        self.count = float(state["count"])

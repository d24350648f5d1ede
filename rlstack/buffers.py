"""Rollout storage and GAE for on-policy learning (the buffer stage of the data path)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class RolloutBatch(NamedTuple):
    """One rollout flattened to [T * N, ...] rows, ready for minibatching."""

    obs: np.ndarray  # [T*N, *obs_shape] in the rollout's dtype (uint8 frames, else float32)
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


def rollout_batch(traj: Any, gamma: float, lam: float) -> RolloutBatch:
    """A collector chunk (`rlstack.collector.Trajectory`, [T, N]) -> GAE advantages, flat rows.

    Time-limit truncation is not a terminal state: the value of the final observation the
    collector measured (`final_value`) is folded into the reward, gamma * V(final_obs).
    """
    reward = traj.reward + gamma * traj.final_value
    done = traj.terminated | traj.truncated
    adv, ret = compute_gae(reward, traj.value, done, traj.last_value, gamma, lam)
    rows = reward.size
    return RolloutBatch(
        obs=traj.obs.reshape(rows, *traj.obs.shape[2:]).copy(),
        action=traj.action.reshape(rows, *traj.action.shape[2:]).copy(),
        logp=traj.logp.reshape(rows).copy(),
        value=traj.value.reshape(rows).copy(),
        adv=adv.reshape(rows),
        ret=ret.reshape(rows),
    )


def pack_columns(lead: tuple[int, ...], *columns: np.ndarray) -> np.ndarray:
    """Minibatch columns, each [*lead, ...], side by side as one float32 array [*lead, width]
    (each flattened after `lead`; integer actions are exact in float32). An update graph then
    takes one input instead of one per column (each graph input costs the call: docs/PERFORMANCE.md#the-call) and
    slices the columns inside."""
    return np.concatenate([x.reshape(*lead, -1).astype(np.float32, copy=False) for x in columns], -1)

"""The replay buffer (the buffer stage for DQN/SAC).

`ReplayBuffer` is a preallocated numpy ring of transitions `(obs, action, reward, next_obs,
terminated, truncated)`. Termination and time-limit truncation are stored separately: only
`terminated` stops the bootstrap, so an episode cut by a time limit is still valued with
gamma * Q(next_obs) (the final observation, which the SAME_STEP-autoreset vector env reports
in `info["final_obs"]`). Sampling is uniform with replacement, as Stable-Baselines3's.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from rlstack.spaces import obs_dtype_of

REPLAY_FILE = "replay.npz"
"""Name of the replay buffer's file inside a checkpoint directory."""

CHECKPOINT_REPLAY_MAX_BYTES = 128 * 2**20
"""`checkpoint_replay: null` saves the buffer with checkpoints when its capacity is at most this."""


class ReplayBatch(NamedTuple):
    """Sampled transitions; every field has the leading shape of the sampled index array."""

    obs: np.ndarray  # [..., *obs_shape] float32, or uint8 frames
    action: np.ndarray  # [...] int32 (Discrete) or [..., d] float32 (Box, env units)
    reward: np.ndarray  # [...] float32
    next_obs: np.ndarray  # [..., *obs_shape] as obs: the final obs when the episode ended here
    terminated: np.ndarray  # [...] float32 1.0 when next_obs is terminal (no bootstrap)
    truncated: np.ndarray  # [...] float32 1.0 when a time limit cut the episode (bootstrap)


class ReplayBuffer:
    """Preallocated ring buffer of single transitions (a vector step adds `n_envs` rows)."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: np.dtype | type, obs_dtype: np.dtype | type = np.float32):
        self.capacity = int(capacity)
        self.obs = np.zeros((self.capacity, *obs_shape), obs_dtype)
        self.next_obs = np.zeros((self.capacity, *obs_shape), obs_dtype)
        self.action = np.zeros((self.capacity, *action_shape), action_dtype)
        self.reward = np.zeros(self.capacity, np.float32)
        self.terminated = np.zeros(self.capacity, bool)
        self.truncated = np.zeros(self.capacity, bool)
        self.pos = 0
        """Row the next transition is written to."""
        self.size = 0
        """Rows holding data (grows to `capacity`, then stays)."""

    @classmethod
    def for_spaces(cls, capacity: int, obs_space: gym.Space, action_space: gym.Space) -> ReplayBuffer:
        discrete = isinstance(action_space, gym.spaces.Discrete)
        return cls(capacity, obs_space.shape, () if discrete else action_space.shape,
                   np.int32 if discrete else np.float32, obs_dtype_of(obs_space))

    @property
    def bytes_per_transition(self) -> int:
        """Memory of one stored transition (obs and next_obs are both stored)."""
        arrays = (self.obs, self.next_obs, self.action, self.reward, self.terminated, self.truncated)
        return sum(a.itemsize * int(np.prod(a.shape[1:])) for a in arrays)

    @property
    def nbytes(self) -> int:
        """Memory of the whole preallocated buffer."""
        return self.capacity * self.bytes_per_transition

    def __len__(self) -> int:
        return self.size

    def add(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray) -> None:
        """Store one vector step: every argument has a leading [n_envs] dimension.

        `next_obs` must be the observation the action led to; for an episode that ended at this
        step that is `info["final_obs"]`, not the first observation of the next episode.
        """
        n = len(reward)
        rows = (self.pos + np.arange(n)) % self.capacity
        self.obs[rows] = obs
        self.action[rows] = action
        self.reward[rows] = reward
        self.next_obs[rows] = next_obs
        self.terminated[rows] = terminated
        self.truncated[rows] = truncated
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def sample_index(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Uniform row indices with replacement, of the given shape (e.g. [K, batch])."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return rng.integers(0, self.size, size=shape)

    def gather(self, index: np.ndarray) -> ReplayBatch:
        return ReplayBatch(
            obs=self.obs[index], action=self.action[index], reward=self.reward[index],
            next_obs=self.next_obs[index], terminated=self.terminated[index].astype(np.float32),
            truncated=self.truncated[index].astype(np.float32))

    def sample(self, shape: tuple[int, ...], rng: np.random.Generator) -> ReplayBatch:
        """`gather(sample_index(shape, rng))`: e.g. shape (K, B) for K minibatches of B."""
        return self.gather(self.sample_index(shape, rng))

    # ----- checkpoints: only the filled rows are written ------------------------------------------

    def save(self, path: str | Path) -> None:
        n = self.size
        arrays = {"obs": self.obs[:n], "next_obs": self.next_obs[:n], "action": self.action[:n],
                  "reward": self.reward[:n], "terminated": self.terminated[:n], "truncated": self.truncated[:n],
                  "pos": np.int64(self.pos), "capacity": np.int64(self.capacity)}
        # An .npz as np.savez writes it, but closed on a failed write (disk full) instead of
        # leaving the half-written zip to the garbage collector.
        with zipfile.ZipFile(path, "w", allowZip64=True) as z:
            for name, value in arrays.items():
                with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)

    def load(self, path: str | Path) -> None:
        with np.load(path) as data:
            if int(data["capacity"]) != self.capacity or data["obs"].shape[1:] != self.obs.shape[1:] \
                    or data["obs"].dtype != self.obs.dtype or data["action"].shape[1:] != self.action.shape[1:]:
                raise ValueError(f"{path}: replay buffer of capacity {int(data['capacity'])}, obs "
                                 f"{data['obs'].shape[1:]} {data['obs'].dtype}, action {data['action'].shape[1:]} "
                                 f"does not fit capacity {self.capacity}, obs {self.obs.shape[1:]} {self.obs.dtype}, "
                                 f"action {self.action.shape[1:]}")
            n = len(data["reward"])
            for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
                getattr(self, name)[:n] = data[name]
            self.size, self.pos = n, int(data["pos"])

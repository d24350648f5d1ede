"""The replay buffer and the settings every off-policy algorithm shares (the buffer stage for DQN/SAC).

`ReplayBuffer` is a preallocated numpy ring of transitions `(obs, action, reward, next_obs,
terminated, truncated)`. Termination and time-limit truncation are stored separately: only
`terminated` stops the bootstrap, so an episode cut by a time limit is still valued with
gamma * Q(next_obs) (the final observation, which the SAME_STEP-autoreset vector env reports
in `info["final_obs"]`). Sampling is uniform with replacement, as Stable-Baselines3's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from rlstack.config import Config, ConfigError, TrainConfig
from rlstack.schedules import parse_schedule

REPLAY_FILE = "replay.npz"
"""Name of the replay buffer's file inside a checkpoint directory."""

CHECKPOINT_REPLAY_MAX_BYTES = 128 * 2**20
"""`checkpoint_replay: null` saves the buffer with checkpoints when its capacity is at most this."""


@dataclass
class OffPolicyConfig(TrainConfig):
    """Settings of the trainer's off-policy loop (names as in Stable-Baselines3 / RL Zoo)."""

    buffer_size: int = 1_000_000
    """Replay capacity in transitions (the oldest are overwritten)."""
    learning_starts: int = 100
    """Environment steps of uniformly random actions before the first update."""
    batch_size: int = 256
    """Transitions per gradient step."""
    train_freq: int = 1
    """Update every this many vector-env steps (each vector step is env.n_envs transitions)."""
    gradient_steps: int = 1
    """Gradient steps per update (each on a fresh minibatch)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 1.0
    """Target-network update rate: 1.0 is a hard copy, < 1 Polyak averaging."""
    target_update_interval: int = 1
    """How often the target network is updated (DQN: environment steps; SAC: gradient steps)."""
    lr: str = "3e-4"
    """Adam learning rate: a number, or `lin_X` for a linear decay from X to 0."""
    checkpoint_replay: bool | None = None
    """Save the replay buffer with each checkpoint (None: only when its capacity is
    at most 128 MiB, so `--resume` continues with the same data)."""
    log_every_steps: int = 1000
    """Environment steps between TensorBoard points (training metrics are averaged in between)."""

    def validate(self, cfg: Config) -> None:
        for key in ("buffer_size", "batch_size", "train_freq", "gradient_steps", "target_update_interval",
                    "log_every_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"'train.{key}' must be >= 1, got {getattr(self, key)}")
        if self.learning_starts < 0:
            raise ConfigError(f"'train.learning_starts' must be >= 0, got {self.learning_starts}")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"'train.tau' must be in (0, 1], got {self.tau}")
        if self.buffer_size < cfg.env.n_envs:
            raise ConfigError(f"'train.buffer_size' ({self.buffer_size}) must hold at least one vector step "
                              f"(env.n_envs = {cfg.env.n_envs})")
        try:
            parse_schedule(self.lr, "train.lr")
        except ValueError as err:
            raise ConfigError(str(err)) from None


class ReplayBatch(NamedTuple):
    """Sampled transitions; every field has the leading shape of the sampled index array."""

    obs: np.ndarray  # [..., *obs_shape] float32
    action: np.ndarray  # [...] int32 (Discrete) or [..., d] float32 (Box, env units)
    reward: np.ndarray  # [...] float32
    next_obs: np.ndarray  # [..., *obs_shape] float32: the final obs when the episode ended here
    terminated: np.ndarray  # [...] float32 1.0 when next_obs is terminal (no bootstrap)
    truncated: np.ndarray  # [...] float32 1.0 when a time limit cut the episode (bootstrap)


class ReplayBuffer:
    """Preallocated ring buffer of single transitions (a vector step adds `n_envs` rows)."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: np.dtype | type):
        self.capacity = int(capacity)
        self.obs = np.zeros((self.capacity, *obs_shape), np.float32)
        self.next_obs = np.zeros((self.capacity, *obs_shape), np.float32)
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
                   np.int32 if discrete else np.float32)

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
        with open(path, "wb") as f:
            np.savez(f, obs=self.obs[:n], next_obs=self.next_obs[:n], action=self.action[:n],
                     reward=self.reward[:n], terminated=self.terminated[:n], truncated=self.truncated[:n],
                     pos=np.int64(self.pos), capacity=np.int64(self.capacity))

    def load(self, path: str | Path) -> None:
        with np.load(path) as data:
            if int(data["capacity"]) != self.capacity or data["obs"].shape[1:] != self.obs.shape[1:] \
                    or data["action"].shape[1:] != self.action.shape[1:]:
                raise ValueError(f"{path}: replay buffer of capacity {int(data['capacity'])}, obs "
                                 f"{data['obs'].shape[1:]}, action {data['action'].shape[1:]} does not fit "
                                 f"capacity {self.capacity}, obs {self.obs.shape[1:]}, "
                                 f"action {self.action.shape[1:]}")
            n = len(data["reward"])
            for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
                getattr(self, name)[:n] = data[name]
            self.size, self.pos = n, int(data["pos"])


def random_actions(space: gym.Space, n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random actions [n] int32 or [n, d] float32 from a seeded generator
    (what the off-policy loop plays before `learning_starts`)."""
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, size=n).astype(np.int32)  # an index, as the network's action
    return rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(np.float32)


def target_update_count(prev_steps: int, steps: int, interval: int) -> int:
    """How many multiples of `interval` lie in (prev_steps, steps]: the target updates due when
    the step counter moved from `prev_steps` to `steps`."""
    return steps // interval - prev_steps // interval

"""The replay buffer (the buffer stage for DQN/SAC).

`ReplayBuffer` is a preallocated numpy ring of transitions `(obs, action, reward, next_obs,
terminated, truncated)`. Termination and time-limit truncation are stored separately: only
`terminated` stops the bootstrap, so an episode cut by a time limit is still valued with
gamma * Q(next_obs) (the final observation, which the SAME_STEP-autoreset vector env reports
in `info["final_obs"]`). Sampling is uniform with replacement, as Stable-Baselines3's.

`FrameReplay` (image observations: `make_replay` chooses) stores each frame once: a transition
holds references into a ring of frames, its next observation shares the frames of the next
transition's observation, and a stack of frames shares all but its newest with the stack before.
Atari's 1M transitions take ~7.5 GB instead of ~56 GB (docs/PERFORMANCE.md#pixels).
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from rlstack.spaces import image_layout, is_image_space, obs_dtype_of

log = logging.getLogger(__name__)

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


class _Rows:
    """A ring of `capacity` rows of what every transition holds besides its observations: action,
    reward and the two flags."""

    def __init__(self, capacity: int, action_shape: tuple[int, ...], action_dtype: np.dtype | type):
        self.capacity = int(capacity)
        self.action = np.zeros((self.capacity, *action_shape), action_dtype)
        self.reward = np.zeros(self.capacity, np.float32)
        self.terminated = np.zeros(self.capacity, bool)
        self.truncated = np.zeros(self.capacity, bool)
        self.pos = 0
        """Row the next transition is written to."""
        self.size = 0
        """Rows that can be read."""

    def __len__(self) -> int:
        return self.size

    def sample(self, shape: tuple[int, ...], rng: np.random.Generator) -> ReplayBatch:
        """`gather(sample_index(shape, rng))`: e.g. shape (K, B) for K minibatches of B."""
        return self.gather(self.sample_index(shape, rng))

    def _batch(self, index: np.ndarray, obs: np.ndarray, next_obs: np.ndarray) -> ReplayBatch:
        """The rows `index` with their observations (each buffer reads those its own way)."""
        return ReplayBatch(obs=obs, action=self.action[index], reward=self.reward[index], next_obs=next_obs,
                           terminated=self.terminated[index].astype(np.float32),
                           truncated=self.truncated[index].astype(np.float32))


def _action_spec(action_space: gym.Space) -> tuple[tuple[int, ...], type]:
    """(shape, dtype) of one stored action: int32 for Discrete, float32 [d] for Box."""
    if isinstance(action_space, gym.spaces.Discrete):
        return (), np.int32
    return tuple(action_space.shape), np.float32


class ReplayBuffer(_Rows):
    """Preallocated ring buffer of single transitions (a vector step adds `n_envs` rows); `size`
    grows to `capacity`, then stays."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: np.dtype | type, obs_dtype: np.dtype | type = np.float32):
        super().__init__(capacity, action_shape, action_dtype)
        self.obs = np.zeros((self.capacity, *obs_shape), obs_dtype)
        self.next_obs = np.zeros((self.capacity, *obs_shape), obs_dtype)

    @classmethod
    def for_spaces(cls, capacity: int, obs_space: gym.Space, action_space: gym.Space) -> ReplayBuffer:
        return cls(capacity, obs_space.shape, *_action_spec(action_space), obs_dtype_of(obs_space))

    @property
    def bytes_per_transition(self) -> int:
        """Memory of one stored transition (obs and next_obs are both stored)."""
        arrays = (self.obs, self.next_obs, self.action, self.reward, self.terminated, self.truncated)
        return sum(a.itemsize * int(np.prod(a.shape[1:])) for a in arrays)

    @property
    def nbytes(self) -> int:
        """Memory of the whole preallocated buffer."""
        return self.capacity * self.bytes_per_transition

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
        return self._batch(index, self.obs[index], self.next_obs[index])

    # ----- checkpoints: only the filled rows are written ------------------------------------------

    def save(self, path: str | Path) -> None:
        n = self.size
        arrays = {"obs": self.obs[:n], "next_obs": self.next_obs[:n], "action": self.action[:n],
                  "reward": self.reward[:n], "terminated": self.terminated[:n], "truncated": self.truncated[:n],
                  "pos": np.int64(self.pos), "capacity": np.int64(self.capacity)}
        _write_npz(path, arrays)

    def load(self, path: str | Path) -> None:
        with np.load(path) as data:
            if "obs" not in data:
                raise ValueError(f"{path}: a frame replay (image observations) does not fit a replay buffer of obs "
                                 f"{self.obs.shape[1:]} {self.obs.dtype}")
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


FRAME_SLACK = 16
"""`FrameReplay` keeps `capacity + capacity // FRAME_SLACK` frames (plus a few per env): a
transition adds one frame (its next observation's newest) and an episode's first observation one
more; an episode shorter than `FRAME_SLACK` steps on average leaves the buffer fewer
transitions than its capacity (the oldest go first, and none is ever read from a reused slot)."""


class FrameReplay(_Rows):
    """The replay buffer of image observations, each frame stored once (DQN's own replay, Mnih et
    al. 2015, and Stable-Baselines3's `optimize_memory_usage`, for any vector env).

    An observation is `k` units along its first axis: the frames of a channels-first frame stack
    ([4, 84, 84]: k = 4, units of [84, 84]), else the whole observation (MinAtar's [10, 10, C]:
    k = 1). Units live once in a ring of `slots`; each transition holds the sequence numbers of its
    observation's and its next observation's units. What is shared is found by comparing content
    when a transition is added: the observation equal to the same env's last next observation
    takes its units; a next observation equal to the observation shifted by one frame adds only its
    newest frame; anything else (a reset, a final observation) stores its units anew. So what is
    read back is always what was added, bit for bit, whether or not frames repeat.

    The transitions held are the newest `size` ones, all of whose units are still in the ring.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: np.dtype | type, frames: int = 1, envs: int = 1):
        if frames < 1 or (frames > 1 and obs_shape[0] != frames):
            raise ValueError(f"frames={frames} must be 1 or the first axis of the observation {obs_shape}")
        super().__init__(capacity, action_shape, action_dtype)
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.k = int(frames)
        self.unit_shape = self.obs_shape[1:] if self.k > 1 else self.obs_shape
        self.slots = self.slots_for(self.capacity, self.k, envs)
        self.frames = np.zeros((self.slots, *self.unit_shape), np.uint8)
        self.obs_ref = np.zeros((self.capacity, self.k), np.int64)
        self.next_ref = np.zeros((self.capacity, self.k), np.int64)
        self.oldest = np.zeros(self.capacity, np.int64)
        """The oldest unit (sequence number) a row refers to. The rows that can be read are the
        newest `size` ones (up to `capacity`)."""
        self.count = 0
        """Units stored so far (the next one's sequence number)."""
        self.filled = 0
        """Rows ever written (up to `capacity`)."""
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        """The last add's next observations as units [n, k, ...] and their references [n, k]."""
        self._warned = False

    @staticmethod
    def margin(frames: int, envs: int) -> int:
        """Units a transition's references may be older than the units stored when it was added
        (the oldest frame of a stack), plus the units one add stores: rows whose oldest unit is
        this close to being overwritten leave the buffer."""
        return 2 * (frames + 1) ** 2 * max(1, envs)

    @classmethod
    def slots_for(cls, capacity: int, frames: int, envs: int) -> int:
        """Units the ring holds (see `FRAME_SLACK`)."""
        return capacity + capacity // FRAME_SLACK + 2 * cls.margin(frames, envs)

    @staticmethod
    def frames_of(obs_space: gym.Space) -> int:
        """Units per observation: the channels of a channels-first image (a frame stack), else 1."""
        (c, _, _), channels_last = image_layout(obs_space)
        return 1 if channels_last else c

    @classmethod
    def for_spaces(cls, capacity: int, obs_space: gym.Space, action_space: gym.Space, envs: int = 1) -> FrameReplay:
        return cls(capacity, obs_space.shape, *_action_spec(action_space), frames=cls.frames_of(obs_space), envs=envs)

    @classmethod
    def nbytes_for(cls, capacity: int, obs_space: gym.Space, action_space: gym.Space, envs: int = 1) -> int:
        """`nbytes` of `for_spaces(...)`, computed without allocating (rlstack/budget.py)."""
        k = cls.frames_of(obs_space)
        obs_bytes = int(np.prod(obs_space.shape))
        shape, dtype = _action_spec(action_space)
        action = np.dtype(dtype).itemsize * int(np.prod(shape))
        # per row: two references per unit and the oldest (int64), action, reward float32, two flags
        return cls.slots_for(capacity, k, envs) * (obs_bytes // k) + capacity * (8 * (2 * k + 1) + action + 4 + 2)

    @property
    def bytes_per_transition(self) -> int:
        """Memory per transition of capacity: the frame ring's share, the references, action,
        reward and flags."""
        return int(self.nbytes // self.capacity)

    @property
    def nbytes(self) -> int:
        arrays = (self.frames, self.obs_ref, self.next_ref, self.oldest, self.action, self.reward, self.terminated,
                  self.truncated)
        return sum(a.nbytes for a in arrays)

    def _store(self, units: np.ndarray) -> np.ndarray:
        """Sequence numbers of `units` [m, ...], each stored in the next slot."""
        seqs = self.count + np.arange(len(units), dtype=np.int64)
        self.frames[seqs % self.slots] = units
        self.count += len(units)
        return seqs

    def _fresh(self, units: np.ndarray) -> np.ndarray:
        """References of one observation's `units` [k, ...] stored anew, a unit equal to the one
        before it shared (a stack at reset repeats its first frame)."""
        refs = np.empty(self.k, np.int64)
        for i in range(self.k):
            if i and np.array_equal(units[i], units[i - 1]):
                refs[i] = refs[i - 1]
            else:
                refs[i] = self._store(units[i:i + 1])[0]
        return refs

    def add(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray) -> None:
        """Store one vector step, as `ReplayBuffer.add` (row i of each argument is env i)."""
        n = len(reward)
        obs_u = np.asarray(obs, np.uint8).reshape(n, self.k, *self.unit_shape)
        next_u = np.asarray(next_obs, np.uint8).reshape(n, self.k, *self.unit_shape)
        obs_ref, next_ref = np.empty((n, self.k), np.int64), np.empty((n, self.k), np.int64)
        last = self._last if self._last is not None and len(self._last[0]) == n else None
        live = self.count - self.slots
        for e in range(n):
            if last is not None and last[1][e].min() >= live and np.array_equal(obs_u[e], last[0][e]):
                obs_ref[e] = last[1][e]
            else:
                obs_ref[e] = self._fresh(obs_u[e])
            if self.k > 1 and np.array_equal(next_u[e, :-1], obs_u[e, 1:]):
                next_ref[e, :-1] = obs_ref[e, 1:]
                next_ref[e, -1] = self._store(next_u[e, -1:])[0]
            else:
                next_ref[e] = self._fresh(next_u[e])
        rows = (self.pos + np.arange(n)) % self.capacity
        self.obs_ref[rows], self.next_ref[rows] = obs_ref, next_ref
        self.oldest[rows] = np.minimum(obs_ref.min(1), next_ref.min(1))
        self.action[rows] = action
        self.reward[rows] = reward
        self.terminated[rows] = terminated
        self.truncated[rows] = truncated
        self._last = (next_u.copy(), next_ref)
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        self.filled = min(self.filled + n, self.capacity)
        expired = self.count - self.slots + self.margin(self.k, n)
        while self.size and self.oldest[(self.pos - self.size) % self.capacity] < expired:
            self.size -= 1  # its frames' slots are (about to be) reused: the oldest transitions go first
        if self.size < self.filled and not self._warned:
            self._warned = True
            log.warning("the frame replay holds %d of its %d transitions: the observations share fewer frames "
                        "than a stack of %d frames does (are their %d channels a frame stack?)",
                        self.size, self.capacity, self.k, self.k)

    def sample_index(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Uniform row indices, with replacement, among the `size` newest rows."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return (self.pos - self.size + rng.integers(0, self.size, size=shape)) % self.capacity

    def _frames(self, refs: np.ndarray) -> np.ndarray:
        return self.frames[refs % self.slots].reshape(*refs.shape[:-1], *self.obs_shape)

    def gather(self, index: np.ndarray) -> ReplayBatch:
        if np.any(self.oldest[index] < self.count - self.slots):
            raise RuntimeError("replay rows whose frames were overwritten were sampled")
        return self._batch(index, self._frames(self.obs_ref[index]), self._frames(self.next_ref[index]))

    # ----- checkpoints --------------------------------------------------------------------------

    ROW_ARRAYS = ("obs_ref", "next_ref", "oldest", "action", "reward", "terminated", "truncated")

    def save(self, path: str | Path) -> None:
        arrays = {name: getattr(self, name)[:self.filled] for name in self.ROW_ARRAYS}
        arrays.update(frames=self.frames[:min(self.count, self.slots)], pos=np.int64(self.pos),
                      size=np.int64(self.size), count=np.int64(self.count), capacity=np.int64(self.capacity),
                      slots=np.int64(self.slots), obs_shape=np.asarray(self.obs_shape, np.int64),
                      k=np.int64(self.k))
        if self._last is not None:
            arrays.update(last_units=self._last[0], last_refs=self._last[1])
        _write_npz(path, arrays)

    def load(self, path: str | Path) -> None:
        with np.load(path) as data:
            if "frames" not in data or int(data["capacity"]) != self.capacity or int(data["slots"]) != self.slots \
                    or tuple(data["obs_shape"]) != self.obs_shape or int(data["k"]) != self.k \
                    or data["action"].shape[1:] != self.action.shape[1:]:
                raise ValueError(f"{path}: not a frame replay of capacity {self.capacity}, {self.slots} frame slots, "
                                 f"obs {self.obs_shape} uint8 in {self.k} units, action {self.action.shape[1:]}: "
                                 "it does not fit")
            for name in self.ROW_ARRAYS:
                values = data[name]
                getattr(self, name)[:len(values)] = values
            self.frames[:len(data["frames"])] = data["frames"]
            self.pos, self.size, self.count = int(data["pos"]), int(data["size"]), int(data["count"])
            self.filled = len(data["reward"])
            self._last = (data["last_units"], data["last_refs"]) if "last_units" in data else None


def _write_npz(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """An .npz as np.savez writes it, but closed on a failed write (disk full) instead of leaving
    the half-written zip to the garbage collector."""
    with zipfile.ZipFile(path, "w", allowZip64=True) as z:
        for name, value in arrays.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)


Replay = ReplayBuffer | FrameReplay


def make_replay(capacity: int, obs_space: gym.Space, action_space: gym.Space, envs: int = 1) -> Replay:
    """The replay buffer for these spaces: `FrameReplay` for image observations, `ReplayBuffer`
    otherwise."""
    if is_image_space(obs_space):
        return FrameReplay.for_spaces(capacity, obs_space, action_space, envs)
    return ReplayBuffer.for_spaces(capacity, obs_space, action_space)

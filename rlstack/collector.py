"""The collector: the env loop, written once, turning a vector env and an `Acting` into trajectory chunks.

Used in the learner's own process (`LocalSource`, `actors: 0`) and inside every actor process
(`rlstack.serving.actor`); the learner consumes `Trajectory` chunks the same way from either.
One loop owns episode accounting (returns and lengths of finished episodes), time-limit
truncation (the value of `info["final_obs"]` for on-policy learners, the real next observation
for off-policy ones), uniform exploration before `learning_starts`, and the env / act timing.

A chunk is `steps` vector steps of `n_envs` envs, arrays `[T, N, ...]`, every step tagged with
the learner-update count of the weights that chose it (`version`).
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from rlstack.acting import Acting
from rlstack.envs import state as env_state
from rlstack.envs.make import GAME_EPISODES, finished_games
from rlstack.errors import RlstackError
from rlstack.registry import ChunkSource

ENVS_FILE = "envs.pkl"
"""The collector's checkpoint extra: the envs' state and the episodes in progress."""


@dataclass(frozen=True)
class ArraySpec:
    """One array of a chunk: name, shape, numpy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


class Trajectory(NamedTuple):
    """`steps` vector steps of one collector ([T, N] = [steps, n_envs]), as the learner receives them."""

    obs: np.ndarray  # [T, N, *obs_shape] float32 (uint8 frames), what the policy saw
    action: np.ndarray  # [T, N] int32 or [T, N, d] float32: on-policy the raw graph output (logp
    # refers to it), off-policy the action the env received (Box samples clipped)
    logp: np.ndarray  # [T, N] behaviour log-probability (0 for uniform exploration)
    value: np.ndarray  # [T, N] the graph's value output
    reward: np.ndarray  # [T, N] float32
    terminated: np.ndarray  # [T, N] bool
    truncated: np.ndarray  # [T, N] bool
    final_value: np.ndarray  # [T, N] on-policy: value of info["final_obs"] where truncated and not terminated
    next_obs: np.ndarray | None  # [T, N, *obs_shape] off-policy: the real next obs (final_obs at episode ends)
    version: np.ndarray  # [T] int64 weights version (learner updates) that chose each step's actions
    last_obs: np.ndarray  # [N, *obs_shape] obs after the last step
    last_value: np.ndarray  # [N] on-policy: value of last_obs (for GAE)
    episode_returns: np.ndarray  # returns of the episodes that ended in this chunk
    episode_lengths: np.ndarray
    actor: int  # -1: the learner's own process
    env_seconds: float
    act_seconds: float
    pool_record: dict | None = None  # self-play in an actor: the games its opponent pool recorded
    # (`OpponentPool.take_record`), for the learner's pool (its gate and totals)
    policy_target: np.ndarray | None = None  # [T, N, n_actions] search learners (`rlstack.search`):
    # the search's move distribution at each position, the policy head's target

    def staleness(self, updates: int) -> dict[str, float]:
        """`rollout/…` scalars: learner updates since the weights that chose each step (and, from
        an actor process, its env / act seconds)."""
        stale = updates - self.version
        metrics = {"rollout/staleness_mean": float(stale.mean()), "rollout/staleness_max": float(stale.max())}
        if self.actor >= 0:
            metrics.update({"rollout/actor_env_seconds": self.env_seconds, "rollout/actor_act_seconds": self.act_seconds})
        return metrics

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray], returns: list, lengths: list, actor: int,
           env_seconds: float, act_seconds: float, pool_record: dict | None = None) -> Trajectory:
        return cls(obs=arrays["obs"], action=arrays["action"], logp=arrays["logp"], value=arrays["value"],
                   reward=arrays["reward"], terminated=arrays["terminated"], truncated=arrays["truncated"],
                   final_value=arrays["final_value"], next_obs=arrays.get("next_obs"), version=arrays["version"],
                   last_obs=arrays["last_obs"], last_value=arrays["last_value"],
                   episode_returns=np.asarray(returns, np.float64), episode_lengths=np.asarray(lengths, np.int64),
                   actor=actor, env_seconds=env_seconds, act_seconds=act_seconds, pool_record=pool_record)


def trajectory_specs(steps: int, n_envs: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                     action_dtype: str, off_policy: bool, obs_dtype: str = "float32") -> tuple[ArraySpec, ...]:
    """The arrays of one chunk (`next_obs` only for off-policy learners); observations in
    `obs_dtype` (`rlstack.spaces.obs_dtype_of`: uint8 frames)."""
    t, n = steps, n_envs
    specs = [ArraySpec("obs", (t, n, *obs_shape), obs_dtype),
             ArraySpec("action", (t, n, *action_shape), action_dtype),
             ArraySpec("logp", (t, n), "float32"), ArraySpec("value", (t, n), "float32"),
             ArraySpec("reward", (t, n), "float32"), ArraySpec("terminated", (t, n), "bool"),
             ArraySpec("truncated", (t, n), "bool"), ArraySpec("final_value", (t, n), "float32"),
             ArraySpec("version", (t,), "int64"), ArraySpec("last_obs", (n, *obs_shape), obs_dtype),
             ArraySpec("last_value", (n,), "float32")]
    if off_policy:
        specs.append(ArraySpec("next_obs", (t, n, *obs_shape), obs_dtype))
    return tuple(specs)


def allocate(specs: tuple[ArraySpec, ...]) -> dict[str, np.ndarray]:
    return {s.name: np.zeros(s.shape, s.dtype) for s in specs}


class Collector:
    """Steps a vector env with an `Acting`, filling chunk arrays.

    `off_policy`: store the action the env received and the real next observation (replay
    buffers bootstrap from it); otherwise store the raw graph action, the value of time-limit
    truncations' final observations and of the last observation (GAE).
    """

    def __init__(self, envs: gym.vector.VectorEnv, acting: Acting, seed: int, *, off_policy: bool,
                 rng: np.random.Generator | None = None):
        mode = envs.metadata.get("autoreset_mode")
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            # The chunk format needs info["final_obs"] at episode ends, with no dead step after.
            raise ValueError(f"the collector needs a vector env with SAME_STEP autoreset, got {mode} "
                             "(build it with rlstack.envs.make_vector_env)")
        self.envs, self.acting, self.off_policy = envs, acting, off_policy
        self.game_episodes = bool(envs.metadata.get(GAME_EPISODES))
        """The env reports whole games in `info` (Atari in training: episodes end at lost lives and
        rewards are clipped); those are the episodes logged."""
        self.rng = rng if rng is not None else np.random.default_rng(seed)
        self.obs, _ = envs.reset(seed=seed)
        n = envs.num_envs
        self.ep_return, self.ep_length = np.zeros(n), np.zeros(n, np.int64)
        self.unsaved: str | None = None
        """Why the env's state is not in checkpoints (`save`), once a save found out."""

    # A checkpoint extra (`rlstack.checkpoints.Checkpointer.add_extra`): the episodes in progress,
    # so a resumed run continues them exactly where the stopped one was.

    def save(self, path: Path) -> None:
        """Write the envs' state and the episodes in progress to `path`, if the env allows
        (`rlstack.envs.state`); otherwise write nothing and say why in `unsaved`."""
        try:
            envs = env_state.capture(self.envs)
        except env_state.NotSaved as err:
            self.unsaved = str(err)
            return
        noise = self.acting.noise_process
        path.write_bytes(pickle.dumps({"envs": envs, "obs": self.obs, "ep_return": self.ep_return,
                                       "ep_length": self.ep_length, "noise": noise.state if noise else None},
                                      protocol=pickle.HIGHEST_PROTOCOL))

    def load(self, path: Path) -> None:
        """Continue the saved episodes; if the env refuses its saved state (e.g. a self-play
        opponent no longer in the pool), keep the fresh reset and say why in `unsaved`."""
        state = pickle.loads(path.read_bytes())  # noqa: S301 - a checkpoint file, checksummed on load
        try:
            env_state.restore(self.envs, state["envs"])
        except ValueError as err:
            self.unsaved = str(err)
            return
        self.obs, self.ep_return, self.ep_length = state["obs"], state["ep_return"], state["ep_length"]
        if self.acting.noise_process is not None:  # the exploration noise's process where it was
            self.acting.noise_process.state = state.get("noise")

    def collect(self, out: dict[str, np.ndarray], explore: Callable[[int], bool]) -> tuple[list, list, float, float]:
        """Fill `out` (the `trajectory_specs` arrays); `explore(t)` runs before step t and returns
        True while actions should be uniformly random (it may also update the acting weights'
        inputs, e.g. an exploration schedule). Returns finished episodes' (returns, lengths) and
        the seconds spent in the env and in acting."""
        acting, envs, n = self.acting, self.envs, self.envs.num_envs
        returns, lengths, env_s, act_s = [], [], 0.0, 0.0
        for t in range(out["reward"].shape[0]):
            uniform = explore(t)
            t0 = time.perf_counter()
            if uniform:
                action = acting.random_actions(n, self.rng)
                logp, value = np.zeros(n, np.float32), np.zeros(n, np.float32)
            else:
                action, logp, value = acting(self.obs, acting.noise(n, self.rng))
            env_action = acting.to_env(action)
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, info = envs.step(env_action)
            t2 = time.perf_counter()
            out["obs"][t], out["logp"][t], out["value"][t] = self.obs, logp, value
            out["action"][t] = env_action if self.off_policy else action
            out["reward"][t], out["terminated"][t], out["truncated"][t] = reward, terminated, truncated
            out["version"][t] = acting.updates
            done = terminated | truncated
            if self.off_policy:
                real_next = out["next_obs"][t]
                real_next[:] = next_obs
                for i in np.flatnonzero(done):  # SAME_STEP autoreset: next_obs starts the next episode
                    real_next[i] = info["final_obs"][i]
            else:
                final_value = out["final_value"][t]
                final_value[:] = 0.0
                cut = truncated & ~terminated
                if cut.any() and not uniform:
                    # Time-limit truncation is not a terminal state: the learner bootstraps from it.
                    final = np.stack(info["final_obs"][cut])
                    final_value[cut] = acting(final, acting.noise(len(final), None)).value
            self.ep_return += reward
            self.ep_length += 1
            if self.game_episodes:
                for score, length in finished_games(info):
                    returns.append(score)
                    lengths.append(length)
            else:
                for i in np.flatnonzero(done):
                    returns.append(float(self.ep_return[i]))
                    lengths.append(int(self.ep_length[i]))
            self.ep_return[done], self.ep_length[done] = 0.0, 0
            acting.episodes_ended(done)
            self.obs = next_obs
            t3 = time.perf_counter()
            act_s += (t1 - t0) + (t3 - t2)
            env_s += t2 - t1
        out["last_obs"][:] = self.obs
        if not self.off_policy:
            out["last_value"][:] = acting(self.obs, acting.noise(n, None)).value
        return returns, lengths, env_s, act_s


class ActorError(RlstackError, RuntimeError):
    """An actor failed, stopped answering, or could not be started (its backend says why; a
    failure inside an actor carries its traceback)."""


@dataclass(frozen=True)
class ActorSpec:
    """Everything an actor (a collector in another process) needs; picklable."""

    env_id: str
    n_envs: int
    steps: int
    """Vector steps per trajectory chunk (the algorithm's `chunk_steps`)."""
    policy_dir: str
    """The run's `policy/` directory: every version published to its LATEST is swapped in."""
    bootstrap: str
    """A version directory to start from before anything is published."""
    seed: int = 0
    vector: str = "sync"
    vectorization: str = "auto"
    """`env.vectorization` (rlstack.envs.make_vector_env)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    env_imports: tuple[str, ...] = ()
    """`env.imports`: modules the actor imports before it makes its envs."""
    env_wrappers: tuple[str, ...] = ()
    """`env.wrappers`: `module:Callable` entries applied to every one of the actor's envs."""
    device: str = "cpu"
    fusion: str = "auto"
    off_policy: bool = False
    """Ship the env's actions and real next observations (see `Collector`)."""
    poll_seconds: float = 0.5
    """How often LATEST is checked."""
    selfplay: dict[str, Any] | None = None
    """A self-play env's opponent pool settings (`rlstack.envs.selfplay.pool_settings`): the
    actor's pool then plays the members the learner's pool names with each chunk."""


class RunningMeanStd:
    """Running mean/variance of observations (parallel update of Chan et al.), as SB3's; the
    learner updates it from every chunk and copies it into the network's in-graph normaliser."""

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


class RewardScaler:
    """Reward scaling for the learner as Stable-Baselines3's `VecNormalize(norm_reward=True)`: a
    running discounted return per env (reset at episode ends), its running variance (updated
    every step), and each reward divided by that std and clipped to [-clip, clip]. The episode
    returns logged stay the env's own. Returns are kept per chunk source (`Trajectory.actor`).
    A checkpoint extra: `save` / `load` keep it across a resume."""

    EPSILON = 1e-8

    def __init__(self, gamma: float, clip: float):
        self.gamma, self.clip = gamma, clip
        self.rms = RunningMeanStd(())
        self.returns: dict[int, np.ndarray] = {}

    def __call__(self, traj: Trajectory) -> Trajectory:
        """`traj` with its rewards scaled (float32); the statistics updated by its steps."""
        returns = self.returns.setdefault(traj.actor, np.zeros(traj.reward.shape[1]))
        done = traj.terminated | traj.truncated
        scaled = np.empty(traj.reward.shape, np.float32)
        for t, reward in enumerate(traj.reward):
            returns[:] = returns * self.gamma + reward
            self.rms.update(returns)
            scaled[t] = np.clip(reward / np.sqrt(self.rms.var + self.EPSILON), -self.clip, self.clip)
            returns[done[t]] = 0.0
        return traj._replace(reward=scaled)

    def save(self, path: Path) -> None:
        state = {"rms": self.rms.state(), "returns": {str(k): v.tolist() for k, v in self.returns.items()}}
        path.write_text(json.dumps(state))

    def load(self, path: Path) -> None:
        state = json.loads(path.read_text())
        self.rms.load(state["rms"])
        self.returns = {int(k): np.asarray(v, np.float64) for k, v in state["returns"].items()}


class LocalSource(ChunkSource):
    """Chunks collected in the learner's own process (`actors: 0`), one `get()` at a time.

    `explore(t)` is the collector's per-step hook (see `Collector.collect`). `remaining()` (vector steps left, optional) cuts the last chunk
    short, so an off-policy run stops at `total_steps` as a per-step loop would.
    """

    def __init__(self, collector: Collector, specs: tuple[ArraySpec, ...], explore: Callable[[int], bool],
                 remaining: Callable[[], int] | None = None):
        self.collector, self.explore, self.remaining = collector, explore, remaining
        self.arrays = allocate(specs)
        self.steps = specs[0].shape[0]

    def get(self) -> Trajectory:
        """The next chunk (its arrays are reused by the next `get`: consume it first)."""
        steps = self.steps if self.remaining is None else min(self.steps, max(1, self.remaining()))
        arrays = self.arrays if steps == self.steps else {
            k: v if k in ("last_obs", "last_value") else v[:steps] for k, v in self.arrays.items()}
        returns, lengths, env_s, act_s = self.collector.collect(arrays, self.explore)
        return Trajectory.of(arrays, returns, lengths, -1, env_s, act_s)

    def publish(self) -> None:
        """Nothing to send: the in-process acting refreshes from the live network itself."""

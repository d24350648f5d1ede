"""The actor stage: runs the exported policy graph against vector envs and hands tagged transitions to the learner.

Rollouts are collected by the *exported* graph (`policy.mindir` through `nn.GraphCell`, as
loaded by `rlstack.load_policy`), never by a second Python-side copy of the network:

- `GraphActing` is the trainer's acting interface (`__call__(obs, noise) -> (action, logp,
  value)`, `noise(batch, rng | None)`, `to_env(action)`) over a loaded `Policy`. Its weights are
  refreshed in place (the graph's Parameters get the learner's values) instead of exporting and
  compiling a new graph every update: measured here (PPO CartPole net, `python -m rlstack.bench
  actors`), an export costs 15-70 ms and loading plus compiling the new GraphCell 0.2-0.5 s, an
  in-place refresh 0.4-0.8 ms. `version` is the number of learner updates behind the weights it
  runs; every transition is tagged with it.
- `PolicyWatcher` follows `<run>/policy/LATEST` and loads each newly published version.
- `actors: N` starts an `ActorPool`: N processes, each stepping its own vector env with its own
  `GraphActing`, reading fresh weights from a shared-memory `WeightBoard` (learner -> actors)
  and swapping in every version published to LATEST, and writing `Trajectory` chunks into
  shared-memory slots the learner copies out (`serving/shm.py`).

This module knows nothing about algorithms: PPO and the off-policy learners read the same
`Trajectory` (DESIGN: serving/ imports rlstack/ only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from rlstack.artifact import ArtifactError, Policy, load_policy
from rlstack.parity import RecentObs
from rlstack.serving.shm import ArraySpec, SharedArrays, WeightBoard

Layout = tuple[tuple[str, tuple[int, ...]], ...]


class ActorError(RuntimeError):
    """An actor process failed or stopped answering; the message carries its traceback."""


def policy_version(policy: Policy) -> int:
    """The weights' version: learner updates recorded by the trainer in the manifest
    (`updates`), or the version directory's number for artifacts made elsewhere."""
    updates = policy.manifest.get("updates")
    return int(updates) if updates is not None else int(policy.version[1:])


class GraphActing:
    """The acting interface over an exported graph: numpy in, numpy out, one graph call per batch.

    `follow(network, key)` makes it track a live network in the same process: before a call,
    when `key()` (whose first item is the learner's update count) has changed since the last
    refresh, the graph's Parameters get the live values (only the non-trainable ones, e.g.
    DQN's epsilon, when just the rest of the key changed). Nothing else about the graph
    changes: the computation is the exported MindIR.
    """

    def __init__(self, policy: Policy, version: int | None = None, recent: RecentObs | None = None):
        self.policy = policy
        self.version = policy_version(policy) if version is None else version
        self.recent = recent if recent is not None else RecentObs(0)
        self.refreshes = 0
        space = policy.manifest["action_space"]
        self.box = space["type"] == "Box"
        if self.box:
            self.low = np.asarray(space["low"], np.float32).reshape(space["shape"])
            self.high = np.asarray(space["high"], np.float32).reshape(space["shape"])
        self.noise_dim = int(policy.manifest["noise"]["dim"])
        self._params = dict(policy.graph.parameters_and_names())
        self._source: Any = None
        self._key: Callable[[], tuple] | None = None
        self._seen: tuple | None = None
        self._light: Layout = ()

    @property
    def layout(self) -> Layout:
        """(name, shape) of every parameter of the graph, in a fixed order."""
        return tuple((name, tuple(int(d) for d in p.shape)) for name, p in sorted(self._params.items()))

    def __call__(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._key is not None:
            seen = self._key()
            if seen != self._seen:
                if self._seen is not None and seen[0] == self._seen[0]:
                    self._load(weights_of(self._source, self._light))
                else:
                    self.sync_from(self._source, int(seen[0]))
                self._seen = seen
        obs = np.ascontiguousarray(obs, np.float32)
        self.recent.add(obs)
        result = self.policy.run(obs, np.ascontiguousarray(noise, np.float32))
        return result.action, result.logp, result.value

    def noise(self, batch: int, rng: np.random.Generator | None) -> np.ndarray:
        """Sampling noise, or zeros (the deterministic action) when rng is None."""
        if rng is None:
            return np.zeros((batch, self.noise_dim), np.float32)
        return self.policy.noise(batch, False, rng)

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """The action the env receives: Gaussian samples are clipped to the Box (as SB3)."""
        return np.clip(action, self.low, self.high) if self.box else action

    # ----- weights ----------------------------------------------------------------------------

    def load_weights(self, weights: dict[str, np.ndarray], version: int) -> None:
        """Overwrite the graph's parameters (copies; every parameter of `layout` must be given)."""
        missing = sorted(set(self._params) - set(weights))
        if missing:
            raise ArtifactError(f"weights for the acting graph lack {', '.join(missing[:5])}")
        self._load(weights)
        self.version = version
        self.refreshes += 1

    def _load(self, weights: dict[str, np.ndarray]) -> None:
        from mindspore import Tensor  # MindSpore is loaded by then (the Policy holds a graph)

        for name, value in weights.items():
            param = self._params[name]
            value = np.array(value, np.float32)  # a private copy: the graph must not alias it
            if value.shape != tuple(param.shape):
                raise ArtifactError(f"weight '{name}' has shape {value.shape}, the graph expects {tuple(param.shape)}")
            param.set_data(Tensor(value))

    def sync_from(self, network: Any, version: int) -> None:
        """Copy the live network's values of the graph's parameters (same names as exported)."""
        self.load_weights(weights_of(network, self.layout), version)

    def follow(self, network: Any, key: Callable[[], tuple]) -> None:
        """Refresh from `network` whenever `key()` changes (checked before each call)."""
        self._source, self._key, self._seen = network, key, None
        frozen = {p.name for p in network.get_parameters() if not p.requires_grad}
        self._light = tuple((name, shape) for name, shape in self.layout if name in frozen)

    def swap(self, policy: Policy) -> None:
        """Run another version's graph from now on (its own weights and version)."""
        self.policy = policy
        self._params = dict(policy.graph.parameters_and_names())
        self.version = policy_version(policy)
        self._seen = None


def weights_of(network: Any, layout: Layout) -> dict[str, np.ndarray]:
    """The live network's values of the named parameters (numpy copies)."""
    live = {p.name: p for p in network.get_parameters()}
    missing = [name for name, _ in layout if name not in live]
    if missing:
        raise ArtifactError(f"the live network has no parameter {', '.join(missing[:5])} of the acting graph")
    return {name: live[name].asnumpy().copy() for name, _ in layout}


class PolicyWatcher:
    """Follows `<policy_dir>/LATEST`: `poll()` loads a newly published version, else returns None.

    Publishing is atomic (a version directory appears whole, LATEST is replaced), and
    `load_policy` follows LATEST again when the version it read is pruned while loading, so a
    poll never sees a half-written version; a poll that loses a race returns None and the next
    one succeeds.
    """

    def __init__(self, policy_dir: str | Path, *, obs_shape: tuple[int, ...] | None = None,
                 device: str | None = None, fusion: bool | None = None):
        self.policy_dir = Path(policy_dir)
        self.obs_shape, self.device, self.fusion = obs_shape, device, fusion
        self.current: str | None = None
        self.loads = 0

    def latest_name(self) -> str | None:
        try:
            return (self.policy_dir / "LATEST").read_text().strip() or None
        except FileNotFoundError:
            return None

    def poll(self) -> Policy | None:
        name = self.latest_name()
        if name is None or name == self.current:
            return None
        policy = load_policy(self.policy_dir, obs_shape=self.obs_shape, device=self.device, fusion=self.fusion)
        self.current = policy.version
        self.loads += 1
        return policy


# ----- trajectories ----------------------------------------------------------------------------


class Trajectory(NamedTuple):
    """`steps` vector steps of one actor ([T, N] = [steps, n_envs]), as the learner receives them."""

    obs: np.ndarray  # [T, N, *obs_shape] float32, what the policy saw
    action: np.ndarray  # [T, N] int32 or [T, N, d] float32, the raw graph output (logp refers to it)
    logp: np.ndarray  # [T, N] behaviour log-probability (0 for uniform exploration)
    value: np.ndarray  # [T, N] the graph's value output
    reward: np.ndarray  # [T, N] float32
    terminated: np.ndarray  # [T, N] bool
    truncated: np.ndarray  # [T, N] bool
    final_value: np.ndarray  # [T, N] value of info["final_obs"] where truncated and not terminated, else 0
    next_obs: np.ndarray | None  # [T, N, *obs_shape] the real next obs (final_obs at episode ends)
    version: np.ndarray  # [T] int64 weights version (learner updates) that chose each step's actions
    last_obs: np.ndarray  # [N, *obs_shape] obs after the last step
    last_value: np.ndarray  # [N] value of last_obs (for GAE)
    episode_returns: np.ndarray  # returns of the episodes that ended in this chunk
    episode_lengths: np.ndarray
    actor: int
    env_seconds: float
    act_seconds: float


def trajectory_specs(steps: int, n_envs: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                     action_dtype: str, next_obs: bool) -> tuple[ArraySpec, ...]:
    t, n = steps, n_envs
    specs = [ArraySpec("obs", (t, n, *obs_shape), "float32"),
             ArraySpec("action", (t, n, *action_shape), action_dtype),
             ArraySpec("logp", (t, n), "float32"), ArraySpec("value", (t, n), "float32"),
             ArraySpec("reward", (t, n), "float32"), ArraySpec("terminated", (t, n), "bool"),
             ArraySpec("truncated", (t, n), "bool"), ArraySpec("final_value", (t, n), "float32"),
             ArraySpec("version", (t,), "int64"), ArraySpec("last_obs", (n, *obs_shape), "float32"),
             ArraySpec("last_value", (n,), "float32")]
    if next_obs:
        specs.append(ArraySpec("next_obs", (t, n, *obs_shape), "float32"))
    return tuple(specs)


@dataclass(frozen=True)
class ActorSpec:
    """Everything an actor process needs (picklable: spawned processes receive it)."""

    env_id: str
    n_envs: int
    steps: int
    """Vector steps per trajectory chunk (PPO: train.n_steps; off-policy: train.train_freq)."""
    policy_dir: str
    """The run's `policy/` directory: every version published to its LATEST is swapped in."""
    bootstrap: str
    """A version directory to start from before anything is published."""
    seed: int = 0
    vector: str = "sync"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    fusion: str = "auto"
    next_obs: bool = False
    """Ship the real next observation (off-policy learners store it)."""
    poll_seconds: float = 0.5
    """How often LATEST is checked."""


def uniform_actions(manifest: dict[str, Any], n: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random actions of the policy's action space (off-policy warm-up)."""
    space = manifest["action_space"]
    if space["type"] == "Discrete":
        return rng.integers(0, int(space["n"]), n).astype(np.int32)
    low = np.asarray(space["low"], np.float32).reshape(space["shape"])
    high = np.asarray(space["high"], np.float32).reshape(space["shape"])
    return rng.uniform(low, high, (n, *low.shape)).astype(np.float32)


class Collector:
    """Steps a vector env with a `GraphActing`, filling trajectory arrays (inside an actor process)."""

    def __init__(self, envs: gym.vector.VectorEnv, acting: GraphActing, seed: int):
        mode = envs.metadata.get("autoreset_mode")
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            # The chunk format needs info["final_obs"] at episode ends, with no dead step after.
            raise ValueError(f"an actor needs a vector env with SAME_STEP autoreset, got {mode} "
                             "(build it with rlstack.envs.make_vector_env)")
        self.envs, self.acting = envs, acting
        self.rng = np.random.default_rng(seed)
        self.obs, _ = envs.reset(seed=seed)
        n = envs.num_envs
        self.ep_return, self.ep_length = np.zeros(n), np.zeros(n, np.int64)

    def collect(self, out: dict[str, np.ndarray], refresh: Callable[[], bool]) -> tuple[list, list, float, float]:
        """Fill `out` (the `trajectory_specs` arrays); `refresh()` runs before each step and
        returns True while actions should be uniformly random. Returns finished episodes'
        (returns, lengths) and the seconds spent in the env and in the graph."""
        acting, envs, n = self.acting, self.envs, self.envs.num_envs
        returns, lengths, env_s, act_s = [], [], 0.0, 0.0
        for t in range(out["reward"].shape[0]):
            explore = refresh()
            t0 = time.perf_counter()
            if explore:
                action = uniform_actions(acting.policy.manifest, n, self.rng)
                logp, value = np.zeros(n, np.float32), np.zeros(n, np.float32)
            else:
                action, logp, value = acting(self.obs, acting.noise(n, self.rng))
            t1 = time.perf_counter()
            next_obs, reward, terminated, truncated, info = envs.step(acting.to_env(action))
            t2 = time.perf_counter()
            out["obs"][t], out["action"][t], out["logp"][t], out["value"][t] = self.obs, action, logp, value
            out["reward"][t], out["terminated"][t], out["truncated"][t] = reward, terminated, truncated
            out["version"][t] = acting.version
            done = terminated | truncated
            final_value = np.zeros(n, np.float32)
            cut = truncated & ~terminated
            if cut.any() and not explore:
                # Time-limit truncation is not a terminal state: the learner bootstraps from it.
                final = np.stack(info["final_obs"][cut]).astype(np.float32)
                final_value[cut] = acting(final, acting.noise(len(final), None))[2]
            out["final_value"][t] = final_value
            if "next_obs" in out:
                real_next = next_obs.copy()
                for i in np.flatnonzero(done):
                    real_next[i] = info["final_obs"][i]
                out["next_obs"][t] = real_next
            self.ep_return += reward
            self.ep_length += 1
            for i in np.flatnonzero(done):
                returns.append(float(self.ep_return[i]))
                lengths.append(int(self.ep_length[i]))
            self.ep_return[done], self.ep_length[done] = 0.0, 0
            self.obs = next_obs
            t3 = time.perf_counter()
            act_s += (t1 - t0) + (t3 - t2)
            env_s += t2 - t1
        out["last_obs"][:] = self.obs
        out["last_value"][:] = acting(self.obs, acting.noise(n, None))[2]
        return returns, lengths, env_s, act_s


class _Ready(NamedTuple):
    actor: int
    slot: int
    returns: list
    lengths: list
    env_seconds: float
    act_seconds: float


class _Failed(NamedTuple):
    actor: int
    error: str


def _actor_main(index: int, spec: ActorSpec, layout: Layout, board_name: str, lock: Any,
                slot_names: list[str], slot_specs: tuple[ArraySpec, ...], free: Any, ready: Any, stop: Any) -> None:
    """Entry point of one actor process (spawned: MindSpore is set up afresh here)."""
    try:
        from rlstack.envs import make_vector_env
        from rlstack.runtime import configure

        runtime = configure(spec.device, spec.fusion)
        envs = make_vector_env(spec.env_id, spec.n_envs, spec.vector, spec.env_kwargs)
        obs_shape = tuple(envs.single_observation_space.shape)
        watcher = PolicyWatcher(spec.policy_dir, obs_shape=obs_shape, device=runtime.device, fusion=runtime.fusion)
        policy = watcher.poll() or load_policy(spec.bootstrap, obs_shape=obs_shape, device=runtime.device,
                                               fusion=runtime.fusion)
        acting = GraphActing(policy)
        board = WeightBoard(layout, lock, board_name)
        slots = [SharedArrays(slot_specs, name) for name in slot_names]
        collector = Collector(envs, acting, spec.seed)
        state = {"next_poll": time.monotonic() + spec.poll_seconds, "seq": 0}

        def refresh() -> bool:
            if time.monotonic() >= state["next_poll"]:
                state["next_poll"] = time.monotonic() + spec.poll_seconds
                with contextlib.suppress(ArtifactError):  # lost a race with pruning: next poll
                    newer = watcher.poll()
                    if newer is not None:
                        acting.swap(newer)
            # New weights on the board, or a published version older than the board's swapped in.
            if board.seq != state["seq"] or board.version > acting.version:
                state["seq"], version, weights = board.read()
                acting.load_weights(weights, version)
            return board.explore

        while not stop.is_set():
            try:
                slot = free.get(timeout=0.1)
            except queue.Empty:
                continue
            returns, lengths, env_s, act_s = collector.collect(slots[slot].arrays, refresh)
            ready.put(_Ready(index, slot, returns, lengths, env_s, act_s))
        envs.close()
    except BaseException:  # reported to the learner, which raises ActorError with it
        ready.put(_Failed(index, traceback.format_exc()))


class ActorPool:
    """N actor processes streaming `Trajectory` chunks to the learner through shared memory.

    Each actor owns `slots` chunk buffers; it fills a free one and posts a notice, the learner
    copies the chunk out and frees the slot at once, so an actor is at most `slots` chunks ahead
    of the learner (that bounds staleness). Use as a context manager; `close()` stops and joins
    the processes and removes the shared memory.
    """

    def __init__(self, spec: ActorSpec, n_actors: int, layout: Layout, obs_shape: tuple[int, ...],
                 action_shape: tuple[int, ...], action_dtype: str, slots: int = 1):
        if n_actors < 1:
            raise ValueError(f"an actor pool needs n_actors >= 1, got {n_actors}")
        self.spec, self.n_actors = spec, n_actors
        ctx = mp.get_context("spawn")  # MindSpore's threads make fork unsafe
        self.lock = ctx.Lock()
        self.board = WeightBoard(layout, self.lock, create=True)
        self.slot_specs = trajectory_specs(spec.steps, spec.n_envs, obs_shape, action_shape, action_dtype,
                                           spec.next_obs)
        self.slots = [[SharedArrays(self.slot_specs, create=True) for _ in range(slots)] for _ in range(n_actors)]
        self.free = [ctx.Queue() for _ in range(n_actors)]
        self.ready = ctx.Queue()
        self.stop = ctx.Event()
        for q, own in zip(self.free, self.slots, strict=True):
            for i in range(len(own)):
                q.put(i)
        self.processes = [
            ctx.Process(target=_actor_main, name=f"rlstack-actor-{i}", daemon=True,
                        args=(i, _actor_spec(spec, i), layout, self.board.name, self.lock,
                              [s.name for s in self.slots[i]], self.slot_specs, self.free[i], self.ready, self.stop))
            for i in range(n_actors)]
        self.started = False

    def start(self, weights: dict[str, np.ndarray], version: int, explore: bool = False) -> None:
        self.publish(weights, version, explore)
        for p in self.processes:
            p.start()
        self.started = True

    def publish(self, weights: dict[str, np.ndarray], version: int, explore: bool = False) -> None:
        """Make `weights` (version = learner updates) the actors' weights from their next step."""
        self.board.publish(weights, version, explore)

    def get(self, timeout: float = 600.0) -> Trajectory:
        """The next finished chunk from any actor (copied out; its slot is free again)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                notice = self.ready.get(timeout=0.2)
                break
            except queue.Empty:
                dead = [p for p in self.processes if p.exitcode is not None]
                if dead:
                    raise ActorError(f"actor process {dead[0].name} exited with code {dead[0].exitcode} before "
                                     "reporting (its stderr says why; a script that trains with actors must "
                                     "guard its entry point with `if __name__ == '__main__':`, as every "
                                     "multiprocessing 'spawn' program must)") from None
                if time.monotonic() > deadline:
                    raise ActorError(f"no trajectory from {self.n_actors} actor(s) in {timeout:.0f} s") from None
        if isinstance(notice, _Failed):
            raise ActorError(f"actor {notice.actor} failed:\n{notice.error}")
        arrays = self.slots[notice.actor][notice.slot].copy()
        self.free[notice.actor].put(notice.slot)
        return Trajectory(
            obs=arrays["obs"], action=arrays["action"], logp=arrays["logp"], value=arrays["value"],
            reward=arrays["reward"], terminated=arrays["terminated"], truncated=arrays["truncated"],
            final_value=arrays["final_value"], next_obs=arrays.get("next_obs"), version=arrays["version"],
            last_obs=arrays["last_obs"], last_value=arrays["last_value"],
            episode_returns=np.asarray(notice.returns, np.float64), episode_lengths=np.asarray(notice.lengths, np.int64),
            actor=notice.actor, env_seconds=notice.env_seconds, act_seconds=notice.act_seconds)

    def close(self, timeout: float = 10.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for p in self.processes if self.started else []:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(1.0)
        for q in (*self.free, self.ready):
            q.cancel_join_thread()
            q.close()
        for own in self.slots:
            for s in own:
                s.close()
        self.board.close()

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _actor_spec(spec: ActorSpec, index: int) -> ActorSpec:
    """Actor i's own seed (envs and noise), far from the learner's and the other actors'."""
    return dataclasses.replace(spec, seed=spec.seed + 10_007 * (index + 1))

"""The Ray actor backend (`actors: N`, `actors_backend: ray`): N Ray actors, each running the
collector with the exported graph, on this machine or across a Ray cluster.

What the process backend (`serving/actor.py`) passes through shared memory and the run
directory travels through Ray's object store here, so no node needs the learner's disk:

- the exported graph: the bootstrap version's files as bytes (`rlstack.artifact.version_files`),
  put into the object store once; each actor writes them to a local temporary directory and
  loads them with `rlstack.acting.load_policy`, which verifies the sha256 the manifest records;
- the weights: every `publish` puts the learner's acting weights (one flat float32 vector in
  the graph's layout order) into the object store once; each collect call carries the newest
  reference and an actor loads them when the publish count changed, so it picks up the newest
  weights between chunks;
- the chunks: an actor's `collect` returns the `Trajectory` arrays; the learner keeps one call in
  flight per actor (as the process backend's one slot), so a chunk is at most one publish staler
  than the weights the call carried.

Faults: an actor whose process dies is restarted by Ray (`ray.max_restarts`). A call it was
running fails and its chunk is lost, never retried (`max_task_retries=0`: a retried call would
deliver a chunk twice if the first one had reached the learner); the learner sends the restarted
actor its next call. A chunk the actor had finished before it died is still delivered (Ray keeps
a call's result with the learner, its owner). Every chunk names the process that collected it, so
the learner counts a restart (`actors/restarts`) and logs it when an actor's process changes,
whether or not the death cost a chunk (`actors/failed_calls` counts the calls that failed). An
exception inside `collect` (a broken env, a refused graph) stops training with the actor's
traceback, as with the process backend.

Ray is imported only here: the core finds this backend by name (`rlstack.registry.actor_backend`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from rlstack.acting import FlatWeights
from rlstack.collector import ActorError, ActorSpec, ArraySpec, Collector, Trajectory, allocate
from rlstack.envs.players import load_player
from rlstack.envs.selfplay import follower_pool
from rlstack.registry import ChunkSource
from rlstack.serving import ray_cluster
from rlstack.serving.actor import actor_spec


def _ray(address: str | None) -> Any:
    """`ray`, imported after `ray_cluster.prepare` (a cluster on this machine stays on loopback)."""
    if "ray" not in sys.modules:
        ray_cluster.prepare(address)
    try:
        import ray
    except ImportError:
        raise ActorError(f"actors_backend: ray needs Ray, which is not installed: {ray_cluster.INSTALL} "
                         "(or use actors_backend: process)") from None
    return ray


def connect(address: str | None) -> Any:
    """Ray, initialised in this process: joined to the cluster at `address` (`auto`, `host:port`),
    or a new instance on this machine bound to 127.0.0.1 when `address` is None (a new one even
    when `$RAY_ADDRESS` or a `ray start` cluster exists, which `ray.init()` would join). A process
    that has already initialised Ray (a notebook, a test's cluster) keeps its connection."""
    ray = _ray(address)
    if ray.is_initialized():
        return ray
    unreachable = ray_cluster.unreachable(address)
    if unreachable:
        raise ActorError(f"could not reach the Ray cluster at ray.address={address!r}: {unreachable}. "
                         f"{START_CLUSTER}")
    try:
        if address is None:
            ray.init(address="local", include_dashboard=False, configure_logging=False)
        else:
            ray.init(address=address, configure_logging=False)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as err:
        where = "a local Ray instance" if address is None else f"the Ray cluster at ray.address={address!r}"
        raise ActorError(f"could not start or reach {where}: {err}. {START_CLUSTER}") from None
    return ray


START_CLUSTER = ("Start the cluster first (`ray start --head` on its head node) and set ray.address to its "
                 "address (host:port, or auto on a node of the cluster); leave ray.address unset to run Ray "
                 "on this machine only")

RESTART_TIMEOUT_S = 300.0
"""How long an actor may stay down (Ray restarting it) before training stops."""

RETRY_S = 0.5
"""Pause before calling an actor again that refused a call while restarting."""


class _Collector:
    """One Ray actor: a vector env, the exported graph loaded from bytes, and the collector."""

    def __init__(self, spec: ActorSpec, graph_files: dict[str, bytes], layout: tuple, chunk_specs: tuple):
        import ray

        from rlstack.acting import load_policy
        from rlstack.artifact import write_version
        from rlstack.envs import make_vector_env
        from rlstack.runtime import configure

        context = ray.get_runtime_context()
        self.node_id, self.pid = context.get_node_id(), os.getpid()
        with warnings.catch_warnings():  # the property reads a deprecated attribute inside Ray
            warnings.simplefilter("ignore")
            restarted = context.was_current_actor_reconstructed
        # A restarted actor plays new episodes, not a replay of its first life's.
        self.seed = int(np.random.SeedSequence().entropy % (1 << 31)) if restarted else spec.seed
        runtime = configure(spec.device, spec.fusion)
        self._dir = tempfile.TemporaryDirectory(prefix="rlstack-actor-")
        version = write_version(graph_files, Path(self._dir.name) / "policy")
        self.envs = make_vector_env(spec.env_id, spec.n_envs, spec.vector, spec.env_kwargs, spec.vectorization,
                                    imports=spec.env_imports, wrappers=spec.env_wrappers)
        self.acting = load_policy(version, obs_shape=tuple(self.envs.single_observation_space.shape),
                                  device=runtime.device, fusion=runtime.fusion)
        self.spec, self.collector = spec, None
        self.pool = follower_pool(self.envs, spec.selfplay)  # self-play: the learner names the opponents
        self._opponent_loads = 0
        self.flat = FlatWeights(layout)
        self.arrays = allocate(chunk_specs)
        self.seq = -1

    def where(self) -> tuple[str, int]:
        """(Ray node id, process id) of this actor."""
        return self.node_id, self.pid

    def collect(self, seq: int, published: tuple[np.ndarray, int, bool], opponents: dict | None = None) -> tuple:
        """One chunk with the weights of publish `seq` (loaded if they are new to this actor), and
        the id of the process that collected it. `opponents` (self-play): the learner pool's
        members, name -> object-store reference of the version's files (None for `random`)."""
        if self.pool is not None and opponents is not None:
            self.pool.follow(list(opponents), lambda name: self._opponent(name, opponents[name]))
        if self.collector is None:
            self.collector = Collector(self.envs, self.acting, self.seed, off_policy=self.spec.off_policy)
        flat, version, explore = published
        if seq != self.seq:
            self.acting.load_weights(self.flat.unpack(flat), version)
            self.seq = seq
        returns, lengths, env_s, act_s = self.collector.collect(self.arrays, lambda t: explore)
        record = self.pool.take_record() if self.pool is not None else None
        return self.pid, self.arrays, returns, lengths, env_s, act_s, record

    def _opponent(self, name: str, files_ref: Any) -> Any:
        """An exported version the learner's pool holds, from its files in the object store."""
        import ray

        from rlstack.artifact import write_version

        self._opponent_loads += 1  # a name may come back after it left the pool: a new directory
        version = write_version(ray.get(files_ref), Path(self._dir.name) / "opponents" / f"{name}.{self._opponent_loads}")
        return load_player(version, self.envs.game, self.pool.settings.sample)


class RayActorPool(ChunkSource):
    """N Ray actors streaming `Trajectory` chunks to the learner (the process backend's interface:
    `publish`, `start`, `get`, `close`, a context manager), plus `stats()` (`actors/restarts`)
    and `pop_messages()` (what the learner should log, e.g. an actor's death)."""

    def __init__(self, spec: ActorSpec, n_actors: int, layout: tuple, chunk_specs: tuple[ArraySpec, ...], *,
                 address: str | None = None, cpus_per_actor: float = 1.0, resources: dict[str, float] | None = None,
                 max_restarts: int = 100):
        if n_actors < 1:
            raise ValueError(f"an actor pool needs n_actors >= 1, got {n_actors}")
        from rlstack.artifact import version_files

        self.spec, self.n_actors, self.max_restarts = spec, n_actors, max_restarts
        self.flat = FlatWeights(layout)
        self.layout = self.flat.layout
        self.chunk_specs = chunk_specs
        files = version_files(spec.bootstrap)  # read before Ray starts: a bad bootstrap fails fast
        self.ray = connect(address)
        ray = self.ray
        self._files = ray.put(files)
        remote = ray.remote(max_restarts=max_restarts, max_task_retries=0)(_Collector)
        options = {"num_cpus": cpus_per_actor, "resources": dict(resources or {})}
        self.actors = [remote.options(name=None, **options).remote(actor_spec(spec, i), self._files, self.layout,
                                                                      chunk_specs)
                       for i in range(n_actors)]
        self._inflight: dict[Any, int] = {}
        self._published: Any = None
        self._opponents: dict[str, Any] | None = None
        self._versions: dict[str, Any] = {}
        """Self-play: object-store references of the opponent versions' files, by name."""
        self.seq = 0
        self.restarts = [0] * n_actors
        self._pids: list[int | None] = [None] * n_actors
        self._down_since: list[float | None] = [None] * n_actors
        self.failed_calls = 0
        self.chunks = 0
        self._messages: list[str] = []
        self.placement: list[tuple[str, int]] = []
        """(Ray node id, process id) of each actor, read when the pool starts."""
        self.started = False

    # ----- the learner's side -------------------------------------------------------------------

    def publish(self, weights: dict[str, np.ndarray], updates: int, explore: bool = False,
                opponents: list[str] | None = None) -> None:
        """Put `weights` (of learner update `updates`) into the object store once; every call sent
        from now on carries them. `explore`: uniformly random actions (off-policy warm-up).
        `opponents` (self-play): the learner pool's members; each exported version's files go
        into the object store once, and the actors' pools play those members from their next call."""
        if opponents is not None:
            from rlstack.artifact import version_files

            refs = {}
            for name in opponents:
                if name != "random" and name not in self._versions:
                    self._versions[name] = self.ray.put(version_files(Path(self.spec.policy_dir) / name))
                refs[name] = self._versions.get(name)
            self._versions = {name: ref for name, ref in self._versions.items() if name in refs}
            self._opponents = refs
        self._published = self.ray.put((self.flat.pack(weights), int(updates), bool(explore)))
        self.seq += 1

    def start(self) -> None:
        """Send every actor its first call (publish the first weights before)."""
        if self._published is None:
            raise RuntimeError("publish weights before starting the actors")
        for i in range(self.n_actors):
            self._send(i)
        self.started = True
        addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in self.ray.nodes()}
        self.placement = self.where()
        self._messages.append("ray actors: " + ", ".join(
            f"{i} on node {node[:12]} ({addresses.get(node, '?')}) pid {pid}"
            for i, (node, pid) in enumerate(self.placement)))

    def _send(self, actor: int) -> None:
        self._inflight[self.actors[actor].collect.remote(self.seq, self._published, self._opponents)] = actor

    def get(self, timeout: float = 600.0) -> Trajectory:
        """The next finished chunk from any actor; that actor is sent its next call at once."""
        ray = self.ray
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=max(0.0, left))
            if not ready:
                raise ActorError(f"no trajectory from {self.n_actors} Ray actor(s) in {timeout:.0f} s")
            ref = ready[0]
            actor = self._inflight.pop(ref)
            try:
                pid, arrays, returns, lengths, env_s, act_s, record = ray.get(ref)
            except ray.exceptions.ActorDiedError as err:  # dead for good: out of restarts
                raise ActorError(f"Ray actor {actor} is dead and Ray will not restart it (ray.max_restarts="
                                 f"{self.max_restarts}, {sum(self.restarts)} restart(s) seen): {err}") from None
            except ray.exceptions.RayActorError as err:  # its process died: Ray is restarting it
                self._down(actor, err)
                self._send(actor)
                continue
            except ray.exceptions.RayTaskError as err:  # collect raised: stop with its traceback
                raise ActorError(f"actor {actor} failed:\n{err}") from None
            self._send(actor)
            self._check_process(actor, pid)
            self.chunks += 1
            arrays = {k: np.array(v) for k, v in arrays.items()}  # writable copies out of the object store
            return Trajectory.of(arrays, returns, lengths, actor, env_s, act_s, record)

    def _down(self, actor: int, err: Exception) -> None:
        """A call failed because the actor's process died: the chunk it was collecting, if any,
        is lost; calls sent while Ray restarts the actor fail too, until it is back."""
        self.failed_calls += 1
        now = time.monotonic()
        if self._down_since[actor] is None:
            self._down_since[actor] = now
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            self._messages.append(f"actor {actor} is down ({type(err).__name__}: {first_line[:200]}); a chunk it "
                                  "was collecting is lost, Ray restarts the actor")
        elif now - self._down_since[actor] > RESTART_TIMEOUT_S:
            raise ActorError(f"Ray actor {actor} has not come back within {RESTART_TIMEOUT_S:.0f} s of its "
                             f"process dying: {type(err).__name__}: {err}")
        else:
            time.sleep(RETRY_S)  # Ray answers a call to a restarting actor at once: do not spin

    def _check_process(self, actor: int, pid: int) -> None:
        """A chunk from a new process of `actor`: Ray restarted it."""
        self._down_since[actor] = None
        before, self._pids[actor] = self._pids[actor], pid
        if before is not None and before != pid:
            self.restarts[actor] += 1
            self._messages.append(f"actor {actor} was restarted by Ray (process {before} died, now {pid}; restart "
                                  f"{self.restarts[actor]})")

    def stats(self) -> dict[str, float]:
        """`actors/...` scalars for TensorBoard and the summary."""
        return {"actors/restarts": float(sum(self.restarts)), "actors/failed_calls": float(self.failed_calls)}

    def pop_messages(self) -> list[str]:
        messages, self._messages = self._messages, []
        return messages

    def where(self, timeout: float = 120.0) -> list[tuple[str, int]]:
        """(Ray node id, process id) of every actor (tests, `bench actors`); an actor whose process
        died is asked again once Ray has restarted it (it can die while the run starts)."""
        ray, deadline = self.ray, time.monotonic() + timeout
        places = []
        for actor in self.actors:
            while True:
                try:
                    places.append(tuple(ray.get(actor.where.remote(), timeout=max(1.0, deadline - time.monotonic()))))
                    break
                except ray.exceptions.ActorDiedError:  # dead for good: no answer will come
                    raise
                except ray.exceptions.RayActorError:  # down while Ray restarts it
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        return places

    def close(self) -> None:
        """Stop the actors (a chunk in flight is dropped). Ray itself stays up: it was started for
        this process, or is a cluster others use."""
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors, self._inflight = [], {}

    def __enter__(self) -> RayActorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

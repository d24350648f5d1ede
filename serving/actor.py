"""The process actor backend (`actors: N`): N processes, each running the collector with the exported graph.

Rollouts are collected by the *exported* graph (`policy.mindir`, loaded by
`rlstack.acting.load_policy`), never by a second Python-side copy of the network. Each actor
process steps its own vector env with `rlstack.collector.Collector` (the same env loop the
learner runs in-process with `actors: 0`), reads fresh weights from a shared-memory
`WeightBoard` (learner -> actors), swaps in every version published to LATEST
(`rlstack.acting.PolicyWatcher`), and writes `Trajectory` chunks into shared-memory slots the
learner copies out (`serving/shm.py`).

The trainer finds this backend by name (`rlstack.registry.actor_backend("process")`, an entry
point in pyproject.toml), so the core never imports serving/. It knows nothing about
algorithms: PPO and the off-policy learners read the same `Trajectory`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import queue
import signal
import time
import traceback
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rlstack.acting import Layout, PolicyWatcher, load_policy
from rlstack.artifact import ArtifactError
from rlstack.collector import ActorError, ActorSpec, ArraySpec, Collector, Trajectory
from rlstack.envs.players import load_player
from rlstack.envs.selfplay import follower_pool
from rlstack.registry import ChunkSource
from rlstack.serving.shm import SharedArrays, WeightBoard


class _Ready(NamedTuple):
    actor: int
    slot: int
    returns: list
    lengths: list
    env_seconds: float
    act_seconds: float
    pool_record: dict | None


class _Failed(NamedTuple):
    actor: int
    error: str


class _Stopped(NamedTuple):
    actor: int
    signal: str


SIGNAL_GRACE_S = 30.0
"""How long an actor keeps collecting after SIGINT/SIGTERM while the learner has not stopped it."""


class _Signals:
    """SIGINT/SIGTERM in an actor process: recorded, never fatal.

    Ctrl-C, and a SIGTERM sent to the whole process group (a scheduler, systemd), reach the
    learner too; it finishes its current update, for which it may need more chunks, then stops
    the actors (`ActorPool.close`). An actor that died at once would fail that update instead.
    So an actor keeps collecting for at most `grace_s` after a signal, and then (or when the
    learner stops it, or is gone) exits 0 after the chunk in hand. SIGINT is handled like
    SIGTERM because MindSpore's runtime turns a SIGINT into SIGTERM once a graph has run (the
    actor died of it even with SIGINT ignored)."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.received: int | None = None
        self._at = 0.0
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received, self._at = signum, time.monotonic()

    @property
    def expired(self) -> bool:
        return self.received is not None and time.monotonic() - self._at >= self.grace_s

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else "no signal"


def _actor_main(index: int, spec: ActorSpec, layout: Layout, board_name: str, lock: Any,
                slot_names: list[str], slot_specs: tuple[ArraySpec, ...], free: Any, ready: Any, stop: Any,
                signal_grace_s: float = SIGNAL_GRACE_S) -> None:
    """Entry point of one actor process (spawned: MindSpore is set up afresh here)."""
    signals = _Signals(signal_grace_s)
    learner = mp.parent_process()
    try:
        from rlstack.envs import make_vector_env
        from rlstack.runtime import configure

        runtime = configure(spec.device, spec.fusion)
        envs = make_vector_env(spec.env_id, spec.n_envs, spec.vector, spec.env_kwargs, spec.vectorization,
                               imports=spec.env_imports, wrappers=spec.env_wrappers)
        obs_shape = tuple(envs.single_observation_space.shape)
        watcher = PolicyWatcher(spec.policy_dir, obs_shape=obs_shape, device=runtime.device, fusion=runtime.fusion)
        acting = watcher.poll() or load_policy(spec.bootstrap, obs_shape=obs_shape, device=runtime.device,
                                               fusion=runtime.fusion)
        board = WeightBoard(layout, lock, board_name)
        slots = [SharedArrays(slot_specs, name) for name in slot_names]
        collector = Collector(envs, acting, spec.seed, off_policy=spec.off_policy)
        pool = follower_pool(envs, spec.selfplay)  # self-play: the learner names the opponents

        def load_opponent(name: str) -> Any:
            return load_player(Path(spec.policy_dir) / name, envs.game, pool.settings.sample)
        state = {"next_poll": time.monotonic() + spec.poll_seconds, "seq": 0}

        def refresh(t: int) -> bool:
            if time.monotonic() >= state["next_poll"]:
                state["next_poll"] = time.monotonic() + spec.poll_seconds
                with contextlib.suppress(ArtifactError):  # lost a race with pruning: next poll
                    newer = watcher.poll()
                    if newer is not None:
                        acting.swap(newer)
            # New weights on the board, or a published version older than the board's swapped in.
            if board.seq != state["seq"] or board.version > acting.updates:
                state["seq"], version, weights = board.read()
                acting.load_weights(weights, version)
            return board.explore

        while not stop.is_set() and not signals.expired and (learner is None or learner.is_alive()):
            try:
                slot, opponents = free.get(timeout=0.1)
            except queue.Empty:
                continue
            if pool is not None and opponents is not None:
                with contextlib.suppress(ArtifactError):  # a version pruned meanwhile: the next chunk's names
                    pool.follow(opponents, load_opponent)
            returns, lengths, env_s, act_s = collector.collect(slots[slot].arrays, refresh)
            record = pool.take_record() if pool is not None else None
            ready.put(_Ready(index, slot, returns, lengths, env_s, act_s, record))
        envs.close()
        if signals.expired and not stop.is_set():  # tell the learner why no more chunks come
            ready.put(_Stopped(index, signals.name))
    except BaseException:  # reported to the learner, which raises ActorError with it
        ready.put(_Failed(index, traceback.format_exc()))


class ActorPool(ChunkSource):
    """N actor processes streaming `Trajectory` chunks to the learner through shared memory.

    Each actor owns `slots` chunk buffers; it fills a free one and posts a notice, the learner
    copies the chunk out and frees the slot at once, so an actor is at most `slots` chunks ahead
    of the learner (that bounds staleness). Use as a context manager; `close()` stops and joins
    the processes and removes the shared memory.
    """

    def __init__(self, spec: ActorSpec, n_actors: int, layout: Layout, chunk_specs: tuple[ArraySpec, ...],
                 slots: int = 1, signal_grace_s: float = SIGNAL_GRACE_S):
        if n_actors < 1:
            raise ValueError(f"an actor pool needs n_actors >= 1, got {n_actors}")
        self.spec, self.n_actors, self.signal_grace_s = spec, n_actors, signal_grace_s
        ctx = mp.get_context("spawn")  # MindSpore's threads make fork unsafe
        self.lock = ctx.Lock()
        self.board = WeightBoard(layout, self.lock, create=True)
        self.slot_specs = chunk_specs
        self.slots = [[SharedArrays(self.slot_specs, create=True) for _ in range(slots)] for _ in range(n_actors)]
        self.free = [ctx.Queue() for _ in range(n_actors)]
        self.ready = ctx.Queue()
        self.stop = ctx.Event()
        self.opponents: list[str] | None = None
        """Self-play: the learner pool's member names, sent with every free slot."""
        for q, own in zip(self.free, self.slots, strict=True):
            for i in range(len(own)):
                q.put((i, None))
        self.processes = [
            ctx.Process(target=_actor_main, name=f"rlstack-actor-{i}", daemon=True,
                        args=(i, actor_spec(spec, i), layout, self.board.name, self.lock,
                              [s.name for s in self.slots[i]], self.slot_specs, self.free[i], self.ready, self.stop,
                              signal_grace_s))
            for i in range(n_actors)]
        self.started = False

    def start(self) -> None:
        """Start the processes (publish the first weights before)."""
        for p in self.processes:
            p.start()
        self.started = True

    def publish(self, weights: dict[str, np.ndarray], updates: int, explore: bool = False,
                opponents: list[str] | None = None) -> None:
        """Make `weights` (of learner update `updates`) the actors' weights from their next step;
        `explore`: uniformly random actions (off-policy warm-up); `opponents`: self-play, the
        learner pool's members, which each actor's pool plays from its next chunk."""
        self.board.publish(weights, updates, explore)
        if opponents is not None:
            self.opponents = list(opponents)

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
        if isinstance(notice, _Stopped):
            raise ActorError(f"actor {notice.actor} stopped after {notice.signal}: the learner did not stop the "
                             f"actors within {self.signal_grace_s:g} s of it")
        arrays = self.slots[notice.actor][notice.slot].copy()
        self.free[notice.actor].put((notice.slot, self.opponents))
        return Trajectory.of(arrays, notice.returns, notice.lengths, notice.actor, notice.env_seconds,
                             notice.act_seconds, notice.pool_record)

    def close(self, timeout: float = 10.0) -> None:
        """Ask the actors to stop after the chunk in hand (they exit 0); kill those still running
        after `timeout` (SIGTERM would only ask them again)."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for p in self.processes if self.started else []:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
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


def actor_spec(spec: ActorSpec, index: int) -> ActorSpec:
    """Actor i's own seed (envs and noise), far from the learner's and the other actors'."""
    return dataclasses.replace(spec, seed=spec.seed + 10_007 * (index + 1))

"""Dynamic batching for the policy server (serving stage): many requests -> one graph call -> many answers.

Requests wait in a queue on the event loop; one collector task takes up to `max_batch` rows,
waiting at most `max_wait_s` after the oldest queued request arrived for others to join, and
runs the batch on a single graph thread so the event loop keeps accepting while MindSpore
computes. Each request brings its own noise rows (seeded per request), so which other requests
share its graph call never changes the noise it gets.

The policy being served is swapped between batches: a batch runs on the policy it started
with, the next one on the new policy.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rlstack.acting import Policy
from rlstack.artifact import ArtifactError
from rlstack.profiling import ProfileWindow
from rlstack.serving.metrics import ServeMetrics


class Answer(NamedTuple):
    """One request's slice of a batch: action [n] int32 or [n, d] float32, logp [n], value [n]."""

    action: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    policy_version: str


@dataclass
class _Pending:
    obs: np.ndarray  # [n, *obs_shape] float32
    noise: np.ndarray  # [n, noise_dim] float32
    future: asyncio.Future[Answer]
    enqueued: float  # loop.time()


def bucket_sizes(max_batch: int, max_rows: int) -> tuple[int, ...]:
    """Batch sizes the graph is compiled for: 1, 4, 16, 64, ... up to max(max_batch, max_rows).

    A GraphCell compiles once per input shape and dynamic batching makes every size from 1 to
    max_batch, so a batch is zero-padded up to the next bucket. A graph call costs about the same
    from 1 to 64 rows, so coarse buckets waste little and keep the compiles (at startup and at
    every reload) few. A dynamic-shape compile (`set_inputs` with None) would avoid padding but
    costs more CPU per call. Figures: docs/PERFORMANCE.md#compiled-batch-sizes.
    """
    sizes, size = [], 1
    while size < max(max_batch, max_rows):
        sizes.append(size)
        size *= 4
    sizes += [max_batch, max_rows]
    return tuple(sorted(set(sizes)))


@dataclass(frozen=True)
class ServedPolicy:
    """A policy as served: the loaded graph (`rlstack.acting.Acting`) and the batch sizes it runs at."""

    policy: Policy
    buckets: tuple[int, ...]

    @property
    def version(self) -> str:
        return self.policy.version

    @classmethod
    def of(cls, policy: Policy, buckets: tuple[int, ...]) -> ServedPolicy:
        return cls(policy, buckets)

    def bucket(self, rows: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, rows)]

    def run(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """obs [n, *obs_shape], noise [n, k] -> (action, logp, value) for the n rows, run at the
        next compiled batch size; Box actions within the action space. Graph thread only."""
        action, logp, value = self.policy.run(obs, noise, rows=self.bucket(len(obs)))
        return self.policy.to_env(action), logp, value


def compile_bucket(served: ServedPolicy, size: int) -> None:
    """Compile (first call) and check the graph at one batch size; graph thread only.

    MindSpore refuses to compile a graph while another thread runs one ("Nested execution
    during JIT"), so compiling happens on the graph thread, one bucket per job, between batches.
    """
    obs_shape, noise_dim = served.policy.obs_shape, int(served.policy.manifest["noise"]["dim"])
    probe = served.policy.run(np.zeros((size, *obs_shape), np.float32), np.zeros((size, noise_dim), np.float32))
    if probe.action.shape[0] != size or probe.logp.shape != (size,) or probe.value.shape != (size,):
        raise ArtifactError(f"{served.policy.path}: a batch of {size} observations gave action "
                            f"{probe.action.shape}, logp {probe.logp.shape}, value {probe.value.shape}; "
                            f"expected {size} rows each")
    if not (np.isfinite(probe.logp).all() and np.isfinite(probe.value).all()):
        raise ArtifactError(f"{served.policy.path}: non-finite logp/value for all-zero observations")


class Batcher:
    """Gathers concurrent `submit` calls into graph calls of at most `max_batch` rows."""

    def __init__(self, served: ServedPolicy, *, max_batch: int, max_wait_s: float, metrics: ServeMetrics,
                 executor: ThreadPoolExecutor, profile: ProfileWindow | None = None):
        self.served = served
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._metrics = metrics
        self._executor = executor  # one worker: the graph thread
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._wake = asyncio.Event()  # set when the queue turns non-empty or holds max_batch rows
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._profile = profile  # `--profile`: counts served batches, driven from the graph thread

    # ----- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._collect(), name="rlstack-batcher")

    async def stop(self) -> None:
        """Answer everything already queued, then stop (graceful shutdown)."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._profile is not None:  # a window still recording is closed (and parsed) early
            await asyncio.get_running_loop().run_in_executor(self._executor, self._profile.close)

    async def compile(self, served: ServedPolicy) -> None:
        """Compile every bucket of `served` on the graph thread, one per job, so batches of the
        policy being served run in between (a request waits for at most one compile)."""
        loop = asyncio.get_running_loop()
        for size in served.buckets:
            await loop.run_in_executor(self._executor, compile_bucket, served, size)

    def swap(self, served: ServedPolicy) -> None:
        """Serve `served` from the next batch on (call from the event loop)."""
        self.served = served

    # ----- requests --------------------------------------------------------------------------

    def submit(self, obs: np.ndarray, noise: np.ndarray) -> asyncio.Future[Answer]:
        """Queue obs [n, *obs_shape] float32 with its noise [n, noise_dim]; the future gets its answer."""
        if self._stopping:
            raise RuntimeError("the batcher is shutting down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        self._queue.append(_Pending(obs, noise, future, loop.time()))
        self._queued_rows += len(obs)
        if len(self._queue) == 1 or self._queued_rows >= self.max_batch:
            self._wake.set()
        return future

    def _take(self) -> list[_Pending]:
        taken = [self._queue.popleft()]
        rows = len(taken[0].obs)
        # A request larger than max_batch still runs, alone; others never push a batch past it.
        while self._queue and rows + len(self._queue[0].obs) <= self.max_batch:
            item = self._queue.popleft()
            taken.append(item)
            rows += len(item.obs)
        self._queued_rows -= rows
        return taken

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._stopping and self._queued_rows < self.max_batch and self.max_wait_s > 0:
                # The window is measured from the oldest request's arrival, so a request that
                # already queued behind a running graph call does not wait a second window.
                remaining = self._queue[0].enqueued + self.max_wait_s - loop.time()
                if remaining > 0:
                    self._wake.clear()
                    timer = loop.call_later(remaining, self._wake.set)
                    await self._wake.wait()
                    timer.cancel()
                    continue
            await self._run(self._take(), loop)

    async def _run(self, batch: list[_Pending], loop: asyncio.AbstractEventLoop) -> None:
        served = self.served
        obs = batch[0].obs if len(batch) == 1 else np.concatenate([p.obs for p in batch])
        noise = batch[0].noise if len(batch) == 1 else np.concatenate([p.noise for p in batch])
        started = loop.time()
        for p in batch:
            self._metrics.queue_wait_seconds.observe(started - p.enqueued)
        self._metrics.batch_rows.observe(len(obs))
        self._metrics.batch_requests.observe(len(batch))
        try:
            action, logp, value = await loop.run_in_executor(self._executor, self._call, served, obs, noise)
        except Exception as err:  # a failing graph call fails its batch, never the collector
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(err)
            return
        start = 0
        for p in batch:
            stop = start + len(p.obs)
            if not p.future.done():  # the client may have gone away
                p.future.set_result(Answer(action[start:stop], logp[start:stop], value[start:stop], served.version))
            start = stop

    def _call(self, served: ServedPolicy, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, ...]:
        t0 = time.perf_counter()
        result = served.run(obs, noise)
        self._metrics.graph_seconds.observe(time.perf_counter() - t0)
        if self._profile is not None:
            self._profile.step()
        return result

"""Shared fixtures: MindSpore in graph mode on the CPU for every test process; the files with
learning tests run first (those marked `actors` before the others), then the files marked `slow`,
so the suite's longest runs start while the short tests fill the other pytest-xdist workers.
Each xdist worker runs on its own cores (its child processes too, but for the systems of processes
that wait on each other: `every_core`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ALL_CPUS = "RLSTACK_TEST_ALL_CPUS"
"""The cores the suite may use, before a worker was pinned (`every_core`)."""


def pytest_configure(config: pytest.Config) -> None:
    """Pin this xdist worker, every thread it has and every process it starts, to its share of the
    usable cores. MindSpore's runtime threads of one worker otherwise spin on the cores the other
    worker computes on; pinned, the suite does the same work (bitwise: the thread counts do not
    change) in less CPU time (docs/PERFORMANCE.md#the-test-suite)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0))
    os.environ.setdefault(ALL_CPUS, ",".join(map(str, cpus)))  # the controller's, inherited by the workers
    if worker is None or count > len(cpus):
        return
    share = len(cpus) // count
    index = int(worker.removeprefix("gw"))
    mine = set(cpus[index * share:(index + 1) * share])
    for task in Path("/proc/self/task").iterdir():  # threads already started (none should be)
        os.sched_setaffinity(int(task.name), mine)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    actor_files = {item.path for item in items if item.get_closest_marker("actors")}
    learning_files = {item.path for item in items if item.get_closest_marker("learning")}
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    # stable: file order kept otherwise
    items.sort(key=lambda item: (item.path not in actor_files, item.path not in learning_files,
                                 item.path not in slow_files))


@contextlib.contextmanager
def _on_every_core() -> Iterator[None]:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for c in os.environ.get(ALL_CPUS, ",".join(map(str, before))).split(",")})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@pytest.fixture(scope="session")
def every_core() -> Callable[[], contextlib.AbstractContextManager[None]]:
    """`with every_core():` processes started inside may run on every core of the suite, not only
    this worker's: for systems of processes that wait on each other (Ray's, the data-parallel
    learners), whose start and collectives wait on one another's turn on one busy core
    (docs/PERFORMANCE.md#the-test-suite)."""
    return _on_every_core


@pytest.fixture(scope="session", autouse=True)
def graph_mode_cpu():
    from rlstack.runtime import configure

    return configure("cpu", "auto")

"""Shared fixtures: MindSpore in graph mode on the CPU for every test process; the files with
learning tests run first (those marked `actors` before the others), then the files marked `slow`,
so the suite's longest runs start while the short tests fill the other pytest-xdist workers.
Each xdist worker runs on its own cores (its child processes too)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Pin this xdist worker, every thread it has and every process it starts, to its share of the
    usable cores. MindSpore's runtime threads of one worker otherwise spin on the cores the other
    worker computes on; pinned, the suite does the same work (bitwise: the thread counts do not
    change) in less CPU time (docs/PERFORMANCE.md#the-test-suite)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0))
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


@pytest.fixture(scope="session", autouse=True)
def graph_mode_cpu():
    from rlstack.runtime import configure

    return configure("cpu", "auto")

"""Shared fixtures: MindSpore in graph mode on the CPU for every test process; the files with
learning tests run first (those marked `actors` before the others), then the files marked `slow`,
so the suite's longest runs start while the short tests fill the other pytest-xdist workers."""

from __future__ import annotations

import pytest


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

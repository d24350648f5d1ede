"""Shared fixtures: MindSpore in graph mode on the CPU for every test process."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def graph_mode_cpu():
    from rlstack.runtime import configure

    return configure("cpu", "auto")

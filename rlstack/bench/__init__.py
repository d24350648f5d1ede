"""Benchmarks (`python -m rlstack.bench <name>`): measurements printed as JSON, never asserted by tests."""

from __future__ import annotations

import importlib

# name -> module under rlstack.bench; each module has `main(argv: list[str]) -> int`.
BENCHMARKS = {
    "ppo": "rlstack.bench.ppo",
    "dqn": "rlstack.bench.dqn",
    "sac": "rlstack.bench.sac",
    "consistency": "rlstack.bench.consistency",
    "selfplay": "rlstack.bench.selfplay",
    "serve": "rlstack.bench.serve",
    "actors": "rlstack.bench.actors",
    "seeds": "rlstack.bench.seeds",
    "graphs": "rlstack.bench.graphs",
    "peer": "rlstack.bench.peer",
    "runtime": "rlstack.bench.runtime",
    "conv": "rlstack.bench.conv",
    "mujoco": "rlstack.bench.mujoco",
    "search": "rlstack.bench.search",
    "update": "rlstack.bench.update",
}


def run(name: str, argv: list[str]) -> int:
    if name not in BENCHMARKS:
        raise SystemExit(f"unknown benchmark '{name}'; available: {', '.join(sorted(BENCHMARKS))}")
    return importlib.import_module(BENCHMARKS[name]).main(argv)

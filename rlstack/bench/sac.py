"""`python -m rlstack.bench sac`: SAC Pendulum-v1 (Zoo config) throughput and evaluation, as JSON."""

from __future__ import annotations

from rlstack.bench.offpolicy import run
from rlstack.config import DEFAULT_CONFIG


def main(argv: list[str]) -> int:
    return run("sac", str(DEFAULT_CONFIG.parent / "sac_pendulum.yaml"), argv)

"""`python -m rlstack.bench dqn`: DQN CartPole-v1 (Zoo config) throughput and evaluation, as JSON."""

from __future__ import annotations

from rlstack.bench.offpolicy import run
from rlstack.config import config_path


def main(argv: list[str]) -> int:
    return run("dqn", str(config_path("dqn_cartpole")), argv)

"""Exact resume: a run stopped by a signal and resumed ends with bitwise the same network,
optimizer state and logged curve as the same run not stopped (environment state, replay buffer,
RNG and pending log values are all in the checkpoint), also when the optimizer's state holds
denormal floats, as Adam's does after ~830 steps (`rlstack.runtime.flush_denormals`)."""

import os
import re
import signal
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from rlstack import checkpoints
from rlstack.collector import ENVS_FILE
from rlstack.config import load_config
from rlstack.plot import load_run
from rlstack.trainer import Trainer

pytestmark = pytest.mark.slow

RUNS = {
    "ppo": ("ppo_cartpole", 3, ["train.total_steps=2048"]),
    "dqn": ("dqn_cartpole", 5, ["train.total_steps=2500", "train.learning_starts=1000"]),
    "sac": ("sac_pendulum", 60, ["train.total_steps=400", "train.learning_starts=100", "net.hidden=[32,32]"]),
    # MuJoCo: stopped mid-episode (1,000 steps each), its simulation state and RNG in the checkpoint
    "sac_halfcheetah": ("sac_halfcheetah", 60, ["train.total_steps=400", "train.learning_starts=100",
                                                "net.hidden=[32,32]"]),
    # TD3 with Ornstein-Uhlenbeck exploration: the process's state mid-episode is in the checkpoint
    "td3": ("td3_pendulum", 61, ["train.total_steps=400", "train.learning_starts=100", "net.hidden=[32,32]",
                                 "train.noise_type=ornstein-uhlenbeck"]),
    # a league: opponents are the run's own exported versions and the perfect sparring partner
    "tictactoe": ("ppo_tictactoe_selfplay", 5, ["train.total_steps=8192", "selfplay.eval_every=3",
                                                 "selfplay.eval_games=40", "env.eval_episodes=4"]),
}
COMMON = ["train.progress=off", "env.eval_episodes=2"]


def _curve(out: Path) -> dict[str, tuple[list[float], list[float]]]:
    """Every logged scalar but wall-clock rates and parity diagnostics. Versions in tags (Elo
    snapshots) by rank: the stopped run's export takes a version number, so later ones shift."""
    scalars = load_run(out).scalars
    versions = sorted({v for tag in scalars for v in re.findall(r"v\d{6}", tag)})
    rank = {v: f"snapshot{i}" for i, v in enumerate(versions)}
    return {re.sub(r"v\d{6}", lambda m: rank[m.group()], tag): (s.steps.tolist(), s.values.tolist())
            for tag, s in scalars.items() if not tag.startswith(("time/", "parity/"))}


def _differing(a: Path, b: Path) -> list[str]:
    """The entries of the two runs' latest checkpoints (every parameter, optimizer state included)
    whose bytes differ."""
    first, second = (ms.load_checkpoint(str(checkpoints.latest(out) / checkpoints.CHECKPOINT_FILE))
                     for out in (a, b))
    assert set(first) == set(second)
    return [name for name in sorted(first) if first[name].asnumpy().tobytes() != second[name].asnumpy().tobytes()]


DENORMAL_BITS = 4
"""5.6e-45 as float32 bits: where Adam's `beta1_power` (0.9 ** k) settles after ~980 steps."""


def _seed_denormals(trainer: Trainer) -> None:
    """After the first update, the first element of every Adam power and moment is a denormal,
    the same in the stopped and the unstopped run: a short run's optimizer state as a long one's
    is. The resumed run's first graph calls then read it (they run on MindSpore's kernel threads,
    later calls on the calling thread)."""
    def seed(counters) -> None:
        if counters.updates != 1:
            return
        for p in trainer.algo.state_cell().get_parameters():
            if re.search(r"beta[12]_power$|\.moment[12]\.", p.name):
                value = p.asnumpy().copy()
                value.view(np.uint32).reshape(-1)[0] = DENORMAL_BITS
                p.set_data(Tensor(value))
    trainer.update_hooks.append(seed)


@pytest.mark.parametrize("algo", sorted(RUNS))
def test_a_stopped_and_resumed_run_matches_the_unstopped_run_bitwise(tmp_path, algo):
    config, stop_at, overrides = RUNS[algo]
    cfg = load_config(config, [*overrides, *COMMON])
    unstopped = Trainer(cfg, tmp_path / "whole")
    _seed_denormals(unstopped)
    whole = unstopped.train()

    stopped = Trainer(cfg, tmp_path / "stopped")
    _seed_denormals(stopped)
    stopped.update_hooks.append(lambda c: c.updates == stop_at and os.kill(os.getpid(), signal.SIGINT))
    assert stopped.train()["stopped_by"] == "SIGINT"
    saved = checkpoints.latest(tmp_path / "stopped")
    assert (saved / ENVS_FILE).is_file()
    assert 0 < stopped.counters.steps < cfg.train.total_steps
    resumed = Trainer.resume(tmp_path / "stopped").train()

    assert _differing(tmp_path / "stopped", tmp_path / "whole") == []
    assert resumed["eval/mean_return"] == whole["eval/mean_return"]
    assert resumed["total_steps"] == whole["total_steps"] and resumed["updates"] == whole["updates"]
    assert _curve(tmp_path / "stopped") == _curve(tmp_path / "whole")

"""`learner.workers: 2`: two real data-parallel PPO workers on this machine (MindSpore's mccl over
127.0.0.1) end bitwise identical, different from one worker on rank 0's data alone, and only
rank 0 writes the run directory; bad settings are refused by name."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import pytest

from rlstack.config import ConfigError, load_config
from rlstack.distributed import parameter_digest
from rlstack.trainer import Trainer

# CartPole's shipped config: a rollout is 32 steps x 8 envs = 256 per rank, 20 Adam steps per update.
# Two workers x 2048 steps and one worker x 1024 steps are both 4 updates at the same points of the
# lr / clip-range schedules, rank 0's envs seeded alike: they differ only by rank 1's gradients.
COMMON = ["train.progress=off", "env.eval_episodes=2"]


def _checkpoint_digest(run: Path) -> str:
    latest = (run / "checkpoints" / "LATEST").read_text().strip()
    state = ms.load_checkpoint(str(run / "checkpoints" / latest / "state.ckpt"))
    return parameter_digest({name: p.asnumpy() for name, p in state.items()})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers")
    dp = root / "dp"
    done = subprocess.run([sys.executable, "-m", "rlstack.train", "learner.workers=2", "train.total_steps=2048",
                           *COMMON, "--out", str(dp)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    single = root / "single"
    Trainer(load_config(None, ["train.total_steps=1024", *COMMON]), single).train()
    return dp, single


def test_both_ranks_end_bitwise_identical_and_rank_1s_data_mattered(runs):
    dp, single = runs
    reports = [json.loads((dp / "workers" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0]["digest"] == reports[1]["digest"]
    assert reports[0]["digest"] == _checkpoint_digest(dp)  # the digest covers the checkpointed state
    assert reports[1]["seed"] != reports[0]["seed"]
    assert reports[0]["digest"] != _checkpoint_digest(single)
    # total_steps counts both ranks' steps
    assert json.loads((dp / "summary.json").read_text())["total_steps"] == 2048
    assert all(r["total_steps"] == 2048 for r in reports)


def test_the_run_directory_has_one_writer(runs):
    dp, single = runs

    def listing(run: Path) -> list[str]:
        return sorted(str(p.relative_to(run)) for p in run.rglob("*") if not {"workers", "tb"} & set(p.parts))

    shape = [p.replace("0000002048", "N").replace("0000001024", "N") for p in listing(dp)]
    assert shape == [p.replace("0000001024", "N") for p in listing(single)]
    assert len(list((dp / "tb").iterdir())) == 1
    assert sorted(p.name for p in (dp / "workers").iterdir()) == ["rank0.json", "rank1.json"]


@pytest.mark.parametrize(("overrides", "says"), [
    (["learner.workers=0"], "'learner.workers' must be >= 1"),
    (["learner.workers=2", "actors=1"], "cannot be combined with actors=1"),
    (["learner.workers=2", "net.normalize_obs=true"], "does not support net.normalize_obs"),
    (["learner.workers=2", "learner.master_port=80"], "learner.master_port"),
    (["learner.worker=2"], "did you mean 'learner.workers'"),
])
def test_bad_settings_are_refused(overrides, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_other_algorithms_are_refused_naming_ppo():
    with pytest.raises(ConfigError, match="supported for algo: ppo only, not 'dqn'"):
        load_config("dqn_cartpole", ["learner.workers=2"])


def test_a_trainer_without_its_workers_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="needs the workers `python -m rlstack.train` starts"):
        Trainer(load_config(None, ["learner.workers=2"]), tmp_path / "run")

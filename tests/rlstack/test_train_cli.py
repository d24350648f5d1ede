"""`python -m rlstack.train`: a smoke run, resume, errors, and same seed -> same results."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # a minute or more: scheduled early (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["train.total_steps=512", "train.progress=log", "env.eval_episodes=2", "train.n_epochs=2"]


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlstack.train", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_smoke_run_then_resume(tmp_path):
    out = tmp_path / "run"
    proc = _train("--out", str(out), *SMALL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("eval/mean_return", "eval/std_return", "total_steps", "wall_seconds", "steps_per_second",
                "seed", "config"):
        assert key in summary, key
    assert summary["total_steps"] == 512 and summary["updates"] == 2
    assert summary["config"]["train"]["total_steps"] == 512
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert (out / "checkpoints" / "LATEST").read_text().strip() == "step_0000000512"
    assert (out / "policy" / "LATEST").read_text().strip() == "v000001"
    assert "eval: mean return" in proc.stdout
    # A clean first screen: MindSpore says nothing about the project's own calls (it prints
    # "[WARNING] ME(...)" lines, e.g. for deprecated APIs).
    assert "[WARNING]" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]

    # Running again into the same directory would lose the run: refused.
    again = _train("--out", str(out), *SMALL, cwd=tmp_path)
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = _train("--resume", str(out), "train.total_steps=1024", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[WARNING]" not in resumed.stdout + resumed.stderr, (resumed.stdout + resumed.stderr)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_steps"] == 1024 and summary["updates"] == 4
    assert (out / "checkpoints" / "LATEST").read_text().strip() == "step_0000001024"
    assert (out / "policy" / "LATEST").read_text().strip() == "v000002"


def test_help_without_mindspore_and_options_in_any_order(tmp_path):
    code = ("import sys; from rlstack.train import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('mindspore loaded' if 'mindspore' in sys.modules else 'mindspore not loaded')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "--help-keys" in proc.stdout and proc.stdout.strip().endswith("mindspore not loaded"), proc.stdout
    # --help-keys too: every algorithm's keys with their docs, the same text as with the algorithm loaded.
    code = ("import sys; from rlstack.config_docs import describe\n"
            "texts = [describe(a) for a in ('ppo', 'dqn', 'sac')]\n"
            "assert 'mindspore' not in sys.modules, 'mindspore loaded'\n"
            "import rlstack.algorithms.ppo, rlstack.algorithms.dqn, rlstack.algorithms.sac\n"
            "assert texts == [describe(a) for a in ('ppo', 'dqn', 'sac')], 'texts differ'\n"
            "print(texts[1])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train.target_update_interval = 10000  # Environment steps between" in proc.stdout, proc.stdout
    # An override before --config and one after it: both reach the config (the error names the second).
    proc = _train("seed=3", "--config", "configs/ppo_cartpole.yaml", "train.n_epoch=3", "--out", str(tmp_path / "x"),
                  cwd=ROOT)
    assert proc.returncode == 2 and "train.n_epochs" in proc.stderr, proc.stderr[-2000:]
    proc = _train("seed=3", "--config", "configs/ppo_cartpole.yaml", "--help-keys", "ppo", cwd=ROOT)
    assert proc.returncode == 0 and "train.n_epochs" in proc.stdout


def test_cli_errors_exit_2_with_a_message(tmp_path):
    proc = _train("--out", str(tmp_path / "x"), "train.n_epoch=3", cwd=tmp_path)
    assert proc.returncode == 2 and "train.n_epochs" in proc.stderr
    proc = _train("--out", str(tmp_path / "x"), "env.id=NoSuchEnv-v0", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown environment id 'NoSuchEnv-v0'" in proc.stderr
    proc = _train("--out", str(tmp_path / "x"), "fusion=on", cwd=tmp_path)
    assert proc.returncode == 2 and "graph-kernel fusion needs the Ascend or GPU backend" in proc.stderr
    proc = _train("--resume", str(tmp_path / "nothing"), cwd=tmp_path)
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr


def test_same_seed_same_results(tmp_path):
    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    results = []
    for name in ("a", "b"):
        summary = Trainer(load_config(None, [*SMALL, "seed=5", "train.progress=off"]), tmp_path / name).train()
        results.append(summary)
    assert results[0]["eval/returns"] == results[1]["eval/returns"]
    assert results[0]["rollout/ep_return_mean"] == results[1]["rollout/ep_return_mean"]
    import mindspore as ms

    ckpt = "checkpoints/step_0000000512/state.ckpt"
    a, b = ms.load_checkpoint(str(tmp_path / "a" / ckpt)), ms.load_checkpoint(str(tmp_path / "b" / ckpt))
    assert sorted(a) == sorted(b) and any("moment1" in k for k in a)  # network and Adam state
    for key in a:
        np.testing.assert_array_equal(a[key].asnumpy(), b[key].asnumpy(), err_msg=key)

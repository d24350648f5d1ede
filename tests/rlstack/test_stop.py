"""A run stopped by SIGINT or SIGTERM loses no work: it finishes the update, writes a checkpoint
and an export, says how to resume, and exits 130 / 143; `--resume` continues it."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LONG = ["train.total_steps=10000000", "train.progress=log", "train.log_every_seconds=0.2", "env.eval_episodes=2"]


def _start(out: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlstack.train", "--out", str(out), *LONG, *overrides],
                            cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_steps(proc: subprocess.Popen, steps: int, timeout: float = 240.0) -> list[str]:
    """Read the run's log lines until its progress line passes `steps` environment steps."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "".join(lines[-30:])
        lines.append(line)
        if line.startswith("step") and int(line.split()[1].split("/")[0].replace(",", "")) >= steps:
            return lines
    raise AssertionError("no progress: " + "".join(lines[-30:]))


@pytest.mark.parametrize(("sig", "codes", "extra"), [(signal.SIGINT, (130, 143), ()),
                                                    (signal.SIGTERM, (143,), ("actors=2",))])
def test_a_signal_stops_the_run_with_a_checkpoint_an_export_and_a_resume_command(tmp_path, sig, codes, extra):
    """SIGINT exits 130, or 143 when it arrives while MindSpore runs a graph: MindSpore's runtime
    turns it into SIGTERM then (rlstack/stopping.py). Either way the stop is graceful."""
    out = tmp_path / "run"
    proc = _start(out, *extra)
    _wait_for_steps(proc, 2048)
    started = time.monotonic()
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode in codes, rest[-3000:]
    assert "stopping after the current update" in rest and "stopped by SIG" in rest, rest[-3000:]
    assert time.monotonic() - started < 60, "the stop took more than a minute"
    assert f"resume with: python -m rlstack.train --resume {out}" in rest, rest[-3000:]
    latest = out / "checkpoints" / (out / "checkpoints" / "LATEST").read_text().strip()
    state = json.loads((latest / "trainer.json").read_text())
    assert state["steps"] >= 2048 and state["wall_seconds"] > 0
    assert (out / "policy" / (out / "policy" / "LATEST").read_text().strip() / "policy.mindir").is_file()
    resumed = subprocess.run([sys.executable, "-m", "rlstack.train", "--resume", str(out),
                              f"train.total_steps={state['steps'] + 512}", "actors=0"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_steps"] >= state["steps"] + 512 and summary["updates"] > state["updates"]
    assert summary["wall_seconds"] > state["wall_seconds"]  # counted on from the stopped run


def test_periodic_checkpoints_record_the_wall_time_so_far(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlstack.train", "--out", str(out), "train.total_steps=1024",
                           "train.checkpoint_every=1", "train.keep_checkpoints=10", "train.progress=off",
                           "env.eval_episodes=1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    walls = [json.loads((p / "trainer.json").read_text())["wall_seconds"]
             for p in sorted((out / "checkpoints").glob("step_*"))]
    assert len(walls) == 4 and walls[0] > 0 and walls == sorted(walls), walls

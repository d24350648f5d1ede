"""`--profile`: MindSpore's Profiler over a bounded window, output under <out>/profile, top operators printed."""

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from mindspore import Tensor

from rlstack.network import NetSpec, Network
from rlstack.profiling import ProfileError, ProfileWindow


def test_train_profile_writes_a_profile_directory(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlstack.train", "--out", str(out), "--profile", "--profile-steps", "2",
         "--profile-skip", "1", "train.total_steps=512", "train.n_steps=16", "train.batch_size=128",
         "train.n_epochs=1", "env.eval_episodes=1", "train.progress=off"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    profile = out / "profile"
    traces = [p for p in profile.iterdir() if p.is_dir() and p.name.endswith("_ascend_ms")]
    assert len(traces) == 1
    summary = json.loads((profile / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["trace_dir"] == str(traces[0])
    ops = {op["op_type"] for op in summary["ops"]}
    assert {"MatMul", "Adam"} <= ops  # acting and the update were both inside the window
    assert "operator" in proc.stdout and "MatMul" in proc.stdout

    bad = subprocess.run([sys.executable, "-m", "rlstack.train", "--profile-steps", "0"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expected an integer >= 1" in bad.stderr


def test_profile_window_is_bounded_and_closes_early(tmp_path):
    env = gym.make("CartPole-v1")
    net = Network(env.observation_space, env.action_space, NetSpec(hidden=(16,)))
    obs, noise = Tensor(np.zeros((8, 4), np.float32)), Tensor(np.zeros((8, 2), np.float32))
    net(obs, noise)
    printed = []
    # top=20: every operator type of the acting graph is printed (~13; the order of the cheap ones
    # varies from run to run, and MatMul on [8, 16] is one of them)
    window = ProfileWindow(tmp_path / "a", steps=3, skip=2, top=20, printer=printed.append)
    for _ in range(8):
        net(obs, noise)
        window.step()
    assert window.done and window.summary.steps == 3 and window.seen == 5  # stopped counting once done
    # 3 recorded calls x 4 Dense layers (policy and value MLPs with one hidden layer each).
    assert any(op.op_type == "MatMul" and op.count == 3 * 4 for op in window.summary.ops)
    assert printed == [window.summary.table(20)] and "MatMul" in printed[0]

    with ProfileWindow(tmp_path / "b", steps=100, skip=0, printer=None) as early:
        net(obs, noise)
        early.step()
    assert early.summary is not None and early.summary.steps == 1

    with pytest.raises(ProfileError, match="must be >= 1"):
        ProfileWindow(tmp_path / "c", steps=0)

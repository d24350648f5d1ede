"""Crash safety under real faults: SIGKILL at random moments (checkpoint writing and exports
included), corrupt or truncated checkpoint files, and a full disk. After each, `checkpoints/LATEST`
and `policy/LATEST` name complete, loadable entries, and the run resumes."""

import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlstack import checkpoints
from rlstack.acting import load_policy
from rlstack.artifact import resolve_version_dir
from rlstack.checkpoints import ResumeError
from rlstack.config import load_config
from rlstack.trainer import Trainer

pytestmark = pytest.mark.slow

KILL_TRIALS = int(os.environ.get("RLSTACK_KILL_TRIALS", "5"))
"""SIGKILLs in the kill loop (about 7 s each here; at least two aimed at a write); raise it for a
longer soak."""
BUSY_WRITER = ["env.n_envs=2", "train.n_steps=16", "train.batch_size=32", "train.n_epochs=1",
               "train.checkpoint_every=1", "train.export_every=1", "train.keep_checkpoints=2",
               "train.keep_versions=2", "train.progress=off", "env.eval_episodes=1"]
"""PPO that checkpoints and exports after every 32-step update: most of its time is spent writing."""


def _train(out: Path, *args: str, **popen: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlstack.train", *args], cwd=out.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)


def _latest_checkpoint_steps(out: Path) -> int:
    pointer = out / "checkpoints" / "LATEST"
    return int(pointer.read_text().split("_")[1]) if pointer.is_file() else -1


def _assert_whole(out: Path) -> None:
    """LATEST of checkpoints/ and of policy/ name complete entries that load."""
    checkpoints.verify(checkpoints.latest(out))
    load_policy(resolve_version_dir(out / "policy"))


def test_sigkill_at_random_moments_never_leaves_a_broken_latest_and_resume_goes_on(tmp_path):
    out, rng = tmp_path / "run", random.Random(0)
    proc = _train(out, "--out", str(out), "train.total_steps=100000000", *BUSY_WRITER)
    mid_write = 0
    for trial in range(KILL_TRIALS):
        before = _latest_checkpoint_steps(out)
        deadline = time.monotonic() + 120
        while _latest_checkpoint_steps(out) <= before:  # running: it wrote a new checkpoint
            assert proc.poll() is None, f"trial {trial}: the run exited: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, f"trial {trial}: no new checkpoint in 120 s"
            time.sleep(0.02)
        if trial % 2:  # aim at a write: kill as soon as a temp checkpoint or version directory appears
            deadline = time.monotonic() + 10
            while not any(out.glob("*/.*.tmp")) and time.monotonic() < deadline:
                pass
        else:
            time.sleep(rng.uniform(0.0, 1.0))
        proc.kill()
        proc.wait()
        mid_write += any(out.glob("*/.*.tmp"))  # killed while a checkpoint or an export was written
        _assert_whole(out)
        proc = _train(out, "--resume", str(out))
    proc.kill()
    proc.wait()
    _assert_whole(out)
    steps = _latest_checkpoint_steps(out)
    finish = subprocess.run([sys.executable, "-m", "rlstack.train", "--resume", str(out),
                             f"train.total_steps={steps + 64}"], capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stderr[-3000:]
    assert _latest_checkpoint_steps(out) >= steps + 64
    print(f"{KILL_TRIALS} SIGKILLs survived, {mid_write} of them while a checkpoint or export was being written")


def _corrupt(file: Path, how: str) -> None:
    data = file.read_bytes()
    if how == "truncate":
        file.write_bytes(data[: len(data) // 2])
    else:
        flipped = bytearray(data)
        flipped[len(data) // 3] ^= 0xFF
        file.write_bytes(bytes(flipped))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A short DQN run with three checkpoints (replay buffer and env state in each)."""
    cfg = load_config("dqn_cartpole", ["train.total_steps=1500", "train.learning_starts=500", "net.hidden=[32,32]",
                                       "train.checkpoint_every=2", "train.keep_checkpoints=3", "train.progress=off",
                                       "env.eval_episodes=1"])
    out = tmp_path_factory.mktemp("finished") / "run"
    Trainer(cfg, out).train()
    return out


@pytest.mark.parametrize(("filename", "how"), [("state.ckpt", "truncate"), ("replay.npz", "flip"),
                                               ("envs.pkl", "truncate")])
def test_a_corrupt_checkpoint_is_refused_by_name_and_an_earlier_one_resumes_the_run_exactly(
        tmp_path, finished_run, filename, how):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    final = checkpoints.latest(out)
    digest = checkpoints.params_digest(final)
    earlier = sorted(p for p in final.parent.glob("step_*") if p != final)[-1]
    _corrupt(final / filename, how)
    with pytest.raises(ResumeError, match=rf"{final / filename} is corrupt.*--resume {earlier}"):
        Trainer.resume(out)
    resumed = Trainer.resume(earlier)
    assert (final.parent / f"replaced_{final.name}").is_dir()  # set aside, not deleted
    resumed.train()
    assert checkpoints.latest(out) == final
    assert checkpoints.params_digest(final) == digest  # the same network as before the corruption


def test_a_full_disk_during_a_checkpoint_is_a_clear_error_and_the_previous_checkpoint_stays_whole(tmp_path):
    """A file size limit on the process stands in for a full disk (writes fail with EFBIG); the
    replay buffer in the checkpoint grows until it no longer fits."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "rlstack.train", "--config", "dqn_cartpole", "--out", str(out),
                          "train.total_steps=8000", "train.learning_starts=500", "train.checkpoint_every=1",
                          "net.hidden=[32,32]", "train.progress=off"], preexec_fn=limit, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-3000:]
    previous = checkpoints.latest(out)
    assert f"could not write checkpoint {out / 'checkpoints'}" in run.stderr, run.stderr[-3000:]
    assert f"the previous checkpoint {previous} is intact" in run.stderr, run.stderr[-3000:]
    assert f"--resume {out}" in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert not list((out / "checkpoints").glob(".*.tmp"))
    checkpoints.verify(previous)
    assert Trainer.resume(out).counters.steps == _latest_checkpoint_steps(out)

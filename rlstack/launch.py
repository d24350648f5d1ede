"""The launch of data-parallel learners (`learner.workers: N`, `python -m rlstack.train`): one
scheduler and N worker processes on 127.0.0.1 by MindSpore's environment-variable protocol, each
rank's trainer (seed, run directory) and its report at the end. The collectives are
`rlstack/distributed.py`'s."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlstack.config import Config, ConfigError
from rlstack.distributed import GRACE_SECONDS, RANK_SEED_STRIDE, WORKERS_DIR, join, state_digest
from rlstack.fsutil import atomic_write_text
from rlstack.trainer import Trainer


def worker_trainer(cfg: Config, out: str | Path | None) -> Trainer:
    """This rank's trainer: rank 0 in the run directory, rank r > 0 with its own seed in a scratch
    directory; every rank's network then set to rank 0's."""
    if out is None:
        raise ConfigError("learner.workers >= 2 workers need the run directory: pass --out (every rank must "
                          "agree on it; `python -m rlstack.train` passes it to the workers it starts)")
    world = join(cfg)
    if world.rank:
        cfg = dataclasses.replace(cfg, seed=cfg.seed + world.rank * RANK_SEED_STRIDE,
                                  train=dataclasses.replace(cfg.train, progress="off"))
        scratch = Path(tempfile.mkdtemp(prefix=f"rlstack-rank{world.rank}-")) / "run"
        trainer = Trainer(cfg, scratch, world=world)
    else:
        trainer = Trainer(cfg, out, world=world)
    world.broadcast(trainer.algo.state_cell())
    return trainer


def finish(trainer: Trainer, run: Path) -> None:
    """After `train()`: write `<run>/workers/rank<r>.json` (atomically) and, on ranks > 0, remove
    the scratch directory."""
    world = trainer.world
    report = {"rank": world.rank, "workers": world.size, "seed": trainer.cfg.seed,
              "digest": state_digest(trainer.algo.state_cell()), "total_steps": trainer.counters.steps,
              "episodes": trainer.counters.episodes}
    (run / WORKERS_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write_text(run / WORKERS_DIR / f"rank{world.rank}.json", json.dumps(report, indent=2))
    if world.rank:
        shutil.rmtree(trainer.out.parent, ignore_errors=True)


# ----- launcher side -----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(argv: list[str], cfg: Config, out: Path) -> int:
    """Start the scheduler and `learner.workers` workers on 127.0.0.1 (each `python -m
    rlstack.train argv --out out`), forward SIGINT / SIGTERM to the workers, wait, and return the
    workers' exit status (that of the first to fail: 130 / 143 after a graceful stop). Rank 0 writes to this
    terminal; the other processes' output goes to a log directory, kept (and named) on failure."""
    if (out / "checkpoints" / "LATEST").exists():
        raise ConfigError(f"{out} already holds a run; choose another --out (a run of N workers is resumed "
                          "with learner.workers=1)")
    n, port = cfg.learner.workers, cfg.learner.master_port or free_port()
    logs = Path(tempfile.mkdtemp(prefix="rlstack-workers-"))
    env = {**os.environ, "MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": str(port), "MS_WORKER_NUM": str(n)}
    command = [sys.executable, "-m", "rlstack.train", *argv, "--out", str(out)]
    print(f"learner.workers={n}: scheduler on 127.0.0.1:{port}; rank 0 writes {out}, ranks 1..{n - 1} log to "
          f"{logs}", flush=True)

    def start(name: str, extra: dict[str, str], inherit: bool) -> subprocess.Popen:
        # A session of its own: a terminal's Ctrl-C reaches the launcher only, which forwards it once.
        out_file = None if inherit else open(logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        return subprocess.Popen(command, env={**env, **extra}, stdout=out_file, stderr=subprocess.STDOUT if out_file
                                else None, start_new_session=True)

    scheduler = start("scheduler", {"MS_ROLE": "MS_SCHED"}, inherit=False)
    # Rank 0 on this terminal without MindSpore's cluster-building warnings (~40 lines), unless
    # GLOG_v is set; the log files keep them.
    quiet = {} if "GLOG_v" in os.environ else {"GLOG_v": "3"}
    # Ranks > 0 keep their scratch run directories beside their logs: removed with them, or left
    # for a look when a rank failed.
    workers = [start(f"rank{r}", {"MS_ROLE": "MS_WORKER", "MS_NODE_ID": str(r),
                                  **(quiet if r == 0 else {"TMPDIR": str(logs)})}, inherit=r == 0) for r in range(n)]

    def forward(signum: int, frame: Any) -> None:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    codes: list[int] = []
    try:
        codes, first = _wait(workers)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not codes:  # the launcher itself failed
            _end(workers, wait=5.0)
        # (the scheduler leaves once every worker has unregistered; after a failure it may not)
        _end([scheduler], wait=10.0 if codes and all(code == 0 for code in codes) else 1.0)
    stops = (128 + signal.SIGINT, 128 + signal.SIGTERM)  # a graceful stop, said by rank 0 already
    if all(code in (0, *stops) for code in codes):
        shutil.rmtree(logs, ignore_errors=True)
    if first is None:
        return 0
    failed = [r for r, code in enumerate(codes) if code != 0]
    for r in [r for r in failed if codes[r] not in stops][:2]:
        if r and (logs / f"rank{r}.log").is_file():
            tail = (logs / f"rank{r}.log").read_text(errors="replace").splitlines()[-15:]
            print(f"--- rank {r} exited with {codes[r]}; last lines of {logs / f'rank{r}.log'}:", *tail,
                  sep="\n", file=sys.stderr)
    return codes[first]


def _wait(workers: list[subprocess.Popen]) -> tuple[list[int], int | None]:
    """Every worker's exit status and the rank that failed first (None: none failed); after the
    first failure the others get `GRACE_SECONDS`."""
    deadline, first = None, None
    while None in (codes := [w.poll() for w in workers]):  # (every one polled: any() would stop early)
        if deadline is None and any(code not in (None, 0) for code in codes):
            deadline = time.monotonic() + GRACE_SECONDS
            first = next(r for r, code in enumerate(codes) if code not in (None, 0))
        if deadline is not None and time.monotonic() > deadline:
            _end(workers, wait=5.0)
            break
        time.sleep(0.1)
    # A process ended by a signal has the shell's status for it (128 + signal), not a negative one.
    codes = [128 - w.returncode if w.returncode < 0 else w.returncode for w in workers]
    if first is None and any(codes):
        first = next(r for r, code in enumerate(codes) if code)
    return codes, first


def _end(processes: list[subprocess.Popen], wait: float) -> None:
    """Wait up to `wait` s for `processes`, then SIGTERM, 5 s more, then SIGKILL what is left."""
    for sig, seconds in ((signal.SIGTERM, wait), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + seconds
        while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in processes:
            if p.poll() is None:
                p.send_signal(sig)
    for p in processes:
        p.wait()

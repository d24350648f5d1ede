"""Data-parallel learners (`learner.workers: N`): the launch of N worker processes, each rank's seed
and run directory, and the collectives the trainer and PPO's update use.

MindSpore's own collective communication does the work (docs/DESIGN.md#seams: nothing home-made): `init()`
joins the cluster (backend mccl on CPU, HCCL on Ascend, NCCL on GPU) and `ops.AllReduce` sums
over the ranks. Measured on MindSpore 2.10's CPU backend (mccl): AllReduce supports SUM only
(the mean is the sum / N), and a crashed worker leaves the others waiting ~40 s in a collective
before they fail, so the launcher ends the survivors itself.

Every rank runs the same program (SPMD): it builds the same trainer, steps its own `env.n_envs`
envs with its own seed, and averages each minibatch gradient with the others (`GradMean`), so
the networks stay bitwise identical. Only rank 0 writes the run directory; rank r > 0 runs in a
scratch directory that is removed at the end, and leaves only `<run>/workers/rank<r>.json`
(its final parameter digest). The launch is MindSpore's environment-variable protocol
(`MS_SCHED_HOST`, `MS_SCHED_PORT`, `MS_WORKER_NUM`, `MS_ROLE`, `MS_NODE_ID`), the one msrun uses
underneath: one scheduler process and N workers, all `python -m rlstack.train` with the same
arguments, on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from mindspore import Tensor, nn, ops

from rlstack.config import Config, ConfigError
from rlstack.fsutil import atomic_write_text

if TYPE_CHECKING:
    from rlstack.trainer import Trainer

RANK_SEED_STRIDE = 1_000_000
"""Rank r trains with `seed + r * RANK_SEED_STRIDE` (its envs, action noise and minibatch order);
env i of a rank gets that + i, so the ranks' env seeds never meet."""
WORKERS_DIR = "workers"
"""`<run>/workers/rank<r>.json`: every rank's final parameter digest (the one file ranks > 0 write)."""
GRACE_SECONDS = 15.0
"""After a worker failed, how long the others may take to fail or finish before they are ended
(they would otherwise wait ~40 s in a collective)."""


class GradMean(nn.Cell):
    """A flat gradient vector -> its mean over the ranks (one AllReduce: mccl on CPU sums only)."""

    def __init__(self, workers: int):
        super().__init__()
        self.all_reduce = ops.AllReduce()
        self.workers = float(workers)

    def construct(self, flat):
        return self.all_reduce(flat) / self.workers


class World:
    """This process's place among the data-parallel learners, and the host-side collectives."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self._all_reduce = ops.AllReduce()

    def all_sum(self, values: np.ndarray) -> np.ndarray:
        """float32 `values` summed over every rank (each rank calls it with the same shape)."""
        return self._all_reduce(Tensor(np.ascontiguousarray(values, np.float32))).asnumpy()

    def broadcast(self, cell: nn.Cell) -> None:
        """Every float32 parameter of `cell` set to rank 0's (a sum of rank 0's values and zeros,
        exact): the ranks build their networks from different seeds."""
        params = [p for p in cell.get_parameters() if str(p.dtype) == "Float32"]
        flat = np.concatenate([p.asnumpy().ravel() for p in params])
        flat = self.all_sum(flat if self.rank == 0 else np.zeros_like(flat))
        start = 0
        for p in params:
            p.set_data(Tensor(flat[start:start + p.size].reshape(p.shape)))
            start += p.size

    def agree_stop(self, pending: int | None) -> int | None:
        """`rlstack.stopping.StopSignals`' agreement, once per update on every rank: the signal
        the lowest rank that received one got, or None if none did."""
        mine = np.zeros(self.size, np.float32)
        mine[self.rank] = pending or 0
        received = [int(s) for s in self.all_sum(mine) if s]
        return received[0] if received else None


def parameter_digest(named: Mapping[str, np.ndarray]) -> str:
    """sha256 of named arrays (names sorted; dtype, shape and bytes of each)."""
    digest = hashlib.sha256()
    for name in sorted(named):
        array = np.ascontiguousarray(named[name])
        digest.update(f"{name}:{array.dtype}:{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def state_digest(cell: nn.Cell) -> str:
    """`parameter_digest` of every parameter of `cell` (network and optimizer state), by name."""
    return parameter_digest({p.name: p.asnumpy() for p in cell.get_parameters()})


# ----- worker side -------------------------------------------------------------------------------

def role() -> str | None:
    """`MS_WORKER` or `MS_SCHED` in a process started by `launch` (or by msrun); None otherwise."""
    return os.environ.get("MS_ROLE") or None


def join(cfg: Config) -> World:
    """Configure the device and join the cluster (before anything else is built: HCCL needs
    `init()` before the first Tensor). The scheduler process never returns from `init()`."""
    from mindspore.communication import get_group_size, get_rank, init

    from rlstack.runtime import configure

    configure(cfg.device, cfg.fusion)
    init()
    world = World(get_rank(), get_group_size())
    if world.size != cfg.learner.workers:
        raise ConfigError(f"learner.workers={cfg.learner.workers} but the cluster has {world.size} workers")
    cpus = sorted(os.sched_getaffinity(0))
    if cfg.device == "cpu" and world.size <= len(cpus):
        # One core per rank: the ranks meet at every minibatch's all-reduce, and unpinned they
        # and their runtime threads migrate between the cores (measured on 2 cores, PPO CartPole:
        # 2,600-3,600 steps/s pinned, 1,700-1,850 not).
        os.sched_setaffinity(0, {cpus[world.rank % len(cpus)]})
    return world


def worker_trainer(cfg: Config, out: str | Path | None) -> Trainer:
    """This rank's trainer: rank 0 in the run directory, rank r > 0 with its own seed in a scratch
    directory; every rank's network then set to rank 0's."""
    from rlstack.trainer import Trainer

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

"""Data-parallel learners (`learner.workers: N`): joining the cluster, and the collectives the
trainer and PPO's update use (the launch of the workers is `rlstack/launch.py`, beside the CLI).

MindSpore's own collective communication does the work (docs/DESIGN.md#seams: nothing home-made): `init()`
joins the cluster (backend mccl on CPU, HCCL on Ascend, NCCL on GPU) and `ops.AllReduce` sums
over the ranks. On MindSpore 2.10's CPU backend (mccl) AllReduce supports SUM only (the mean is
the sum / N), and a crashed worker leaves the others waiting in a collective, so the launcher
ends the survivors itself (docs/PERFORMANCE.md#data-parallel-learners).

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

import hashlib
import os
from collections.abc import Mapping

import numpy as np
from mindspore import Tensor, nn, ops

from rlstack.config import Config, ConfigError

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
        # and their runtime threads migrate between the cores (docs/PERFORMANCE.md#data-parallel-learners).
        os.sched_setaffinity(0, {cpus[world.rank % len(cpus)]})
    return world

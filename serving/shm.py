"""Shared-memory transport of the actor stage: weights learner -> actors, trajectories actors -> learner.

Two kinds of block, both plain `multiprocessing.shared_memory` holding numpy arrays at fixed
offsets (nothing is pickled on the hot path; the queues only carry small notices):

- `WeightBoard`: the learner's newest acting weights as one flat float32 vector plus a header
  (publish count, weights version = learner updates, the "explore uniformly" flag). The
  learner writes it under a lock after every update; an actor compares the publish count
  without the lock (one aligned int64 load) and copies the vector under the lock only when it
  changed.
- `SharedArrays`: named arrays (one trajectory slot of an actor: obs, action, logp, ...). The
  slot protocol (free queue -> actor fills -> ready queue -> learner copies out -> free queue)
  guarantees one writer or one reader at a time, so slots need no lock.

Blocks are created by the learner (which unlinks them at the end) and attached by the actor
processes by name.
"""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import Any

import numpy as np

from rlstack.acting import FlatWeights
from rlstack.collector import ArraySpec

_ALIGN = 64  # cache-line aligned arrays


def _layout(specs: tuple[ArraySpec, ...]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for spec in specs:
        offsets.append(end)
        end += -(-spec.nbytes // _ALIGN) * _ALIGN
    return offsets, max(end, _ALIGN)


def _attach(name: str) -> shared_memory.SharedMemory:
    # Attaching registers the block with the resource tracker again (Python < 3.13); spawned
    # actors share the learner's tracker, whose set of names absorbs the duplicate, and only
    # the learner unlinks. (Unregistering here would make the learner's unlink a KeyError.)
    return shared_memory.SharedMemory(name=name, create=False)


class SharedArrays:
    """Named numpy arrays over one shared-memory block (`create=True` in the owner)."""

    def __init__(self, specs: tuple[ArraySpec, ...], name: str | None = None, create: bool = False):
        self.specs = tuple(specs)
        offsets, size = _layout(self.specs)
        self.shm = shared_memory.SharedMemory(create=True, size=size) if create else _attach(str(name))
        self.owner = create
        self.arrays: dict[str, np.ndarray] = {
            spec.name: np.ndarray(spec.shape, np.dtype(spec.dtype), buffer=self.shm.buf, offset=offset)
            for spec, offset in zip(self.specs, offsets, strict=True)}

    @property
    def name(self) -> str:
        return self.shm.name

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def copy(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.arrays.items()}

    def close(self) -> None:
        """Detach (and unlink, in the owner). The arrays must not be used afterwards."""
        self.arrays = {}
        self.shm.close()
        if self.owner:
            self.shm.unlink()


class WeightBoard:
    """The learner's newest acting weights, read by every actor process.

    `layout` is the ordered (parameter name, shape) list of the exported graph's parameters.
    """

    def __init__(self, layout: tuple[tuple[str, tuple[int, ...]], ...], lock: Any, name: str | None = None,
                 create: bool = False):
        self.flat = FlatWeights(layout)
        self.layout = self.flat.layout
        self.lock = lock
        specs = (ArraySpec("header", (3,), "int64"), ArraySpec("flat", (self.flat.size,), "float32"))
        self.block = SharedArrays(specs, name, create)
        if create:
            self.block["header"][:] = (0, -1, 0)

    @property
    def name(self) -> str:
        return self.block.name

    @property
    def seq(self) -> int:
        """How many times weights were published (changes with every `publish`); lock-free read."""
        return int(self.block["header"][0])

    @property
    def version(self) -> int:
        """Version of the weights on the board (-1: none yet); lock-free read."""
        return int(self.block["header"][1])

    @property
    def explore(self) -> bool:
        """The learner asks for uniformly random actions (off-policy warm-up); lock-free read."""
        return bool(self.block["header"][2])

    def publish(self, weights: dict[str, np.ndarray], version: int, explore: bool = False) -> None:
        """Write the weights (every name of the layout) and their version."""
        with self.lock:
            self.flat.pack(weights, out=self.block["flat"])
            header = self.block["header"]
            header[1:] = (version, int(explore))
            header[0] += 1

    def read(self) -> tuple[int, int, dict[str, np.ndarray]]:
        """(seq, version, weights) copied out under the lock."""
        with self.lock:
            seq, version, _ = (int(x) for x in self.block["header"])
            flat = self.block["flat"].copy()
        return seq, version, self.flat.unpack(flat)

    def close(self) -> None:
        self.block.close()

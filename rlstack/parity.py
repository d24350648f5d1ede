"""Parity, measured (docs/DESIGN.md, contract 4): the exported graph against the live module, after every export.

The trainer calls `measure_parity` with the version it just exported, its live network, and
the most recent observations the actors acted on. Both run on the same rows with the same noise:

- the exported graph (`rlstack.acting.load_policy`) in chunks of the *rollout* batch
  (`env.n_envs`: what an actor computes), and the live module in chunks of the *minibatch*
  (what the learner computes): `max_abs_logp`, `max_abs_action`, `max_abs_value`, `bitwise`.
  This is the train/act skew; `parity: strict` makes it exactly 0.
- the exported graph and the live module at the *same* batch sizes: `export_bitwise`, which
  says the MindIR computes exactly what the module computes (true in both parity modes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

ActFn = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]

MAX_ROWS = 4096
"""Largest number of rows a parity check runs."""


class ParityReport(NamedTuple):
    """One parity check of an exported version (every `max_abs_*` is over all rows)."""

    version: str
    rows: int
    rollout_batch: int
    minibatch: int
    max_abs_logp: float
    max_abs_action: float
    max_abs_value: float
    action_mismatch: float
    """Fraction of rows whose action differs (any component)."""
    bitwise: bool
    """logp, action and value identical bit for bit between the two batch sizes."""
    export_bitwise: bool
    """Exported graph and live module identical at the same batch size (both sizes)."""
    seconds: float
    priors_max_abs: float | None = None
    """A game's priors entry point: max |d| of its log-probabilities and values, exported against
    live at the same batch (None: the version has none)."""

    def metrics(self) -> dict[str, float]:
        """`parity/…` scalars for TensorBoard and summary.json."""
        metrics = {"parity/max_abs_logp": self.max_abs_logp, "parity/max_abs_action": self.max_abs_action,
                   "parity/max_abs_value": self.max_abs_value, "parity/action_mismatch": self.action_mismatch,
                   "parity/bitwise": float(self.bitwise), "parity/export_bitwise": float(self.export_bitwise)}
        if self.priors_max_abs is not None:
            metrics["parity/priors_max_abs"] = self.priors_max_abs
        return metrics

    def line(self) -> str:
        """One console line."""
        return (f"parity {self.version}: exported graph at batch {self.rollout_batch} vs live module at batch "
                f"{self.minibatch} on {self.rows} recent obs: max|dlogp| {self.max_abs_logp:.3g}, "
                f"max|daction| {self.max_abs_action:.3g}, max|dvalue| {self.max_abs_value:.3g}, "
                f"bitwise {'yes' if self.bitwise else 'no'}; same-batch export bitwise "
                f"{'yes' if self.export_bitwise else 'NO'}"
                + ("" if self.priors_max_abs is None else f"; priors entry point max|d| {self.priors_max_abs:.3g}")
                + f" ({self.seconds:.2f} s)")


class RecentObs:
    """The last `capacity` observation rows an actor acted on (parity checks re-run them)."""

    def __init__(self, capacity: int = MAX_ROWS):
        self.capacity = capacity
        self.rows: np.ndarray | None = None
        self.count = 0

    def add(self, obs: np.ndarray) -> None:
        if self.capacity <= 0:
            return
        obs = obs.reshape(len(obs), -1)
        if self.rows is None:
            self.rows = np.zeros((self.capacity, obs.shape[1]), obs.dtype if obs.dtype == np.uint8 else np.float32)
        obs = obs[-self.capacity:]
        at = np.arange(self.count, self.count + len(obs)) % self.capacity
        self.rows[at] = obs
        self.count += len(obs)

    def get(self) -> np.ndarray | None:
        """Up to `capacity` rows, oldest first (None before the first call)."""
        if self.rows is None:
            return None
        if self.count < self.capacity:
            return self.rows[: self.count].copy()
        return np.roll(self.rows, -(self.count % self.capacity), axis=0)


def parity_rows(rollout_batch: int, minibatch: int) -> int:
    """Rows to compare: whole chunks of both batch sizes (their lcm), at most `MAX_ROWS`."""
    rows = math.lcm(rollout_batch, minibatch)
    return rows if rows <= MAX_ROWS else max(minibatch, rollout_batch)


def in_chunks(fn: ActFn, obs: np.ndarray, noise: np.ndarray, batch: int) -> tuple[np.ndarray, ...]:
    """Run `fn` on consecutive chunks of `batch` rows and concatenate (action, logp, value)."""
    parts = [fn(obs[i:i + batch], noise[i:i + batch]) for i in range(0, len(obs), batch)]
    return tuple(np.concatenate([np.asarray(p[k]) for p in parts]) for k in range(3))


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def _identical(x: tuple[np.ndarray, ...], y: tuple[np.ndarray, ...]) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(x, y, strict=True))


def sample_rows(recent: np.ndarray | None, rows: int, obs_shape: tuple[int, ...],
                rng: np.random.Generator, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """`rows` observations of `dtype`: the most recent ones (cycled if too few), else standard
    normal (uniform bytes for uint8 frames)."""
    if recent is None or len(recent) == 0:
        if np.dtype(dtype) == np.uint8:
            return rng.integers(0, 256, (rows, *obs_shape), dtype=np.uint8)
        return rng.standard_normal((rows, *obs_shape)).astype(np.float32)
    recent = np.asarray(recent, dtype).reshape(len(recent), *obs_shape)
    return recent[np.arange(len(recent) - rows, len(recent)) % len(recent)]


def measure_parity(policy: Any, live: ActFn, obs: np.ndarray, noise: np.ndarray, *, rollout_batch: int,
                   minibatch: int) -> ParityReport:
    """Compare `policy` (a loaded version's `rlstack.acting.Acting`) with `live` (the module's
    act, numpy in/out: `Acting.of_network`) on `obs` [R, ...] and `noise` [R, noise_dim]; a
    game's priors entry point too, at the same batch."""
    start = time.perf_counter()
    priors = None
    if getattr(policy, "has_priors", False) and getattr(live, "has_priors", False):
        exported_priors, live_priors = policy.priors(obs), live.priors(obs)
        priors = max(_max_abs(a, b) for a, b in zip(exported_priors, live_priors, strict=True))
    exported = policy.run
    acted = in_chunks(exported, obs, noise, rollout_batch)
    learned = in_chunks(live, obs, noise, minibatch)
    same = (_identical(acted, in_chunks(live, obs, noise, rollout_batch))
            and _identical(in_chunks(exported, obs, noise, minibatch), learned))
    action_a, action_l = acted[0].reshape(len(obs), -1), learned[0].reshape(len(obs), -1)
    return ParityReport(
        version=str(policy.version), rows=len(obs), rollout_batch=rollout_batch, minibatch=minibatch,
        max_abs_logp=_max_abs(acted[1], learned[1]), max_abs_action=_max_abs(acted[0], learned[0]),
        max_abs_value=_max_abs(acted[2], learned[2]),
        action_mismatch=float(np.mean(np.any(action_a != action_l, axis=1))) if len(obs) else 0.0,
        bitwise=_identical(acted, learned), export_bitwise=same, seconds=time.perf_counter() - start,
        priors_max_abs=priors)

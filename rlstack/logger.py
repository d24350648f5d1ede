"""Metrics out of the trainer: TensorBoard scalars (tensorboardX), a progress bar or log lines."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tensorboardX import SummaryWriter
from tqdm import tqdm


@dataclass
class TimeSplit:
    """Wall-clock seconds by stage, for the benchmark and `time/…` scalars."""

    env: float = 0.0
    act: float = 0.0
    learn: float = 0.0
    other: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"env": self.env, "act": self.act, "learn": self.learn, "other": self.other}


class RunLogger:
    """Writes namespaced scalars (`rollout/…`, `train/…`, `eval/…`, `time/…`) to `<out>/tb`
    and shows progress: a tqdm bar on a terminal, a plain line every few seconds otherwise."""

    def __init__(self, out_dir: Path, total_steps: int, start_step: int = 0, progress: str = "auto",
                 log_every_seconds: float = 10.0):
        self.writer = SummaryWriter(str(out_dir / "tb"))
        if progress == "auto":
            progress = "bar" if sys.stderr.isatty() else "log"
        self.mode = progress
        self.total_steps = total_steps
        self.log_every = log_every_seconds
        self.last_line = time.perf_counter()
        self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                        smoothing=0.1) if progress == "bar" else None
        self.step = start_step
        self.start = time.perf_counter()
        self.start_step = start_step

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                self.writer.add_scalar(key, value, step)

    def update(self, metrics: dict[str, float], counters: Any) -> tuple[int, float | None, float]:
        """After a learner update: its metrics plus the `rollout/…` episode statistics and
        `time/steps_per_second` to TensorBoard and the progress display. Returns (steps, recent mean
        return, seconds since start) for the run's history."""
        c = counters
        elapsed = time.perf_counter() - self.start
        recent = mean_or_none(c.recent_returns)
        metrics = {**metrics, "rollout/ep_return_mean": recent, "rollout/episodes": c.episodes,
                   "rollout/ep_length_mean": mean_or_none(c.recent_lengths),
                   "time/steps_per_second": (c.steps - self.start_step) / max(elapsed, 1e-9)}
        self.scalars(metrics, c.steps)
        self.progress(c.steps, recent)
        return c.steps, recent, elapsed

    def progress(self, step: int, recent_return: float | None) -> None:
        steps_per_second = (step - self.start_step) / max(time.perf_counter() - self.start, 1e-9)
        ret = "n/a" if recent_return is None else f"{recent_return:.1f}"
        if self.bar is not None:
            self.bar.update(step - self.step)
            self.bar.set_postfix_str(f"{steps_per_second:,.0f} steps/s  return {ret}", refresh=False)
        elif self.mode == "log" and (time.perf_counter() - self.last_line >= self.log_every or step >= self.total_steps):
            self.last_line = time.perf_counter()
            print(f"step {step:>9,}/{self.total_steps:,}  {steps_per_second:8,.0f} steps/s  "
                  f"recent return {ret}", flush=True)
        self.step = step

    def message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        elif self.mode != "off":
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.writer.close()


def mean_or_none(values: Any) -> float | None:
    """The mean of `values` (e.g. recent episode returns), None while there are none."""
    return float(np.mean(values)) if len(values) else None

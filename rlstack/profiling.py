"""MindSpore's Profiler over a bounded window of work units (training updates, served batches).

Serves the profiling stage of the seed's workflow (section 7: "use the MindSpore Profiler; look at
which operators take the time and whether fused operators appear"). A `ProfileWindow` counts the
units its owner reports with `step()`: it skips the first `skip` units (graph compilation and
warm-up would otherwise dominate), records the next `steps` units, then stops the profiler, lets
MindSpore parse its data into `<out>/profile/<worker>_ascend_ms/`, and prints the operators that
took the most time. The window is closed early by `close()` (or leaving the `with` block), so a run
shorter than the window still yields a profile of what it did.

Usage from a loop (the trainer calls `on_update` through `Trainer.update_hooks`)::

    with ProfileWindow(run_dir / "profile", steps=5, skip=2) as window:
        for batch in batches:
            serve(batch)
            window.step()
    print(window.summary.table())
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rlstack.errors import RlstackError
from rlstack.fsutil import atomic_write_text

SUMMARY_FILE = "summary.json"
TABLE_FILE = "top_ops.txt"


class ProfileError(RlstackError, RuntimeError):
    """The profiler cannot be used as asked (bad window, output directory unusable)."""


class OpTime(NamedTuple):
    """Time spent in one operator type over the profiled window."""

    op_type: str
    count: int
    total_ms: float
    avg_ms: float
    share: float
    """Fraction of the operator time of the window (0..1)."""


@dataclass
class ProfileSummary:
    """What one window recorded: where MindSpore wrote it and the operators by total time."""

    profile_dir: Path
    """`<out>/profile`: the directory the window was given."""
    trace_dir: Path | None
    """The `*_ascend_ms` directory MindSpore parsed its data into (its name, not the device)."""
    steps: int
    """Units recorded (fewer than asked when the window was closed early)."""
    seconds: float
    """Wall-clock seconds the recorded units took (profiler overhead included)."""
    ops: list[OpTime] = field(default_factory=list)
    source: str = ""
    """The statistics file the operator table was read from."""

    def table(self, top: int = 10) -> str:
        """The top operators as an aligned text table."""
        head = (f"profile: {self.steps} steps in {self.seconds:.2f} s -> {self.trace_dir or self.profile_dir}")
        if not self.ops:
            return head + "\n  (no operator statistics were found; see the MindSpore profiler log under logs/)"
        width = max(12, *(len(o.op_type) for o in self.ops[:top]))
        lines = [head, f"  {'operator':<{width}} {'calls':>7} {'total ms':>10} {'avg ms':>9} {'share':>7}"]
        for o in self.ops[:top]:
            lines.append(f"  {o.op_type:<{width}} {o.count:>7} {o.total_ms:>10.3f} {o.avg_ms:>9.4f} "
                         f"{100 * o.share:>6.1f}%")
        fused = [o.op_type for o in self.ops if "fusion" in o.op_type.lower() or o.op_type.startswith("GraphKernel")]
        lines.append(f"  fused operators (graph-kernel fusion): {', '.join(fused[:5]) if fused else 'none'}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"profile_dir": str(self.profile_dir), "trace_dir": str(self.trace_dir) if self.trace_dir else None,
                "steps": self.steps, "seconds": self.seconds, "source": self.source,
                "ops": [o._asdict() for o in self.ops]}


def _activities() -> list[Any]:
    import mindspore as ms
    from mindspore.profiler import ProfilerActivity

    target = ms.get_context("device_target")
    if target == "Ascend":
        return [ProfilerActivity.CPU, ProfilerActivity.NPU]
    if target == "GPU":
        return [ProfilerActivity.CPU, ProfilerActivity.GPU]
    return [ProfilerActivity.CPU]


def _float(row: dict[str, str], *keys: str) -> float:
    for key in keys:
        if key in row and row[key] not in ("", None):
            return float(row[key])
    return 0.0


def read_op_statistics(trace_dir: Path) -> tuple[list[OpTime], str]:
    """Operator-type statistics from a parsed profile, biggest total time first.

    Ascend writes `ASCEND_PROFILER_OUTPUT/op_statistic.csv` (times in µs); the CPU and GPU
    backends write `FRAMEWORK/<device>_op_type_info_<rank>.csv` (times in ms).
    """
    ops: dict[str, list[float]] = {}
    sources = sorted(trace_dir.rglob("op_statistic*.csv"))
    if sources:
        source = sources[0]
        with open(source, newline="") as f:
            for row in csv.DictReader(f):
                name = row.get("OP Type") or row.get("Op Type") or row.get("op_type") or "?"
                acc = ops.setdefault(name, [0, 0.0])
                acc[0] += int(_float(row, "Count", "count"))
                acc[1] += _float(row, "Total Time(us)", "Total Time (us)") / 1000.0
    else:
        sources = sorted(trace_dir.rglob("*op_type_info*.csv"))
        if not sources:
            return [], ""
        source = sources[0]
        for path in sources:
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    acc = ops.setdefault(row.get("op_type", "?"), [0, 0.0])
                    acc[0] += int(_float(row, "type_occurrences"))
                    acc[1] += _float(row, "total_compute_time")
    total = sum(v[1] for v in ops.values()) or 1.0
    table = [OpTime(name, int(n), t, t / max(n, 1), t / total) for name, (n, t) in ops.items()]
    table.sort(key=lambda o: o.total_ms, reverse=True)
    return table, str(source)


class ProfileWindow:
    """Profile units `skip + 1 … skip + steps` of whatever calls `step()` after each unit.

    `steps` >= 1, `skip` >= 0. With `skip` = 0 recording starts at construction. Output goes under
    `out_dir` (normally `<run>/profile`); a summary is printed with `printer` and written to
    `out_dir/summary.json` and `out_dir/top_ops.txt`.
    """

    def __init__(self, out_dir: str | Path, steps: int = 5, skip: int = 2, top: int = 10,
                 printer: Callable[[str], None] | None = print):
        if steps < 1:
            raise ProfileError(f"profile steps must be >= 1, got {steps}")
        if skip < 0:
            raise ProfileError(f"profile skip must be >= 0, got {skip}")
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ProfileError(f"profile output {self.out_dir} exists and is not a directory")
        self.steps, self.skip, self.top, self.printer = steps, skip, top, printer
        self.seen = 0
        self.summary: ProfileSummary | None = None
        self._profiler: Any = None
        self._started_at = 0.0
        self._recorded = 0
        self._existing: set[str] = set()
        if skip == 0:
            self._open()

    # ----- the window ---------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self._profiler is not None

    @property
    def done(self) -> bool:
        return self.summary is not None

    def _open(self) -> None:
        from mindspore.profiler import profile, tensorboard_trace_handler

        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._existing = {p.name for p in self.out_dir.iterdir()}
        self._profiler = profile(activities=_activities(), start_profile=False,
                                 on_trace_ready=tensorboard_trace_handler(str(self.out_dir)))
        self._profiler.start()
        self._started_at = time.perf_counter()

    def _finish(self) -> ProfileSummary:
        seconds = time.perf_counter() - self._started_at
        # stop() parses the collected data (on_trace_ready) into a new *_ascend_ms directory.
        self._profiler.stop()
        self._profiler = None
        new = [p for p in self.out_dir.iterdir() if p.is_dir() and p.name not in self._existing
               and p.name.endswith("_ascend_ms")]
        trace_dir = max(new, key=lambda p: p.stat().st_mtime) if new else None
        ops, source = read_op_statistics(trace_dir) if trace_dir else ([], "")
        self.summary = ProfileSummary(self.out_dir, trace_dir, self._recorded, seconds, ops, source)
        atomic_write_text(self.out_dir / SUMMARY_FILE, json.dumps(self.summary.as_dict(), indent=2))
        atomic_write_text(self.out_dir / TABLE_FILE, self.summary.table(self.top) + "\n")
        if self.printer is not None:
            self.printer(self.summary.table(self.top))
        return self.summary

    def step(self) -> None:
        """Report that one unit of work (an update, a served batch) finished."""
        if self.done:
            return
        self.seen += 1
        if self.active:
            self._recorded += 1
            if self._recorded >= self.steps:
                self._finish()
        elif self.seen >= self.skip:
            self._open()

    def on_update(self, counters: Any) -> None:
        """`Trainer.update_hooks` entry: one training update is one unit."""
        self.step()

    def close(self) -> ProfileSummary | None:
        """Stop early if still recording; returns the summary (None if the window never opened)."""
        if self.active:
            return self._finish()
        if self.summary is None and self.printer is not None:
            self.printer(f"profile: nothing recorded; the run ended after {self.seen} steps, before the "
                         f"window opened (skip={self.skip})")
        return self.summary

    def __enter__(self) -> ProfileWindow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

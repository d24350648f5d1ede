"""`python -m rlstack.plot <run dir>… [--out curves.png]`: learning curves of finished or running runs.

Reads the TensorBoard event files the trainer writes to `<run>/tb` (tensorboardX's protobufs; the
`tensorboard` package is not needed) and draws training return (`rollout/ep_return_mean`) and
evaluation return (`eval/mean_return`) against environment steps and against wall-clock time, all
runs overlaid. Runs whose saved `config.yaml` differs only in `seed` are drawn as one curve: the mean
across seeds with a band from the lowest to the highest seed.

A Stable-Baselines3 run kept by `python -m rlstack.bench peer --keep DIR` (`DIR/sb3/<run>`: its
TensorBoard log, e.g. `PPO_1/`, and the `spec.json` it ran) is plotted beside rlstack's: its
`rollout/ep_rew_mean` as the training return, `eval/mean_reward` as the evaluation return.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from rlstack.errors import RlstackError

TRAIN_TAG = "rollout/ep_return_mean"
EVAL_TAG = "eval/mean_return"
SB3_TAGS = {"rollout/ep_rew_mean": TRAIN_TAG, "eval/mean_reward": EVAL_TAG}
"""Stable-Baselines3's names of the same scalars (its Monitor's whole episodes, unclipped)."""
PEER_SPEC = "spec.json"
"""What `bench peer` ran on the SB3 side, written beside its TensorBoard log."""
PEER_RESULT = "result.json"
"""What the SB3 side measured (`bench peer`): its final evaluation is the run's last evaluation
point (SB3's `evaluate_policy` after `learn` writes no scalar)."""


class PlotError(RlstackError, ValueError):
    """A run directory cannot be plotted (no event files, unreadable config)."""


@dataclass
class Series:
    """One scalar over a run: steps, seconds since the run's first event, values (sorted by step)."""

    steps: np.ndarray
    seconds: np.ndarray
    values: np.ndarray


@dataclass
class Run:
    path: Path
    label: str
    group: str
    """Identical for runs whose configs differ only in `seed`."""
    scalars: dict[str, Series] = field(default_factory=dict)


def read_events(path: Path) -> list[tuple[str, int, float, float]]:
    """(tag, step, wall_time, value) of every scalar in one TFRecord event file, plus one
    `("", 0, wall_time, nan)` row for the file's first event (written when the run's logger opened).

    Each record is: uint64 length, uint32 masked CRC of the length, the serialized `Event`, uint32
    masked CRC of the data. A truncated last record (a run still writing) ends the read quietly.
    """
    from tensorboardX.proto import event_pb2

    data = path.read_bytes()
    out: list[tuple[str, int, float, float]] = []
    pos, first = 0, True
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length
        if end + 4 > len(data):
            break
        event = event_pb2.Event.FromString(data[pos + 12:end])
        pos = end + 4
        if first:
            # The clock starts when the run started logging, so compile time shows on the time axis.
            out.append(("", 0, float(event.wall_time), float("nan")))
            first = False
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                out.append((value.tag, int(event.step), float(event.wall_time), float(value.simple_value)))
            elif kind == "tensor" and value.tensor.float_val:
                out.append((value.tag, int(event.step), float(event.wall_time), float(value.tensor.float_val[0])))
    return out


def load_run(path: str | Path) -> Run:
    """All scalars of a run directory (every event file under `<run>/tb`, e.g. after a resume), or
    of a Stable-Baselines3 run kept by `bench peer` (its event files anywhere under `path`)."""
    path = Path(path)
    peer = (path / PEER_SPEC).is_file()
    if peer:
        files = sorted(path.rglob("events.out.tfevents.*"))
    else:
        files = sorted((path / "tb").glob("events.out.tfevents.*")) if (path / "tb").is_dir() else []
    if not files:
        raise PlotError(f"{path} has no TensorBoard event files under {path if peer else path / 'tb'} "
                        "(expected a run directory written by `python -m rlstack.train`, or a "
                        "Stable-Baselines3 run kept by `python -m rlstack.bench peer --keep`)")
    rows = [row for f in files for row in read_events(f)]
    if peer:
        rows = [(SB3_TAGS.get(tag, tag), *rest) for tag, *rest in rows] + _peer_final_eval(path, rows)
    if not any(tag for tag, *_ in rows):
        raise PlotError(f"{path}: the event files hold no scalars yet")
    start = min(r[2] for r in rows)
    by_tag: dict[str, list[tuple[int, float, float]]] = {}
    for tag, step, wall, value in rows:
        if tag:
            by_tag.setdefault(tag, []).append((step, wall - start, value))
    scalars = {}
    for tag, points in by_tag.items():
        points.sort()
        arr = np.asarray(points, np.float64)
        scalars[tag] = Series(arr[:, 0], arr[:, 1], arr[:, 2])
    config = _peer_config(path) if peer else _config(path)
    label = path.name
    if config:
        label = f"{config.get('algo', '?')} {config.get('env', {}).get('id', '?')} seed {config.get('seed', '?')}"
        group_cfg = {k: v for k, v in config.items() if k != "seed"}
        group = json.dumps(group_cfg, sort_keys=True, default=str)
    else:
        group = str(path.resolve())
    return Run(path, label, group, scalars)


def _peer_final_eval(path: Path, rows: list[tuple[str, int, float, float]]) -> list[tuple[str, int, float, float]]:
    """The SB3 side's final evaluation (`PEER_RESULT`) as an evaluation scalar at its last step and
    time, if it was recorded."""
    try:
        result = json.loads((path / PEER_RESULT).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(result, dict) or "eval_mean_return" not in result or not rows:
        return []
    start = min(r[2] for r in rows)
    return [(EVAL_TAG, int(result.get("steps", max(r[1] for r in rows))), start + float(result.get("seconds", 0.0)),
             float(result["eval_mean_return"]))]


def _peer_config(path: Path) -> dict | None:
    """A kept SB3 run's spec as a config: labelled `SB3 <algo>`, grouped apart from rlstack's."""
    try:
        spec = json.loads((path / PEER_SPEC).read_text())
    except (OSError, ValueError) as err:
        raise PlotError(f"{path / PEER_SPEC} is not readable JSON: {err}") from None
    if not isinstance(spec, dict):
        return None
    return {**spec, "algo": f"SB3 {spec.get('algo', '?')}", "env": {"id": spec.get("env", "?")},
            "tensorboard": None}


def _config(path: Path) -> dict | None:
    file = path / "config.yaml"
    if not file.is_file():
        return None
    try:
        loaded = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise PlotError(f"{file} is not valid YAML: {err}") from None
    return loaded if isinstance(loaded, dict) else None


def _group_label(runs: list[Run]) -> str:
    first = runs[0]
    if len(runs) == 1:
        return f"{first.label} ({first.path.name})"
    base = first.label.rsplit(" seed ", 1)[0]
    return f"{base} ({len(runs)} seeds: mean, min-max; {first.path.name}, ...)"


def _draw(ax, runs: list[Run], tag: str, x_key: str, color) -> bool:
    series = [r.scalars[tag] for r in runs if tag in r.scalars]
    if not series:
        return False
    label = _group_label(runs)
    if len(series) == 1:
        s = series[0]
        x = getattr(s, x_key)
        if len(x) == 1:
            ax.plot(x, s.values, "o", color=color, label=label)
        else:
            ax.plot(x, s.values, color=color, label=label)
        return True
    if x_key == "seconds":
        # Seeds of one config take different wall-clock times (compilation, a busy machine), so an
        # average over time would mix different stages of training: draw each seed in the group colour.
        for i, s in enumerate(series):
            style = "o" if len(s.values) == 1 else "-"
            ax.plot(s.seconds, s.values, style, color=color, alpha=0.8, linewidth=1,
                    label=f"{label.split(' (')[0]} ({len(series)} seeds, one line each)" if i == 0 else None)
        return True
    # Mean and spread across seeds on one step grid; a point averages the seeds that reached it.
    lo = min(getattr(s, x_key)[0] for s in series)
    hi = max(getattr(s, x_key)[-1] for s in series)
    if hi <= lo or any(len(s.values) == 1 for s in series):
        x = float(np.mean([getattr(s, x_key)[-1] for s in series]))
        ys = np.asarray([s.values[-1] for s in series])
        mean = float(ys.mean())
        ax.errorbar([x], [mean], yerr=[[mean - ys.min()], [ys.max() - mean]], fmt="o", color=color, capsize=3,
                    label=label)
        return True
    grid = np.linspace(lo, hi, 200)
    ys = np.asarray([np.interp(grid, getattr(s, x_key), s.values, left=np.nan, right=np.nan) for s in series])
    covered = ~np.isnan(ys).all(0)
    grid, ys = grid[covered], ys[:, covered]
    ax.plot(grid, np.nanmean(ys, 0), color=color, label=label)
    ax.fill_between(grid, np.nanmin(ys, 0), np.nanmax(ys, 0), color=color, alpha=0.2, linewidth=0)
    return True


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs that differ only in their seed share a group; identical configs (same seed too) do not."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    result: dict[str, list[Run]] = {}
    for key, members in groups.items():
        seeds = [m.label.rsplit(" seed ", 1)[-1] for m in members]
        if len(set(seeds)) == len(members):
            result[key] = members
        else:
            for m in members:
                result[str(m.path.resolve())] = [m]
    return result


def plot_runs(runs: list[Run], out: str | Path, title: str | None = None) -> Path:
    """Write a 2x2 PNG: training and evaluation return against steps and against wall-clock time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rlstack.fsutil import atomic_write_bytes

    groups = group_runs(runs)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [(TRAIN_TAG, "steps", "training return (last 100 episodes)"),
              (TRAIN_TAG, "seconds", "training return (last 100 episodes)"),
              (EVAL_TAG, "steps", "evaluation return (deterministic)"),
              (EVAL_TAG, "seconds", "evaluation return (deterministic)")]
    cmap = plt.get_cmap("tab10")
    for ax, (tag, x_key, ylabel) in zip(axes.reshape(-1), panels, strict=True):
        drawn = False
        for i, members in enumerate(groups.values()):
            drawn |= _draw(ax, members, tag, x_key, cmap(i % 10))
        ax.set_xlabel("environment steps" if x_key == "steps" else "wall-clock seconds since start")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no '{tag}' scalars", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title or f"{len(runs)} run(s)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    out = Path(out)
    atomic_write_bytes(out, buf.getvalue())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.plot",
                                     description="Plot training and evaluation return of run directories.")
    parser.add_argument("runs", nargs="+", help="run directories (each with tb/ event files), or SB3 runs "
                                                "kept by `python -m rlstack.bench peer --keep DIR` (DIR/sb3/*)")
    parser.add_argument("--out", default="curves.png", help="PNG to write (default curves.png)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    if not args.out.lower().endswith(".png"):
        print(f"error: --out must name a .png file, got '{args.out}'", file=sys.stderr)
        return 2
    try:
        runs = [load_run(p) for p in args.runs]
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = plot_runs(runs, args.out, args.title)
    print(f"wrote {out} ({len(runs)} run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())

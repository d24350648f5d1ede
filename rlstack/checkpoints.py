"""Checkpoints of a run: `<out>/checkpoints/step_N/` (parameters, counters, config, extras) and `LATEST`.

A checkpoint directory is written under a temp name, fsynced and renamed into place, and `LATEST`
is replaced atomically, so a crash leaves the previous checkpoint whole. Extras are the other
state a run must keep (the replay buffer, the self-play pool, the best evaluation): anything with
`save(path)` and `load(path)`, one file each.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mindspore as ms

from rlstack.fsutil import atomic_directory, atomic_write_text

CHECKPOINT_FILE = "state.ckpt"
STATE_FILE = "trainer.json"
CONFIG_FILE = "config.yaml"


@dataclass
class Counters:
    """The run's counters, true after any number of resumes: saved in every checkpoint."""

    steps: int = 0
    updates: int = 0
    episodes: int = 0
    wall_seconds: float = 0.0
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=100))
    recent_lengths: deque = field(default_factory=lambda: deque(maxlen=100))

    def state(self) -> dict[str, Any]:
        return {"steps": self.steps, "updates": self.updates, "episodes": self.episodes,
                "wall_seconds": self.wall_seconds, "recent_returns": list(self.recent_returns),
                "recent_lengths": list(self.recent_lengths)}

    def load(self, state: dict[str, Any]) -> None:
        self.steps, self.updates, self.episodes = state["steps"], state["updates"], state["episodes"]
        self.wall_seconds = state["wall_seconds"]
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])


class ResumeError(RuntimeError):
    """A run directory cannot be resumed (no checkpoint, or the checkpoint does not fit)."""


def save(checkpoint_dir: Path, steps: int, cell: Any, state: dict[str, Any], config_yaml: str,
         extras: dict[str, Any], keep: int) -> Path:
    """Write `step_<steps>/` and point LATEST at it; keep the newest `keep` checkpoints."""
    name = f"step_{steps:010d}"
    target = checkpoint_dir / name
    if target.exists():
        return target
    with atomic_directory(target) as tmp:
        ms.save_checkpoint(cell, str(tmp / CHECKPOINT_FILE))
        (tmp / STATE_FILE).write_text(json.dumps(state))
        (tmp / CONFIG_FILE).write_text(config_yaml)
        for filename, extra in extras.items():
            extra.save(tmp / filename)
    atomic_write_text(checkpoint_dir / "LATEST", name + "\n")
    kept = sorted(p for p in checkpoint_dir.glob("step_*") if p.is_dir())
    for old in kept[: max(0, len(kept) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def latest(out: Path) -> Path:
    """The checkpoint directory `<out>/checkpoints/LATEST` names."""
    pointer = out / "checkpoints" / "LATEST"
    if not pointer.is_file():
        raise ResumeError(f"{out} has no checkpoints/LATEST: nothing to resume")
    return out / "checkpoints" / pointer.read_text().strip()


def load(path: Path, cell: Any) -> dict[str, Any]:
    """Load the parameters into `cell` (refusing any that do not fit) and return the saved state."""
    params = ms.load_checkpoint(str(path / CHECKPOINT_FILE))
    expected = {p.name for p in cell.get_parameters()}
    missing, unexpected = expected - set(params), set(params) - expected
    if missing or unexpected:
        raise ResumeError(f"checkpoint {path} does not fit this config: missing {sorted(missing)[:5]}, "
                          f"unexpected {sorted(unexpected)[:5]}")
    for p in cell.get_parameters():
        if tuple(p.shape) != tuple(params[p.name].shape):
            raise ResumeError(f"checkpoint {path}: '{p.name}' has shape {tuple(params[p.name].shape)}, "
                              f"this config builds {tuple(p.shape)}")
    ms.load_param_into_net(cell, params, strict_load=True)
    return json.loads((path / STATE_FILE).read_text())


def params_digest(path: Path) -> str:
    """sha256 over every saved parameter's name and bytes: equal digests, bitwise equal networks
    and optimizer states (how the tests check that a resumed run computes what an unstopped one does)."""
    params = ms.load_checkpoint(str(path / CHECKPOINT_FILE))
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].asnumpy().tobytes())
    return h.hexdigest()


class Checkpointer:
    """One run's checkpoints under `directory`: the algorithm's state Cell, the counters, the
    training RNG, the observation statistics and the extras (anything with `save(path)` and
    `load(path)`, one file each: the replay buffer, the self-play pool, the best evaluation)."""

    def __init__(self, directory: Path, cell: Any, counters: Counters, rng: Any, obs_rms: Any, config_yaml: str,
                 keep: int):
        self.directory, self.cell, self.counters, self.rng, self.obs_rms = directory, cell, counters, rng, obs_rms
        self.config_yaml, self.keep = config_yaml, keep
        self.extras: dict[str, Any] = {}
        self.resumed_from: Path | None = None

    def add_extra(self, filename: str, extra: Any) -> None:
        """Save `extra` as `<checkpoint>/<filename>` from now on; if the run resumed from a
        checkpoint holding that file, load it now."""
        self.extras[filename] = extra
        if self.resumed_from is not None and (self.resumed_from / filename).is_file():
            extra.load(self.resumed_from / filename)

    def save(self, **more: Any) -> Path:
        state = {**self.counters.state(), "rng": self.rng.bit_generator.state,
                 "obs_rms": self.obs_rms.state() if self.obs_rms is not None else None, **more}
        return save(self.directory, self.counters.steps, self.cell, state, self.config_yaml, self.extras, self.keep)

    def load(self, path: Path) -> dict[str, Any]:
        """Restore everything saved at `path`; returns the saved state (for the caller's own keys)."""
        state = load(path, self.cell)
        self.counters.load(state)
        self.rng.bit_generator.state = state["rng"]
        if self.obs_rms is not None and state["obs_rms"] is not None:
            self.obs_rms.load(state["obs_rms"])
        self.resumed_from = path
        for filename, extra in self.extras.items():
            if (path / filename).is_file():
                extra.load(path / filename)
        return state

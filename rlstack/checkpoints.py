"""Checkpoints of a run: `<out>/checkpoints/step_N/` (parameters, counters, config, extras) and `LATEST`.

A checkpoint directory is written under a temp name, fsynced and renamed into place, and `LATEST`
is replaced atomically, so a crash leaves the previous checkpoint whole. `checksums.json` holds
the sha256 of every file; a checkpoint with a missing, truncated or modified file is refused
before anything is loaded, with a message naming the file and the earlier checkpoints. Extras are the other
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

from rlstack.errors import RlstackError
from rlstack.fsutil import atomic_directory, atomic_write_text, sha256_file

CHECKPOINT_FILE = "state.ckpt"
STATE_FILE = "trainer.json"
CONFIG_FILE = "config.yaml"
CHECKSUMS_FILE = "checksums.json"


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


class ResumeError(RlstackError, RuntimeError):
    """A run directory cannot be resumed (no checkpoint, or the checkpoint does not fit)."""


class CheckpointError(RlstackError, RuntimeError):
    """A checkpoint could not be written (the previous one is left as it was)."""


def save(checkpoint_dir: Path, steps: int, cell: Any, state: dict[str, Any], config_yaml: str,
         extras: dict[str, Any], keep: int) -> Path:
    """Write `step_<steps>/` and point LATEST at it; keep the newest `keep` checkpoints."""
    name = f"step_{steps:010d}"
    target = checkpoint_dir / name
    if target.exists():
        return target
    try:
        with atomic_directory(target) as tmp:
            ms.save_checkpoint(cell, str(tmp / CHECKPOINT_FILE))
            (tmp / STATE_FILE).write_text(json.dumps(state))
            (tmp / CONFIG_FILE).write_text(config_yaml)
            for filename, extra in extras.items():
                extra.save(tmp / filename)
            sums = {f.name: sha256_file(f) for f in sorted(tmp.iterdir()) if f.is_file()}
            (tmp / CHECKSUMS_FILE).write_text(json.dumps(sums, indent=1))
        atomic_write_text(checkpoint_dir / "LATEST", name + "\n")
    except (OSError, RuntimeError) as err:  # (MindSpore reports a failed write as RuntimeError)
        pointer = checkpoint_dir / "LATEST"
        previous = pointer.read_text().strip() if pointer.is_file() else None
        intact = f"the previous checkpoint {checkpoint_dir / previous} is intact" if previous else "no checkpoint yet"
        raise CheckpointError(f"could not write checkpoint {target}: {err} (disk full or a file size limit?); "
                              f"{intact}. Free space, then continue with: python -m rlstack.train --resume "
                              f"{checkpoint_dir.parent}") from err
    kept = sorted(p for p in checkpoint_dir.glob("step_*") if p.is_dir())
    for old in kept[: max(0, len(kept) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in checkpoint_dir.glob(".step_*.tmp"):  # left by a process killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    return target


def verify(path: Path) -> None:
    """Refuse a checkpoint whose files do not match its checksums (naming the file), before any
    of it is loaded."""
    def refuse(what: str) -> ResumeError:
        earlier = sorted(p.name for p in path.parent.glob("step_*") if p.is_dir() and p.name < path.name)
        hint = (f"; resume from an earlier checkpoint with: python -m rlstack.train --resume "
                f"{path.parent / earlier[-1]} (earlier: {', '.join(earlier)})" if earlier else
                "; there is no earlier checkpoint in " + str(path.parent))
        return ResumeError(what + hint)

    if not path.is_dir():
        raise refuse(f"checkpoint {path} does not exist")
    sums_file = path / CHECKSUMS_FILE
    try:
        sums = json.loads(sums_file.read_text())
    except (OSError, ValueError) as err:
        raise refuse(f"checkpoint {path} is incomplete or corrupt: {sums_file} unreadable ({err})") from None
    for filename, expected in sums.items():
        file = path / filename
        if not file.is_file():
            raise refuse(f"checkpoint file {file} is missing")
        if sha256_file(file) != expected:
            raise refuse(f"checkpoint file {file} is corrupt (truncated or modified: its sha256 does not "
                         f"match {sums_file})")


def latest(out: Path) -> Path:
    """The checkpoint directory `<out>/checkpoints/LATEST` names."""
    pointer = out / "checkpoints" / "LATEST"
    if not pointer.is_file():
        raise ResumeError(f"{out} has no checkpoints/LATEST: nothing to resume")
    return out / "checkpoints" / pointer.read_text().strip()


def locate(path: Path) -> tuple[Path, Path]:
    """(run directory, checkpoint) for `--resume PATH`: a run directory (its LATEST checkpoint)
    or one checkpoint directory `<run>/checkpoints/step_N`."""
    if (path / STATE_FILE).is_file() or (path.parent.name == "checkpoints" and path.name.startswith("step_")):
        return path.parent.parent, path
    return path, latest(path)


def rewind(checkpoint: Path) -> list[Path]:
    """Make `checkpoint` the run's newest: later checkpoints are renamed `replaced_step_N` (kept
    for inspection, never loaded) and LATEST points at it. Returns the renamed directories."""
    directory, moved = checkpoint.parent, []
    for later in sorted(p for p in directory.glob("step_*") if p.is_dir() and p.name > checkpoint.name):
        target = directory / f"replaced_{later.name}"
        shutil.rmtree(target, ignore_errors=True)
        later.rename(target)
        moved.append(target)
    atomic_write_text(directory / "LATEST", checkpoint.name + "\n")
    return moved


def load(path: Path, cell: Any) -> dict[str, Any]:
    """Verify the files, load the parameters into `cell` (refusing any that do not fit) and return
    the saved state."""
    verify(path)
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

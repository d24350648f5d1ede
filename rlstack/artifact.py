"""The policy artifact (docs/DESIGN.md, contract 3): MindIR export of the acting graph, its
manifest, and loading.

Layout: `<run>/policy/v000012/{policy.mindir, manifest.json}` (a game's network adds its priors
entry point, `priors.mindir`) plus `<run>/policy/LATEST` naming the newest version. This module is the only caller of `mindspore.export` / `mindspore.load`.
A version directory is written under a temp name and renamed into place, and `LATEST` is
replaced atomically, so a reader never sees a half-written version. Loading verifies the
sha256 and the manifest before anything is built, and refuses a mismatch with a message that
says what differs and what was expected.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from rlstack.errors import RlstackError
from rlstack.fsutil import atomic_directory, atomic_write_text, sha256_file
from rlstack.network import BLOCK_ROWS, Network, PriorsGraph
from rlstack.spaces import MaskedBox, flat_masked_space, obs_dtype_of

GRAPH_FILE = "policy.mindir"
PRIORS_FILE = "priors.mindir"
"""The priors entry point of a game's network (`rlstack.network.PriorsGraph`), beside the acting graph."""
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
_VERSION_RE = re.compile(r"^v(\d{6})$")


class ArtifactError(RlstackError, RuntimeError):
    """A policy artifact is missing, corrupt, or does not match what the caller expects."""


def _json_floats(values: np.ndarray) -> list[float | str]:
    # Strict JSON has no Infinity; unbounded Box limits are written as "inf" / "-inf"
    # (np.asarray(..., dtype=np.float32) reads them back).
    return [float(v) if np.isfinite(v) else str(float(v)) for v in np.asarray(values, np.float64).reshape(-1)]


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """A JSON-safe description of a Discrete or Box space (as stored in manifests).

    A masked Dict observation is described as `type: Dict` with its keys, plus the `shape` and
    `flat_layout` of the one float32 vector the graph takes (so `Acting.obs_shape` still works).
    """
    space = flat_masked_space(space)
    if isinstance(space, MaskedBox):
        return {"type": "Dict", "shape": list(space.shape), "dtype": "float32",
                "spaces": {k: space_to_dict(v) for k, v in space.dict_space.spaces.items()},
                "flat_layout": space.layout()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(space.shape)}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": _json_floats(space.low), "high": _json_floats(space.high)}
    raise ArtifactError(f"space {space} cannot be described in a manifest")


def version_name(number: int) -> str:
    return f"v{number:06d}"


def list_versions(policy_dir: Path, scheduled: bool = False) -> list[Path]:
    """Finished version directories, oldest first (temp directories are ignored).

    `scheduled`: only the versions of the run's schedule (`train.export_every`), not the one a
    signal's stop exported (manifest `trigger: stop`): opponent pools and evaluation snapshots
    use these, so a stopped and resumed run plays against what an unstopped run plays against."""
    if not policy_dir.is_dir():
        return []
    found = sorted(p for p in policy_dir.iterdir() if p.is_dir() and _VERSION_RE.match(p.name))
    return [p for p in found if not _stop_export(str(p))] if scheduled else found


@functools.lru_cache(maxsize=4096)
def _stop_export(version_dir: str) -> bool:
    """(A finished version never changes: its manifest is read once.)"""
    try:
        return json.loads((Path(version_dir) / MANIFEST_FILE).read_text()).get("trigger") == "stop"
    except (OSError, ValueError):
        return False


def interface(network: Network, obs_space: gym.Space, action_space: gym.Space) -> dict[str, Any]:
    """The manifest entries that describe how to call the acting graph (the live network's as well
    as an exported version's: `rlstack.acting.Acting` reads them)."""
    obs_shape = tuple(int(d) for d in flat_masked_space(obs_space).shape)  # a masked Dict enters flat
    return {
        "observation_space": space_to_dict(obs_space),
        "action_space": space_to_dict(action_space),
        "noise": {"kind": network.noise_kind.value, "dim": network.noise_dim},
        "inputs": {"obs": [None, *obs_shape], "noise": [None, network.noise_dim],
                   "obs_dtype": obs_dtype_of(obs_space).name},
        # the encoder before the heads, and for a conv encoder the convolutions' form it holds
        "encoder": {"name": network.encoder_name, "conv_form": network.encoder.form},
        "outputs": ["action", "logp", "value"],
        # V(s) (state_value), max_a Q (max_q), min_i Q_i(s, a) (min_q), or zeros (none)
        "value": network.value_kind,
        "dtype": "float32",
        "obs_normalization": {"enabled": bool(network.spec.normalize_obs), "clip": network.spec.obs_clip},
        # `parity: strict` graphs are batch-invariant when called on whole blocks of this many
        # rows (Acting.run pads); 1: any batch, invariance not promised (network.BLOCK_ROWS).
        "batch_rows": BLOCK_ROWS if network.spec.batch_invariant else 1,
    }


def export_policy(network: Network, policy_dir: str | Path, *, algorithm: str, obs_space: gym.Space,
                  action_space: gym.Space, device: str, fusion: bool, config_hash: str,
                  keep: int = 0, extra: dict[str, Any] | None = None) -> Path:
    """Export `network.act` as MindIR with a dynamic batch dimension, next version number.

    Returns the new version directory. `keep` > 0 removes the oldest versions beyond that count.
    """
    policy_dir = Path(policy_dir)
    versions = list_versions(policy_dir)
    number = int(versions[-1].name[1:]) + 1 if versions else 1
    name = version_name(number)
    obs_shape = tuple(int(d) for d in flat_masked_space(obs_space).shape)  # a masked Dict enters flat
    try:
        with atomic_directory(policy_dir / name) as tmp:
            ms.export(network, Tensor(shape=[None, *obs_shape], dtype=ms.uint8 if network.frames else ms.float32),
                      Tensor(shape=[None, network.noise_dim], dtype=ms.float32),
                      file_name=str(tmp / "policy"), file_format="MINDIR")
            graph = tmp / GRAPH_FILE
            if not graph.is_file():
                raise ArtifactError(f"mindspore.export did not write {graph}")
            entry_points = {}
            if network.has_priors:
                ms.export(PriorsGraph(network), Tensor(shape=[None, *obs_shape], dtype=ms.float32),
                          file_name=str(tmp / "priors"), file_format="MINDIR")
                if not (tmp / PRIORS_FILE).is_file():
                    raise ArtifactError(f"mindspore.export did not write {tmp / PRIORS_FILE}")
                entry_points["priors"] = {"graph_file": PRIORS_FILE, "sha256": sha256_file(tmp / PRIORS_FILE),
                                          "inputs": {"obs": [None, *obs_shape]}, "outputs": ["logp_all", "value"]}
            manifest = {
                "format_version": FORMAT_VERSION,
                "version": name,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "algorithm": algorithm,
                **interface(network, obs_space, action_space),
                "mindspore_version": ms.__version__,
                "device": device,
                "fusion": bool(fusion),
                "config_hash": config_hash,
                "sha256": sha256_file(graph),
                "graph_file": GRAPH_FILE,
                # further graphs of the same network and parameters (a game's `priors`)
                "entry_points": entry_points,
                **(extra or {}),
            }
            (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, allow_nan=False))
        atomic_write_text(policy_dir / "LATEST", name + "\n")
    except OSError as err:  # disk full, a file size limit: the published versions stay as they are
        raise ArtifactError(f"could not write policy version {policy_dir / name}: {err}; {policy_dir / 'LATEST'} "
                            "still names the previous version") from err
    for stale in policy_dir.glob(".v*.tmp"):  # left by a process killed while exporting
        shutil.rmtree(stale, ignore_errors=True)
    if keep > 0:
        for old in list_versions(policy_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return policy_dir / name


def resolve_version_dir(path: str | Path) -> Path:
    """A run dir, a `policy/` dir (follows LATEST) or a version dir -> the version dir."""
    path = Path(path)
    if (path / MANIFEST_FILE).is_file():
        return path
    for policy_dir in (path, path / "policy"):
        latest = policy_dir / "LATEST"
        if latest.is_file():
            name = latest.read_text().strip()
            if not _VERSION_RE.match(name):
                raise ArtifactError(f"{latest} names '{name}', which is not a policy version (v000001 ...)")
            version = policy_dir / name
            if not (version / MANIFEST_FILE).is_file():
                raise ArtifactError(f"{latest} points at {version}, which has no {MANIFEST_FILE}")
            return version
    raise ArtifactError(f"{path} is not a run directory, a policy/ directory or a policy version "
                        f"(no {MANIFEST_FILE}, no LATEST, no policy/LATEST)")


def version_files(path: str | Path) -> dict[str, bytes]:
    """One version's files as bytes (manifest, graph and its further entry points' graphs), to
    send where the run directory is not: the receiver writes them with `write_version` and loads
    them with `load_graph`, which verifies the sha256 the manifest records, as for a version read
    from disk."""
    version_dir = resolve_version_dir(path)
    names = (MANIFEST_FILE, *_graph_files(read_manifest(version_dir), version_dir))
    try:
        return {name: (version_dir / name).read_bytes() for name in names}
    except OSError as err:
        raise ArtifactError(f"{version_dir} cannot be read: {err}") from None


def write_version(files: dict[str, bytes], dest: str | Path) -> Path:
    """Write a version sent as `version_files` to `dest` (a new directory, written atomically):
    exactly the manifest and the graph files it names."""
    if MANIFEST_FILE not in files:
        raise ArtifactError(f"a policy version is sent with its {MANIFEST_FILE}; got {', '.join(sorted(files))}")
    try:
        manifest = json.loads(files[MANIFEST_FILE])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"the {MANIFEST_FILE} sent cannot be read: {err}") from None
    expected = {MANIFEST_FILE, *_graph_files(manifest, f"the {MANIFEST_FILE} sent")}
    if set(files) != expected:
        raise ArtifactError(f"a policy version is sent as its manifest and the graphs it names "
                            f"({', '.join(sorted(expected))}); got {', '.join(sorted(files))}")
    with atomic_directory(dest) as tmp:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
    return Path(dest)


def _graph_files(manifest: Any, where: object) -> tuple[str, ...]:
    """The graph files a manifest names (the acting graph, then each entry point's): plain file
    names in the version directory."""
    try:
        names = (manifest["graph_file"],
                 *(entry["graph_file"] for entry in manifest.get("entry_points", {}).values()))
    except (TypeError, KeyError, AttributeError):
        raise ArtifactError(f"{where}: the manifest names no graph_file for each graph") from None
    for name in names:
        if not isinstance(name, str) or Path(name).name != name or name.startswith(".") or name == MANIFEST_FILE:
            raise ArtifactError(f"{where}: graph file {name!r} is not a file name in the version directory")
    return names


_REQUIRED = ("format_version", "version", "algorithm", "observation_space", "action_space", "noise",
             "dtype", "mindspore_version", "device", "fusion", "sha256", "graph_file")


def read_manifest(version_dir: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((version_dir / MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{version_dir / MANIFEST_FILE} cannot be read: {err}") from None
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise ArtifactError(f"{version_dir / MANIFEST_FILE} lacks {', '.join(missing)}")
    if manifest["format_version"] != FORMAT_VERSION:
        raise ArtifactError(f"{version_dir}: manifest format {manifest['format_version']}, "
                            f"this rlstack reads format {FORMAT_VERSION}")
    return manifest


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def check_manifest(manifest: dict[str, Any], where: Path, *, obs_shape: tuple[int, ...] | None = None,
                   device: str | None = None, fusion: bool | None = None) -> None:
    """Refuse what cannot run correctly; warn on what is harmless (documented in README)."""
    if _major_minor(manifest["mindspore_version"]) != _major_minor(ms.__version__):
        raise ArtifactError(f"{where}: exported by MindSpore {manifest['mindspore_version']}, this process runs "
                            f"MindSpore {ms.__version__}; MindIR is only loaded within the same major.minor "
                            "version (re-export the policy or install the matching MindSpore)")
    if manifest["dtype"] != "float32":
        raise ArtifactError(f"{where}: graph dtype is {manifest['dtype']}, expected float32")
    expected_shape = tuple(manifest["observation_space"].get("shape", ()))
    if obs_shape is not None and tuple(obs_shape) != expected_shape:
        raise ArtifactError(f"{where}: the policy takes observations of shape {expected_shape}, "
                            f"the caller expects {tuple(obs_shape)}")
    if device is not None and device != manifest["device"]:
        # A MindIR graph is device-neutral; the numbers may differ in the last bits across devices.
        warnings.warn(f"{where}: exported on device '{manifest['device']}', running on '{device}' "
                      "(results may differ in the last bits from training)", stacklevel=3)
    if fusion is not None and bool(fusion) != bool(manifest["fusion"]):
        # The seed's classic train/serve skew: graph-kernel fusion is a compile option of the
        # process running the graph, so the same MindIR is fused differently (speed, last bits).
        warnings.warn(f"{where}: trained with graph-kernel fusion {'on' if manifest['fusion'] else 'off'}, "
                      f"running with it {'on' if fusion else 'off'} (set `fusion` the same in both "
                      "for identical kernels)", stacklevel=3)


class LoadedGraph(NamedTuple):
    """A verified policy version as loaded: the graph, its manifest, its version directory
    (`rlstack.acting.load_policy` makes it an `Acting`), and its further entry points by name."""

    graph: nn.GraphCell
    manifest: dict[str, Any]
    path: Path
    entry_points: dict[str, nn.GraphCell] = {}


_RACE_RETRIES = 20
"""How often `load_graph` follows LATEST again when the version it read is pruned meanwhile."""


def latest_name(path: str | Path) -> str | None:
    """The version `LATEST` names in a `policy/` dir or a run dir (None: nothing published yet)."""
    path = Path(path)
    for latest in (path / "LATEST", path / "policy" / "LATEST"):
        with contextlib.suppress(OSError):
            return latest.read_text().strip() or None
    return None


def load_graph(path: str | Path, *, obs_shape: tuple[int, ...] | None = None,
               device: str | None = None, fusion: bool | None = None) -> LoadedGraph:
    """Load and verify a policy from a run dir, a `policy/` dir or a version dir.

    Checks the manifest, the sha256 of the graph file and (when given) the observation shape
    before building anything; raises ArtifactError saying what differs. Given a run or
    `policy/` dir it loads the version LATEST names; if that version is pruned while it is
    being loaded (`train.keep_versions` with frequent exports), it follows LATEST again.
    `device`/`fusion` (the caller's runtime) only warn when they differ from training.
    """
    path = Path(path)
    if (path / MANIFEST_FILE).is_file():
        return _load_version(path, obs_shape, device, fusion)
    for _ in range(_RACE_RETRIES):
        tried = latest_name(path)
        try:
            return _load_version(resolve_version_dir(path), obs_shape, device, fusion)
        except ArtifactError:
            # Pruning only removes versions older than the newest, so a version that vanished
            # under us means LATEST has moved on; anything else is a real error.
            if tried is None or latest_name(path) == tried:
                raise
    raise ArtifactError(f"{path}: LATEST kept moving to versions that were pruned before they could be "
                        f"loaded ({_RACE_RETRIES} tries); is train.keep_versions too small?")


def _load_version(version_dir: Path, obs_shape: tuple[int, ...] | None, device: str | None,
                  fusion: bool | None) -> LoadedGraph:
    manifest = read_manifest(version_dir)
    check_manifest(manifest, version_dir, obs_shape=obs_shape, device=device, fusion=fusion)
    graph = _load_checked(version_dir / manifest["graph_file"], manifest["sha256"])
    entry_points = {name: _load_checked(version_dir / entry["graph_file"], entry["sha256"])
                    for name, entry in manifest.get("entry_points", {}).items()}
    return LoadedGraph(graph, manifest, version_dir, entry_points)


def _load_checked(graph_path: Path, sha256: str) -> nn.GraphCell:
    """A graph file whose sha256 is the manifest's, loaded; ArtifactError otherwise."""
    try:
        data = graph_path.read_bytes()
    except OSError as err:
        raise ArtifactError(f"{graph_path} cannot be read: {err}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ArtifactError(f"{graph_path} is corrupt: sha256 {digest[:16]}… but the manifest records "
                            f"{sha256[:16]}…; refusing to load it")
    try:
        return nn.GraphCell(ms.load(str(graph_path)))
    except Exception as err:  # MindSpore raises RuntimeError/ValueError variants on bad files
        raise ArtifactError(f"{graph_path} passed its checksum but MindSpore cannot load it: {err}") from None

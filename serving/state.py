"""The policy server's state (serving stage): what the routes reach through
`request.app.state.server`, and the hot reload of policy versions (`Reloader`): a new version is
loaded and verified beside the one being served and swapped in only when it works; a version
that fails any check is refused, logged and counted, and the old one keeps serving."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rlstack.acting import Policy, load_policy
from rlstack.artifact import MANIFEST_FILE, ArtifactError, latest_name, resolve_version_dir
from rlstack.runtime import Runtime
from rlstack.serving.batcher import Batcher, ServedPolicy
from rlstack.serving.metrics import ServeMetrics
from rlstack.serving.settings import ServeSettings

log = logging.getLogger("rlstack.serve")


@dataclass
class ServerState:
    """What the routes reach through `request.app.state.server`; built in the lifespan hook."""

    settings: ServeSettings
    metrics: ServeMetrics
    batcher: Batcher
    reloader: Reloader
    rng: np.random.Generator  # noise for requests without a seed


# ----- hot reload ----------------------------------------------------------------------------

class ReloadOutcome(NamedTuple):
    result: str  # reloaded | unchanged | refused
    detail: str


def check_compatible(old: Policy, new: Policy) -> None:
    """A hot-swapped version must take and give what clients already send and expect."""
    def interface(p: Policy) -> dict[str, Any]:
        action = {k: v for k, v in p.manifest["action_space"].items() if k not in ("low", "high")}
        return {"observation shape": list(p.obs_shape), "action space": action, "noise": p.manifest["noise"]}

    before, after = interface(old), interface(new)
    for key in before:
        if before[key] != after[key]:
            raise ArtifactError(f"{new.path}: {key} is {after[key]}, the server serves {before[key]}; "
                                "restart the server to serve a policy with another interface")


def latest_file(path: Path) -> Path | None:
    """The LATEST pointer to watch for `path` (None when `path` is one version directory)."""
    if (path / MANIFEST_FILE).is_file():
        return None
    for candidate in (path / "LATEST", path / "policy" / "LATEST"):
        if candidate.is_file():
            return candidate
    return None


class Reloader:
    """Follows LATEST: load + verify the new version off the event loop, swap it in between batches."""

    def __init__(self, settings: ServeSettings, runtime: Runtime, batcher: Batcher, metrics: ServeMetrics,
                 loader: ThreadPoolExecutor):
        self._settings = settings
        self._runtime = runtime
        self._batcher = batcher
        self._metrics = metrics
        self._loader = loader
        self._lock = asyncio.Lock()
        self._refused: str | None = None  # a refused version is not retried by polling, only by POST
        self.latest = latest_file(settings.policy)

    async def reload(self, force: bool) -> ReloadOutcome:
        async with self._lock:
            current = self._batcher.served
            loop = asyncio.get_running_loop()
            try:
                version_dir = await loop.run_in_executor(self._loader, resolve_version_dir, self._settings.policy)
            except ArtifactError as err:  # e.g. LATEST names a version that is not there
                return self._refuse(str(err), self._latest_name())
            if version_dir.name == current.version:
                return ReloadOutcome("unchanged", f"already serving {current.version}")
            if not force and version_dir.name == self._refused:
                return ReloadOutcome("refused", f"{version_dir.name} was refused before")
            t0 = time.perf_counter()
            try:
                # From the run/policy dir, not version_dir: load_policy follows LATEST again when
                # the version it read was pruned meanwhile (train.keep_versions).
                policy = await loop.run_in_executor(self._loader, self._load)
                if policy.version == current.version:
                    return ReloadOutcome("unchanged", f"already serving {current.version}")
                check_compatible(current.policy, policy)
                served = ServedPolicy.of(policy, current.buckets)
                await self._batcher.compile(served)
            except Exception as err:  # a bad artifact of any kind must never stop the server
                return self._refuse(f"{type(err).__name__}: {err}", version_dir.name)
            self._batcher.swap(served)
            self._refused = None
            self._metrics.reloads.labels("ok").inc()
            self._metrics.serving(served.policy, previous=current.policy)
            detail = f"now serving {served.version} (was {current.version}; loaded in {time.perf_counter() - t0:.2f} s)"
            log.info("reload: %s", detail)
            return ReloadOutcome("reloaded", detail)

    def _latest_name(self) -> str | None:
        return latest_name(self._settings.policy) if self.latest else None

    def _load(self) -> Policy:
        return load_policy(self._settings.policy, device=self._runtime.device, fusion=self._runtime.fusion)

    def _refuse(self, reason: str, name: str | None) -> ReloadOutcome:
        self._refused = name
        self._metrics.reloads.labels("refused").inc()
        detail = f"refused {name or 'the new version'}: {reason}; still serving {self._batcher.served.version}"
        log.error("reload: %s", detail)
        return ReloadOutcome("refused", detail)

    async def poll(self, every_s: float) -> None:
        """Check LATEST every `every_s` seconds (a tiny file read) and reload when it names another version."""
        if self.latest is None:
            return
        while True:
            await asyncio.sleep(every_s)
            try:
                name = self._latest_name()
                if name is not None and name not in (self._batcher.served.version, self._refused):
                    await self.reload(force=False)
            except Exception:  # keep watching whatever happened to the files
                log.exception("reload: checking %s failed", self.latest)

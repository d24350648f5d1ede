"""Exports of the learner's acting graph: published versions with their parity check, and the
private acting graph the in-process actor and the actor processes start from."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlstack.acting import Acting, load_policy
from rlstack.artifact import export_policy
from rlstack.config import Config, config_hash
from rlstack.envs.games import env_game
from rlstack.parity import ParityReport, RecentObs, measure_parity, parity_rows, sample_rows


class Publisher:
    """Exports `network.act` for one run (`<out>/policy/vN` or a private directory) and measures
    parity of every published version against the live module (docs/DESIGN.md, contract 4)."""

    def __init__(self, cfg: Config, network: Any, obs_space: gym.Space, action_space: gym.Space, runtime: Any,
                 recent_obs: RecentObs):
        self.cfg, self.network, self.runtime, self.recent_obs = cfg, network, runtime, recent_obs
        self.obs_space, self.action_space = obs_space, action_space
        self.parity: dict[str, Any] = {}
        """Latest `parity/…` values, copied into summary.json."""
        self._private: list[Path] = []

    def export(self, policy_dir: Path, steps: int, updates: int, keep: int = 0, trigger: str = "schedule") -> Path:
        """The next version in `policy_dir` (`keep` > 0: only the newest `keep` stay); `trigger`
        `stop` marks a signal's export, which opponent pools skip (`artifact.list_versions`)."""
        return export_policy(
            self.network, policy_dir, algorithm=self.cfg.algo, obs_space=self.obs_space,
            action_space=self.action_space, device=self.runtime.device, fusion=self.runtime.fusion,
            config_hash=config_hash(self.cfg), keep=keep,
            extra={"env_id": self.cfg.env.id, "game": env_game(self.cfg.env.id, self.cfg.env.kwargs), "steps": steps,
                   "updates": updates, "parity": self.cfg.parity, "trigger": trigger})

    def check_parity(self, version_dir: Path, updates: int) -> ParityReport:
        """Run the exported version and the live module on the same recent observations and
        noise (rlstack/parity.py): the exported graph at the rollout batch, the module at the
        learner's minibatch."""
        policy = load_policy(version_dir, device=self.runtime.device, fusion=self.runtime.fusion)
        rollout_batch = self.cfg.env.n_envs
        minibatch = int(getattr(self.cfg.train, "batch_size", rollout_batch))
        rows = parity_rows(rollout_batch, minibatch)
        rng = np.random.default_rng([self.cfg.seed, updates])  # not the training RNG
        obs = sample_rows(self.recent_obs.get(), rows, policy.obs_shape, rng, policy.obs_dtype)
        live = Acting.of_network(self.network, self.obs_space, self.action_space)
        report = measure_parity(policy, live, obs, policy.noise(rows, rng),
                                rollout_batch=rollout_batch, minibatch=minibatch)
        self.parity.update(report.metrics())
        self.parity["parity/version"] = report.version
        return report

    def private_graph(self, updates: int) -> Path:
        """The acting graph exported to a private directory (not a published version), removed by
        `close()`: what actors load before the first version is published."""
        self._private.append(Path(tempfile.mkdtemp(prefix="rlstack-acting-")))
        return self.export(self._private[-1], 0, updates)

    def close(self) -> None:
        for path in self._private:
            shutil.rmtree(path, ignore_errors=True)
        self._private.clear()

"""The generic training loop: collect with the acting graph -> learn -> log -> checkpoint -> evaluate.

Algorithms supply the network and the update; everything around it (vector envs, the rollout,
observation statistics, time-limit bootstrapping, TensorBoard, checkpoints, resume, the final
evaluation and `summary.json`) lives here once.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import mindspore as ms
import numpy as np
import yaml
from mindspore import Tensor

from rlstack import registry
from rlstack.artifact import export_policy
from rlstack.buffers import RolloutBuffer, RunningMeanStd
from rlstack.config import Config, config_hash, load_config, to_dict, to_yaml
from rlstack.envs import make_vector_env
from rlstack.fsutil import atomic_directory, atomic_write_text
from rlstack.logger import RunLogger
from rlstack.network import Network, sample_noise
from rlstack.runtime import configure

CHECKPOINT_FILE = "state.ckpt"


class ResumeError(RuntimeError):
    """A run directory cannot be resumed (no checkpoint, or the checkpoint does not fit)."""


@dataclass
class TimeSplit:
    """Wall-clock seconds by stage, for the benchmark and `time/…` scalars."""

    env: float = 0.0
    act: float = 0.0
    learn: float = 0.0
    other: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"env": self.env, "act": self.act, "learn": self.learn, "other": self.other}


@dataclass
class Counters:
    steps: int = 0
    updates: int = 0
    episodes: int = 0
    wall_seconds: float = 0.0
    recent_returns: deque = field(default_factory=lambda: deque(maxlen=100))
    recent_lengths: deque = field(default_factory=lambda: deque(maxlen=100))


class Acting:
    """Host-side wrapper of the acting graph: numpy in, numpy out, one graph call per batch."""

    def __init__(self, network: Network, action_space: gym.Space):
        self.network = network
        self.noise_kind, self.noise_dim = network.noise_kind, network.noise_dim
        self.box = isinstance(action_space, gym.spaces.Box)
        if self.box:
            self.low, self.high = action_space.low, action_space.high

    def __call__(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        action, logp, value = self.network(Tensor(np.asarray(obs, np.float32)), Tensor(noise))
        return action.asnumpy(), logp.asnumpy(), value.asnumpy()

    def noise(self, batch: int, rng: np.random.Generator | None) -> np.ndarray:
        """Sampling noise, or zeros (the deterministic action) when rng is None."""
        if rng is None:
            return np.zeros((batch, self.noise_dim), np.float32)
        return sample_noise(self.noise_kind, self.noise_dim, batch, rng)

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """The action the env receives: Gaussian samples are clipped to the Box (as SB3)."""
        return np.clip(action, self.low, self.high) if self.box else action


def evaluate(network: Network, cfg: Config, episodes: int, seed: int) -> np.ndarray:
    """Deterministic returns of `episodes` episodes, run side by side (one graph call per step)."""
    envs = make_vector_env(cfg.env.id, episodes, "sync", cfg.env.kwargs)
    acting = Acting(network, envs.single_action_space)
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, bool)
    zeros = acting.noise(episodes, None)
    while running.any():
        action, _, _ = acting(obs, zeros)
        obs, reward, terminated, truncated, _ = envs.step(acting.to_env(action))
        returns += reward * running
        running &= ~(terminated | truncated)
    envs.close()
    return returns


def default_out_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.algo}_{cfg.env.id}_s{cfg.seed}_{stamp}"


class Trainer:
    """Owns one run directory: `<out>/tb`, `<out>/checkpoints/`, `<out>/summary.json`."""

    def __init__(self, cfg: Config, out_dir: str | Path | None = None):
        self.cfg = cfg
        self.out = Path(out_dir) if out_dir is not None else default_out_dir(cfg)
        self.runtime = configure(cfg.device, cfg.fusion)
        ms.set_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.envs = make_vector_env(cfg.env.id, cfg.env.n_envs, cfg.env.vector, cfg.env.kwargs)
        self.obs_space = self.envs.single_observation_space
        self.action_space = self.envs.single_action_space
        self.algo = registry.get(cfg.algo).build(cfg, self.obs_space, self.action_space)
        self.network: Network = self.algo.network
        self.acting = Acting(self.network, self.action_space)
        self.obs_rms = RunningMeanStd(self.obs_space.shape) if cfg.net.normalize_obs else None
        self.counters = Counters()
        self.split = TimeSplit()
        self.resumed = False

    # ----- checkpoints -------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def save_checkpoint(self) -> Path:
        """Network, optimizer, normaliser, counters, RNG and resolved config, written atomically."""
        name = f"step_{self.counters.steps:010d}"
        target = self.checkpoint_dir / name
        if target.exists():
            return target
        state = {
            "steps": self.counters.steps, "updates": self.counters.updates, "episodes": self.counters.episodes,
            "wall_seconds": self.counters.wall_seconds,
            "recent_returns": list(self.counters.recent_returns),
            "recent_lengths": list(self.counters.recent_lengths),
            "rng": self.rng.bit_generator.state,
            "obs_rms": self.obs_rms.state() if self.obs_rms else None,
        }
        with atomic_directory(target) as tmp:
            ms.save_checkpoint(self.algo.state_cell(), str(tmp / CHECKPOINT_FILE))
            (tmp / "trainer.json").write_text(json.dumps(state))
            (tmp / "config.yaml").write_text(to_yaml(self.cfg))
        atomic_write_text(self.checkpoint_dir / "LATEST", name + "\n")
        kept = sorted(p for p in self.checkpoint_dir.glob("step_*") if p.is_dir())
        for old in kept[: max(0, len(kept) - self.cfg.train.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def load_checkpoint(self, path: Path) -> None:
        params = ms.load_checkpoint(str(path / CHECKPOINT_FILE))
        cell = self.algo.state_cell()
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
        state = json.loads((path / "trainer.json").read_text())
        c = self.counters
        c.steps, c.updates, c.episodes = state["steps"], state["updates"], state["episodes"]
        c.wall_seconds = state["wall_seconds"]
        c.recent_returns.extend(state["recent_returns"])
        c.recent_lengths.extend(state["recent_lengths"])
        self.rng.bit_generator.state = state["rng"]
        if self.obs_rms is not None and state["obs_rms"] is not None:
            self.obs_rms.load(state["obs_rms"])
        self.resumed = True

    @classmethod
    def resume(cls, out_dir: str | Path, overrides: list[str] | None = None) -> Trainer:
        """Continue the run in `out_dir` from its latest checkpoint, with optional overrides
        (e.g. a larger `train.total_steps`)."""
        out = Path(out_dir)
        latest = out / "checkpoints" / "LATEST"
        if not latest.is_file():
            raise ResumeError(f"{out} has no checkpoints/LATEST: nothing to resume")
        path = out / "checkpoints" / latest.read_text().strip()
        saved = yaml.safe_load((path / "config.yaml").read_text())
        cfg = load_config(base=saved, overrides=overrides)
        trainer = cls(cfg, out)
        trainer.load_checkpoint(path)
        return trainer

    # ----- export -----------------------------------------------------------------------------

    @property
    def policy_dir(self) -> Path:
        return self.out / "policy"

    def export(self) -> Path:
        """Export the acting graph as the next policy version (obs statistics included)."""
        if self.obs_rms is not None:
            self.network.set_obs_stats(self.obs_rms.mean, self.obs_rms.var)
        return export_policy(
            self.network, self.policy_dir, algorithm=self.cfg.algo, obs_space=self.obs_space,
            action_space=self.action_space, device=self.runtime.device, fusion=self.runtime.fusion,
            config_hash=config_hash(self.cfg), keep=self.cfg.train.keep_versions,
            extra={"env_id": self.cfg.env.id, "steps": self.counters.steps, "updates": self.counters.updates})

    # ----- the loop ----------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        if not self.resumed and (self.checkpoint_dir / "LATEST").exists():
            raise ResumeError(f"{self.out} already holds a run; resume it with --resume {self.out} "
                              "or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "config.yaml", to_yaml(self.cfg))
        total = self.cfg.train.total_steps
        self.log = RunLogger(self.out, total, self.counters.steps, self.cfg.train.progress,
                             self.cfg.train.log_every_seconds)
        start, start_steps = time.perf_counter(), self.counters.steps
        try:
            if not self.algo.on_policy:
                raise NotImplementedError(f"algorithm '{self.cfg.algo}' is off-policy; the off-policy loop "
                                          "is not part of this trainer yet")
            self._train_on_policy(total)
        finally:
            self.envs.close()
        elapsed = time.perf_counter() - start
        self.counters.wall_seconds += elapsed
        self.split.other = elapsed - self.split.env - self.split.act - self.split.learn
        self.save_checkpoint()
        version = self.export()
        returns = evaluate(self.network, self.cfg, self.cfg.env.eval_episodes, self.cfg.seed + 10_000)
        summary = {
            "eval/mean_return": float(returns.mean()), "eval/std_return": float(returns.std()),
            "eval/returns": returns.tolist(),
            "total_steps": self.counters.steps, "updates": self.counters.updates,
            "episodes": self.counters.episodes,
            "rollout/ep_return_mean": _mean(self.counters.recent_returns),
            "wall_seconds": self.counters.wall_seconds,
            "steps_per_second": (self.counters.steps - start_steps) / max(elapsed, 1e-9),
            "time_split_seconds": self.split.as_dict(),
            "seed": self.cfg.seed, "algo": self.cfg.algo, "env": self.cfg.env.id,
            "policy_version": version.name,
            "config": to_dict(self.cfg),
        }
        self.log.scalars({"eval/mean_return": summary["eval/mean_return"],
                          "eval/std_return": summary["eval/std_return"]}, self.counters.steps)
        self.log.message(f"eval: mean return {summary['eval/mean_return']:.2f} +- {summary['eval/std_return']:.2f} "
                         f"over {len(returns)} episodes; {summary['steps_per_second']:,.0f} steps/s")
        self.log.close()
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2))
        return summary

    def _train_on_policy(self, total: int) -> None:
        algo, cfg, acting = self.algo, self.cfg, self.acting
        n_envs = cfg.env.n_envs
        buffer = RolloutBuffer(algo.rollout_len, n_envs, self.obs_space.shape,
                               self.action_space.shape, np.int32 if not acting.box else np.float32)
        obs, _ = self.envs.reset(seed=cfg.seed + 1_000 * self.counters.updates)
        ep_return, ep_length = np.zeros(n_envs), np.zeros(n_envs, np.int64)
        split = self.split
        while self.counters.steps < total:
            if self.obs_rms is not None:
                # Statistics are frozen for a rollout so the recorded logp is what learning sees.
                self.network.set_obs_stats(self.obs_rms.mean, self.obs_rms.var)
            for _ in range(algo.rollout_len):
                t1 = time.perf_counter()
                action, logp, value = acting(obs, acting.noise(n_envs, self.rng))
                t2 = time.perf_counter()
                next_obs, reward, terminated, truncated, info = self.envs.step(acting.to_env(action))
                t3 = time.perf_counter()
                split.act += t2 - t1
                split.env += t3 - t2
                reward = reward.astype(np.float32)
                ep_return += reward
                ep_length += 1
                cut = truncated & ~terminated
                if cut.any():
                    # Time-limit truncation is not a terminal state: bootstrap from V(final_obs).
                    final = np.stack(info["final_obs"][cut]).astype(np.float32)
                    _, _, final_value = acting(final, acting.noise(len(final), None))
                    reward[cut] += algo.gamma * final_value
                done = terminated | truncated
                buffer.add(obs, action, logp, value, reward, done)
                for i in np.flatnonzero(done):
                    self.counters.recent_returns.append(float(ep_return[i]))
                    self.counters.recent_lengths.append(int(ep_length[i]))
                    self.counters.episodes += 1
                ep_return[done], ep_length[done] = 0.0, 0
                if self.obs_rms is not None:
                    self.obs_rms.update(next_obs)
                obs = next_obs
            self.counters.steps += algo.rollout_len * n_envs
            _, _, last_value = acting(obs, acting.noise(n_envs, None))
            batch = buffer.finish(last_value, algo.gamma, algo.gae_lambda)
            progress_remaining = max(0.0, 1.0 - (self.counters.steps - algo.rollout_len * n_envs) / total)
            t5 = time.perf_counter()
            metrics = algo.learn(batch, progress_remaining, self.rng)
            t6 = time.perf_counter()
            split.learn += t6 - t5
            self.counters.updates += 1
            self._log_update(metrics)
            if cfg.train.export_every and self.counters.updates % cfg.train.export_every == 0:
                self.export()
            if cfg.train.checkpoint_every and self.counters.updates % cfg.train.checkpoint_every == 0:
                self.save_checkpoint()

    def _log_update(self, metrics: dict[str, float]) -> None:
        c = self.counters
        elapsed = time.perf_counter() - self.log.start
        metrics = dict(metrics)
        metrics["rollout/ep_return_mean"] = _mean(c.recent_returns)
        metrics["rollout/ep_length_mean"] = _mean(c.recent_lengths)
        metrics["rollout/episodes"] = c.episodes
        metrics["time/steps_per_second"] = (c.steps - self.log.start_step) / max(elapsed, 1e-9)
        self.log.scalars(metrics, c.steps)
        self.log.progress(c.steps, metrics["rollout/ep_return_mean"])


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None

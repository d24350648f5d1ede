"""The generic training loop: collect with the acting graph -> learn -> log -> checkpoint -> evaluate.

Algorithms supply the network and the update; everything around it (vector envs, the rollout,
observation statistics, time-limit bootstrapping, TensorBoard, checkpoints, resume, the final
evaluation and `summary.json`) lives here once.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import mindspore as ms
import numpy as np
import yaml
from mindspore import Tensor

from rlstack import registry
from rlstack.artifact import export_policy, load_policy
from rlstack.buffers import RolloutBuffer, RunningMeanStd
from rlstack.config import Config, ConfigError, config_hash, load_config, to_dict, to_yaml
from rlstack.envs import make_vector_env
from rlstack.fsutil import atomic_directory, atomic_write_text
from rlstack.logger import RunLogger
from rlstack.network import Network, sample_noise
from rlstack.parity import RecentObs, measure_parity, padded, parity_rows, sample_rows
from rlstack.replay import CHECKPOINT_REPLAY_MAX_BYTES, REPLAY_FILE, ReplayBuffer, random_actions
from rlstack.runtime import configure
from rlstack.selfplay_eval import attach_selfplay

CHECKPOINT_FILE = "state.ckpt"
RECENT_OBS = 4096
"""Observations kept for the parity check after each export."""


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


@dataclass
class BestEval:
    """The best periodic deterministic evaluation of a run and the parameters that scored it."""

    mean_return: float
    steps: int
    params: dict[str, np.ndarray]
    rank: tuple[float, ...]
    """What "best" compares, larger is better: `(mean_return,)`, or on the games
    (-losses vs minimax, -losses vs random, wins vs random)."""


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
        if cfg.parity == "strict" and not self.network.spec.batch_invariant:
            raise ConfigError(f"parity: strict needs a batch-invariant network, but algorithm '{cfg.algo}' "
                              "builds its NetSpec without batch_invariant=True (use parity: fast)")
        self.acting = Acting(self.network, self.action_space)
        # The learner's own module; `train()` replaces `acting` by the exported graph
        # (serving/actor.py) unless a caller installed another acting path first.
        self.live_acting = self.acting
        self.recent_obs = RecentObs(RECENT_OBS)
        self.parity: dict[str, Any] = {}
        """Latest `parity/…` values (exports and PPO's ratio check), copied into summary.json."""
        self._acting_dir: Path | None = None
        self.obs_rms = RunningMeanStd(self.obs_space.shape) if cfg.net.normalize_obs else None
        self.counters = Counters()
        self.split = TimeSplit()
        self.history: list[tuple[int, float | None, float]] = []
        """(steps, recent mean episode return, seconds since start) after every update."""
        self.resumed = False
        # Called as hook(trainer) after every learner update: profiling windows, the consistency
        # benchmark's weight refresh of its acting path.
        self.update_hooks: list[Callable[[Trainer], None]] = []
        # Extra state saved as one file inside every checkpoint directory (e.g. the replay
        # buffer): filename -> object with save(path) and load(path). See add_checkpoint_extra.
        self.checkpoint_extras: dict[str, Any] = {}
        self.resumed_from: Path | None = None
        self.best: BestEval | None = None
        """The best periodic evaluation so far (`train.eval_every`)."""
        self._next_eval = cfg.train.eval_every
        if cfg.train.eval_every:
            self.update_hooks.append(Trainer._periodic_eval)

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
            for filename, extra in self.checkpoint_extras.items():
                extra.save(tmp / filename)
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
        self.resumed_from = path

    def add_checkpoint_extra(self, filename: str, extra: Any) -> None:
        """Save `extra` (anything with `save(path)` and `load(path)`) as `<checkpoint>/<filename>`
        in every checkpoint from now on; if this run resumed from a checkpoint holding that file,
        load it now."""
        self.checkpoint_extras[filename] = extra
        if self.resumed_from is not None and (self.resumed_from / filename).is_file():
            extra.load(self.resumed_from / filename)

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
        self._push_obs_stats()
        version = self._export_to(self.policy_dir, keep=self.cfg.train.keep_versions)
        self.check_parity(version)
        return version

    def _export_to(self, policy_dir: Path, keep: int = 0) -> Path:
        return export_policy(
            self.network, policy_dir, algorithm=self.cfg.algo, obs_space=self.obs_space,
            action_space=self.action_space, device=self.runtime.device, fusion=self.runtime.fusion,
            config_hash=config_hash(self.cfg), keep=keep,
            extra={"env_id": self.cfg.env.id, "steps": self.counters.steps, "updates": self.counters.updates,
                   "parity": self.cfg.parity})

    def check_parity(self, version_dir: Path) -> Any:
        """Run the exported version and the live module on the same recent observations and
        noise (rlstack/parity.py); log `parity/…` to TensorBoard and the console."""
        policy = load_policy(version_dir, device=self.runtime.device, fusion=self.runtime.fusion)
        rollout_batch = self.cfg.env.n_envs
        minibatch = int(getattr(self.cfg.train, "batch_size", rollout_batch))
        rows = parity_rows(rollout_batch, minibatch)
        rng = np.random.default_rng([self.cfg.seed, self.counters.updates])  # not the training RNG
        obs = sample_rows(self.recent_obs.get(), rows, policy.obs_shape, rng)
        # A strict graph is called on whole BLOCK_ROWS-row blocks; the live module the same way.
        live = padded(self.live_acting, int(policy.manifest.get("batch_rows", 1)))
        report = measure_parity(policy, live, obs, policy.noise(rows, False, rng),
                                rollout_batch=rollout_batch, minibatch=minibatch)
        self.parity.update(report.metrics())
        self.parity["parity/version"] = report.version
        log = getattr(self, "log", None)
        if log is not None:
            log.scalars(report.metrics(), self.counters.steps)
            log.message(report.line())
        return report

    # ----- acting ----------------------------------------------------------------------------

    def _export_acting_graph(self) -> Path:
        """The acting graph exported to a private directory (not a published version): what the
        in-process actor and the actor processes load before the first version is published."""
        self._push_obs_stats()
        self._acting_dir = Path(tempfile.mkdtemp(prefix="rlstack-acting-"))
        return self._export_to(self._acting_dir)

    def _graph_acting(self) -> Any:
        """The in-process actor: the exported graph, its weights refreshed from the learner after
        every update (and when DQN's epsilon changes) instead of a new export each time."""
        from rlstack.serving.actor import GraphActing

        policy = load_policy(self._export_acting_graph(), device=self.runtime.device, fusion=self.runtime.fusion)
        acting = GraphActing(policy, version=self.counters.updates, recent=self.recent_obs)
        acting.follow(self.network, lambda: (self.counters.updates, getattr(self.algo, "epsilon", None)))
        return acting

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
        selfplay = attach_selfplay(self)  # None unless the env is a self-play game (envs/selfplay.py)
        if self.cfg.actors and selfplay is not None:
            raise ConfigError("actors >= 1 does not support self-play envs (the opponent pool lives in the "
                              "learner's env); use actors: 0")
        start, start_steps = time.perf_counter(), self.counters.steps
        try:
            if self.cfg.actors:
                self._train_with_actors(total)
            else:
                if self.acting is self.live_acting:
                    self.acting = self._graph_acting()
                if self.algo.on_policy:
                    self._train_on_policy(total)
                else:
                    self._train_off_policy(total)
        finally:
            self.envs.close()
            if self._acting_dir is not None:
                shutil.rmtree(self._acting_dir, ignore_errors=True)
        elapsed = time.perf_counter() - start
        self.counters.wall_seconds += elapsed
        self.split.other = elapsed - self.split.env - self.split.act - self.split.learn
        self.save_checkpoint()  # the last network: --resume continues the run itself
        best = self.best if self.cfg.train.keep_best else None
        if best is not None:
            self._restore_best()
            self.log.message(f"final policy: the network of the best evaluation ({best.mean_return:.2f} at "
                             f"{best.steps:,} steps)")
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
            "eval/best_mean_return": self.best.mean_return if self.best else None,
            "eval/best_steps": self.best.steps if self.best else None,
            "final_policy": "best" if best is not None else "last",
            **self.parity,
            "config": to_dict(self.cfg),
        }
        self.log.scalars({"eval/mean_return": summary["eval/mean_return"],
                          "eval/std_return": summary["eval/std_return"]}, self.counters.steps)
        self.log.message(f"eval: mean return {summary['eval/mean_return']:.2f} +- {summary['eval/std_return']:.2f} "
                         f"over {len(returns)} episodes; {summary['steps_per_second']:,.0f} steps/s")
        if selfplay is not None:
            summary.update(selfplay.finish(self, again=best is not None))
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
            # Statistics are frozen for a rollout so the recorded logp is what learning sees.
            self._push_obs_stats()
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
            # Learner version minus the version of the weights that collected the rollout.
            metrics["rollout/staleness_mean"] = self.counters.updates - getattr(acting, "version", self.counters.updates)
            self.counters.updates += 1
            self._log_update(metrics)
            self._run_update_hooks()
            if cfg.train.export_every and self.counters.updates % cfg.train.export_every == 0:
                self.export()
            if cfg.train.checkpoint_every and self.counters.updates % cfg.train.checkpoint_every == 0:
                self.save_checkpoint()

    def _train_off_policy(self, total: int) -> None:
        """Collect with the acting graph -> store in the replay buffer -> every `train_freq` vector
        steps, `algo.learn` (`gradient_steps` gradient steps) once `learning_starts` steps are in.

        Uniformly random actions before `learning_starts`. An episode that ended at a step is
        stored with its real last observation (`info["final_obs"]`) and with terminated and
        truncated kept apart, so the learner bootstraps through time limits.
        """
        algo, cfg, acting, split = self.algo, self.cfg, self.acting, self.split
        tc, n_envs, counters = cfg.train, cfg.env.n_envs, self.counters
        mode = self.envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            # With NEXT_STEP autoreset the step after an episode end is a dead transition and
            # there is no info["final_obs"]: the replay buffer would store wrong next_obs.
            raise RuntimeError(f"the off-policy loop needs a vector env with SAME_STEP autoreset; "
                               f"{cfg.env.id} was built with {mode}")
        replay = ReplayBuffer.for_spaces(tc.buffer_size, self.obs_space, self.action_space)
        keep = tc.checkpoint_replay if tc.checkpoint_replay is not None else (
            replay.nbytes <= CHECKPOINT_REPLAY_MAX_BYTES)
        if keep:
            self.add_checkpoint_extra(REPLAY_FILE, replay)
        self.log.message(f"replay buffer: {replay.capacity:,} transitions x {replay.bytes_per_transition} B = "
                         f"{replay.nbytes / 2**20:,.1f} MiB, {'saved' if keep else 'not saved'} with checkpoints")
        # A resumed run without its replay buffer refills it before learning again.
        min_replay = min(tc.batch_size, max(tc.learning_starts, 1))
        obs, _ = self.envs.reset(seed=cfg.seed + 1_000 * counters.updates)
        ep_return, ep_length = np.zeros(n_envs), np.zeros(n_envs, np.int64)
        since_update, last_log, pending = 0, counters.steps, []
        if self.obs_rms is not None:
            algo.set_obs_stats(self.obs_rms.mean, self.obs_rms.var)
        while counters.steps < total:
            t1 = time.perf_counter()
            if counters.steps < tc.learning_starts:
                action = random_actions(self.action_space, n_envs, self.rng)
            else:
                algo.before_step(1.0 - counters.steps / total)  # e.g. DQN's epsilon schedule
                action, _, _ = acting(obs, acting.noise(n_envs, self.rng))
            action = acting.to_env(action)
            t2 = time.perf_counter()
            next_obs, reward, terminated, truncated, info = self.envs.step(action)
            t3 = time.perf_counter()
            split.act += t2 - t1
            split.env += t3 - t2
            done = terminated | truncated
            real_next = next_obs
            if done.any():
                # SAME_STEP autoreset: next_obs already starts the next episode for these envs.
                real_next = next_obs.copy()
                for i in np.flatnonzero(done):
                    real_next[i] = info["final_obs"][i]
            replay.add(obs, action, reward, real_next, terminated, truncated)
            ep_return += reward
            ep_length += 1
            for i in np.flatnonzero(done):
                counters.recent_returns.append(float(ep_return[i]))
                counters.recent_lengths.append(int(ep_length[i]))
                counters.episodes += 1
            ep_return[done], ep_length[done] = 0.0, 0
            if self.obs_rms is not None:
                self.obs_rms.update(next_obs)
            obs = next_obs
            counters.steps += n_envs
            since_update += 1
            if since_update == tc.train_freq:
                since_update = 0
                if counters.steps > tc.learning_starts and len(replay) >= min_replay:
                    if self.obs_rms is not None:
                        algo.set_obs_stats(self.obs_rms.mean, self.obs_rms.var)
                    t5 = time.perf_counter()
                    pending.append(algo.learn(replay, max(0.0, 1.0 - counters.steps / total), self.rng,
                                              counters.steps))
                    split.learn += time.perf_counter() - t5
                    counters.updates += 1
                    self._run_update_hooks()
                    if tc.export_every and counters.updates % tc.export_every == 0:
                        self.export()
                    if tc.checkpoint_every and counters.updates % tc.checkpoint_every == 0:
                        self.save_checkpoint()
            if counters.steps - last_log >= tc.log_every_steps or counters.steps >= total:
                # Updates can be every step (SAC): TensorBoard gets their mean every log_every_steps.
                keys = {k for m in pending for k in m}
                self._log_update({k: float(np.mean([m[k] for m in pending if k in m])) for k in keys})
                last_log, pending = counters.steps, []

    # ----- actors: N (rlstack/serving/actor.py) ---------------------------------------------------

    def _train_with_actors(self, total: int) -> None:
        """`actors: N`: N processes collect with the exported graph; this process only learns.

        Each actor steps its own `env.n_envs` envs and sends chunks of `train.n_steps` (PPO) or
        `train.train_freq` (off-policy) vector steps, every step tagged with the version of the
        weights that chose it; after every update the learner publishes its weights to the
        actors through shared memory (exports still happen every `train.export_every`)."""
        from rlstack.serving.actor import ActorPool, ActorSpec, GraphActing, weights_of

        cfg, algo = self.cfg, self.algo
        bootstrap = self._export_acting_graph()
        layout = GraphActing(load_policy(bootstrap)).layout
        steps = algo.rollout_len if algo.on_policy else cfg.train.train_freq
        spec = ActorSpec(env_id=cfg.env.id, n_envs=cfg.env.n_envs, steps=steps, policy_dir=str(self.policy_dir),
                         bootstrap=str(bootstrap), seed=cfg.seed + 1_000 * self.counters.updates,
                         vector=cfg.env.vector, env_kwargs=dict(cfg.env.kwargs), device=cfg.device,
                         fusion=cfg.fusion, next_obs=not algo.on_policy)
        box = isinstance(self.action_space, gym.spaces.Box)
        pool = ActorPool(spec, cfg.actors, layout, tuple(self.obs_space.shape), tuple(self.action_space.shape),
                         "float32" if box else "int32")
        self.log.message(f"actors: {cfg.actors} processes x {cfg.env.n_envs} envs, chunks of {steps} steps")

        def publish() -> None:
            explore = not algo.on_policy and self.counters.steps < cfg.train.learning_starts
            pool.publish(weights_of(self.network, layout), self.counters.updates, explore)

        with pool:
            pool.start(weights_of(self.network, layout), self.counters.updates,
                       not algo.on_policy and self.counters.steps < cfg.train.learning_starts)
            if algo.on_policy:
                self._learn_on_policy_from(pool, publish, total)
            else:
                self._learn_off_policy_from(pool, publish, total)

    def _receive(self, pool: Any) -> Any:
        """The next chunk from the actors; episode counters and recent obs updated."""
        start = time.perf_counter()
        traj = pool.get()
        self.split.act += time.perf_counter() - start  # the learner waiting for actors
        c = self.counters
        for ret, length in zip(traj.episode_returns, traj.episode_lengths, strict=True):
            c.recent_returns.append(float(ret))
            c.recent_lengths.append(int(length))
            c.episodes += 1
        self.recent_obs.add(traj.obs.reshape(-1, *traj.obs.shape[2:]))
        if self.obs_rms is not None:
            self.obs_rms.update(traj.obs.reshape(-1, *traj.obs.shape[2:]))
        return traj

    def _staleness(self, traj: Any) -> dict[str, float]:
        stale = self.counters.updates - traj.version
        return {"rollout/staleness_mean": float(stale.mean()), "rollout/staleness_max": float(stale.max()),
                "rollout/actor_env_seconds": traj.env_seconds, "rollout/actor_act_seconds": traj.act_seconds}

    def _after_update(self, metrics: dict[str, float] | None, publish: Callable[[], None]) -> None:
        cfg, c = self.cfg, self.counters
        c.updates += 1
        publish()
        if metrics is not None:
            self._log_update(metrics)
        self._run_update_hooks()
        if cfg.train.export_every and c.updates % cfg.train.export_every == 0:
            self.export()
        if cfg.train.checkpoint_every and c.updates % cfg.train.checkpoint_every == 0:
            self.save_checkpoint()

    def _learn_on_policy_from(self, pool: Any, publish: Callable[[], None], total: int) -> None:
        algo, n_envs = self.algo, self.cfg.env.n_envs
        box = isinstance(self.action_space, gym.spaces.Box)
        buffer = RolloutBuffer(algo.rollout_len, n_envs, self.obs_space.shape, self.action_space.shape,
                               np.float32 if box else np.int32)
        while self.counters.steps < total:
            traj = self._receive(pool)
            # The actor measured V(final_obs) of time-limit truncations; fold it in as the trainer does.
            reward = traj.reward + algo.gamma * traj.final_value
            done = traj.terminated | traj.truncated
            for t in range(algo.rollout_len):
                buffer.add(traj.obs[t], traj.action[t], traj.logp[t], traj.value[t], reward[t], done[t])
            self.counters.steps += algo.rollout_len * n_envs
            batch = buffer.finish(traj.last_value, algo.gamma, algo.gae_lambda)
            self._push_obs_stats()
            progress_remaining = max(0.0, 1.0 - (self.counters.steps - algo.rollout_len * n_envs) / total)
            start = time.perf_counter()
            metrics = algo.learn(batch, progress_remaining, self.rng)
            self.split.learn += time.perf_counter() - start
            metrics.update(self._staleness(traj))
            self._after_update(metrics, publish)

    def _learn_off_policy_from(self, pool: Any, publish: Callable[[], None], total: int) -> None:
        algo, tc, c = self.algo, self.cfg.train, self.counters
        replay = ReplayBuffer.for_spaces(tc.buffer_size, self.obs_space, self.action_space)
        keep = tc.checkpoint_replay if tc.checkpoint_replay is not None else (
            replay.nbytes <= CHECKPOINT_REPLAY_MAX_BYTES)
        if keep:
            self.add_checkpoint_extra(REPLAY_FILE, replay)
        min_replay = min(tc.batch_size, max(tc.learning_starts, 1))
        box = isinstance(self.action_space, gym.spaces.Box)
        last_log, pending, stale = c.steps, [], {}
        while c.steps < total:
            traj = self._receive(pool)
            stale = self._staleness(traj)
            for t in range(len(traj.version)):
                action = np.clip(traj.action[t], self.action_space.low, self.action_space.high) if box \
                    else traj.action[t]
                replay.add(traj.obs[t], action, traj.reward[t], traj.next_obs[t], traj.terminated[t],
                           traj.truncated[t])
            c.steps += traj.reward.size
            # One learn per chunk (a chunk is train_freq vector steps), as the in-process loop.
            if c.steps > tc.learning_starts and len(replay) >= min_replay:
                if self.obs_rms is not None:
                    algo.set_obs_stats(self.obs_rms.mean, self.obs_rms.var)
                algo.before_step(max(0.0, 1.0 - c.steps / total))  # the actors' next epsilon
                start = time.perf_counter()
                pending.append({**algo.learn(replay, max(0.0, 1.0 - c.steps / total), self.rng, c.steps), **stale})
                self.split.learn += time.perf_counter() - start
                self._after_update(None, publish)
            else:
                if c.steps >= tc.learning_starts:
                    algo.before_step(max(0.0, 1.0 - c.steps / total))
                publish()
            if c.steps - last_log >= tc.log_every_steps or c.steps >= total:
                keys = {k for m in pending for k in m}
                self._log_update({k: float(np.mean([m[k] for m in pending if k in m])) for k in keys} or stale)
                last_log, pending = c.steps, []

    def _push_obs_stats(self) -> None:
        """Copy the running observation statistics into the network's in-graph normaliser."""
        if self.obs_rms is not None:
            self.network.set_obs_stats(self.obs_rms.mean, self.obs_rms.var)

    def _periodic_eval(self) -> None:
        """`train.eval_every`: a deterministic evaluation once the step counter passes the next
        multiple; the best one's parameters are kept for `train.keep_best`."""
        every, steps = self.cfg.train.eval_every, self.counters.steps
        if steps < self._next_eval:
            return
        self._next_eval = (steps // every + 1) * every
        self._push_obs_stats()
        returns = evaluate(self.network, self.cfg, self.cfg.env.eval_episodes, self.cfg.seed + 20_000)
        mean = float(returns.mean())
        self.log.scalars({"eval/mean_return": mean, "eval/std_return": float(returns.std())}, steps)
        if self.consider_best(mean, (mean,)):
            self.log.message(f"eval at {steps:,} steps: mean return {mean:.2f} (best so far)")

    def consider_best(self, mean_return: float, rank: tuple[float, ...]) -> bool:
        """Keep the network's parameters if `rank` beats the best evaluation so far (the earliest
        wins a tie); True if they were kept."""
        if self.best is not None and rank <= self.best.rank:
            return False
        params = {p.name: p.asnumpy().copy() for p in self.network.get_parameters()}
        self.best = BestEval(mean_return, self.counters.steps, params, rank)
        return True

    def _restore_best(self) -> None:
        """Put the parameters of the best periodic evaluation back into the network (and into the
        in-process acting graph, which otherwise refreshes only when the update count changes)."""
        for p in self.network.get_parameters():
            p.set_data(Tensor(self.best.params[p.name]))
        if self.acting is not self.live_acting:
            self.acting.sync_from(self.network, self.counters.updates)

    def _run_update_hooks(self) -> None:
        for hook in self.update_hooks:
            hook(self)

    def _log_update(self, metrics: dict[str, float]) -> None:
        c = self.counters
        elapsed = time.perf_counter() - self.log.start
        metrics = dict(metrics)
        metrics["rollout/ep_return_mean"] = _mean(c.recent_returns)
        metrics["rollout/ep_length_mean"] = _mean(c.recent_lengths)
        metrics["rollout/episodes"] = c.episodes
        metrics["time/steps_per_second"] = (c.steps - self.log.start_step) / max(elapsed, 1e-9)
        for key, value in metrics.items():
            if key.startswith("parity/") and value is not None:  # e.g. PPO's first-minibatch ratio
                self.parity[key] = value
                self.parity[key + "_max"] = max(value, self.parity.get(key + "_max", value))
        self.history.append((c.steps, metrics["rollout/ep_return_mean"], elapsed))
        self.log.scalars(metrics, c.steps)
        self.log.progress(c.steps, metrics["rollout/ep_return_mean"])


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None

"""The learner: consumes trajectory chunks -> learns -> exports -> logs -> checkpoints -> evaluates.

Chunks come from a source (`rlstack/sources.py`) and reach the algorithm (`rlstack.registry.
Algorithm`: the network and the update) through the loop of its data path (`rlstack/loops.py`);
the trainer says when to export (`publish.py`), checkpoint (`checkpoints.py`), evaluate
(`evaluation.py`) and stop (`stopping.py`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mindspore as ms
import numpy as np
import yaml

from rlstack import budget, checkpoints, registry
from rlstack.acting import Acting, load_policy
from rlstack.checkpoints import Counters, ResumeError
from rlstack.collector import ENVS_FILE, RunningMeanStd, Trajectory
from rlstack.config import Config, ConfigError, load_config, to_yaml
from rlstack.envs import make_vector_env
from rlstack.evaluation import BEST_FILE, BestEval, BestKeeper, PeriodicEval, evaluate, run_summary
from rlstack.fsutil import atomic_write_text
from rlstack.logger import RunLogger, TimeSplit
from rlstack.loops import learn_from_chunks, learn_from_replay
from rlstack.network import Network
from rlstack.parity import RecentObs
from rlstack.publish import Publisher
from rlstack.registry import ChunkSource, DataPath
from rlstack.runtime import configure
from rlstack.selfplay_eval import POOL_STATE_FILE, SelfPlayHook, attach_selfplay
from rlstack.sources import local_source, start_actors
from rlstack.stopping import StopSignals

if TYPE_CHECKING:
    from rlstack.distributed import World

__all__ = ["Counters", "ResumeError", "TimeSplit", "Trainer"]

def default_out_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.algo}_{cfg.env.id}_s{cfg.seed}_{stamp}"


class Trainer:
    """Owns one run directory: `<out>/tb`, `<out>/checkpoints/`, `<out>/policy/`, `<out>/summary.json`."""

    def __init__(self, cfg: Config, out_dir: str | Path | None = None, world: World | None = None):
        if cfg.learner.workers > 1 and world is None:
            raise ConfigError(f"learner.workers={cfg.learner.workers} needs the workers `python -m rlstack.train` "
                              "starts (rlstack/distributed.py); --resume does not start them: resume a run of N "
                              "workers with learner.workers=1 (rank 0's checkpoint; not bit-exact)")
        self.cfg = cfg
        self.world = world
        """Data-parallel learners (`learner.workers` >= 2): this process's rank and the collectives."""
        self.out = Path(out_dir) if out_dir is not None else default_out_dir(cfg)
        self.runtime = configure(cfg.device, cfg.fusion)
        ms.set_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        budget.check_fits(cfg, *budget.probe_spaces(cfg))  # before n_envs envs and the networks exist
        self.envs = make_vector_env(cfg.env.id, cfg.env.n_envs, cfg.env.vector, cfg.env.kwargs,
                                    cfg.env.vectorization, imports=cfg.env.imports, wrappers=cfg.env.wrappers)
        self.obs_space = self.envs.single_observation_space
        self.action_space = self.envs.single_action_space
        self.algo: registry.Algorithm = registry.get(cfg.algo).build(cfg, self.obs_space, self.action_space)
        self.network: Network = self.algo.network
        if cfg.parity == "strict" and not self.network.spec.batch_invariant:
            raise ConfigError(f"parity: strict needs a batch-invariant network, but algorithm '{cfg.algo}' "
                              "builds its NetSpec without batch_invariant=True (use parity: fast)")
        self.log: RunLogger | None = None
        """TensorBoard and console output, opened by `train()`."""
        self.acting: Acting | None = None
        """The in-process actor (`actors: 0`): the exported graph following the learner's weights."""
        self.recent_obs = RecentObs()  # what the parity check after each export re-runs
        self.publisher = Publisher(cfg, self.network, self.obs_space, self.action_space, self.runtime,
                                   self.recent_obs)
        self.parity = self.publisher.parity
        """Latest `parity/…` values (exports and PPO's ratio check), copied into summary.json."""
        self.obs_rms = RunningMeanStd(self.obs_space.shape) if cfg.net.normalize_obs else None
        self.counters = Counters()
        self.split = TimeSplit()
        self.actor_stats: dict[str, float] = {}
        """The actor backend's `actors/…` scalars (e.g. restarts), logged with each update and in summary.json."""
        self.selfplay: SelfPlayHook | None = None
        """The self-play hook (a self-play game env): its opponent pool, evaluations."""
        self.history: list[tuple[int, float | None, float]] = []
        """(steps, recent mean episode return, seconds since start) after every update."""
        self.update_hooks: list[Callable[[Counters], None]] = []
        """Called with the counters after every learner update (profiling windows, benchmarks)."""
        self.ckpt = checkpoints.Checkpointer(self.out / "checkpoints", self.algo.state_cell(), self.counters,
                                             self.rng, self.obs_rms, to_yaml(cfg), cfg.train.keep_checkpoints)
        self.keeper = BestKeeper(self.network)
        """Keeps the best periodic evaluation (`train.eval_every`, `train.keep_best`), checkpointed."""
        self.ckpt.add_extra(BEST_FILE, self.keeper)
        for filename, extra in self.algo.checkpoint_extras().items():
            self.ckpt.add_extra(filename, extra)
        self.evals = PeriodicEval(cfg, self.network, self.keeper)
        self.stop = StopSignals(lambda text: self.log.message(text), world.agree_stop if world else None)
        """SIGINT / SIGTERM during `train()`: stop after the current update (rlstack/stopping.py)."""
        self._wall_base, self._wall_start = 0.0, time.perf_counter()
        self._last_checkpoint = time.perf_counter()
        self.notes: list[str] = []
        """Said on the console when `train()` starts (what a resume did)."""
        self.logged: dict[str, Any] = {"at": 0, "pending": []}
        """Replay updates not yet logged (`pending`), the step of the last log (`at`): checkpointed."""

    # ----- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Network, optimizer, normaliser, counters, RNG, extras and resolved config, atomically."""
        self.counters.wall_seconds = self._wall_base + time.perf_counter() - self._wall_start  # true in each
        self._last_checkpoint = time.perf_counter()
        return self.ckpt.save(next_eval=self.evals.next_eval, logged=self.logged)

    def load_checkpoint(self, path: Path) -> None:
        state = self.ckpt.load(path)
        self.evals.next_eval = state.get("next_eval", self.evals.next_eval)
        self.logged = state.get("logged", self.logged)

    @classmethod
    def resume(cls, out_dir: str | Path, overrides: list[str] | None = None) -> Trainer:
        """Continue a run from its latest checkpoint (`out_dir` a run directory) or from one named
        checkpoint (`out_dir` = `<run>/checkpoints/step_N`; later ones are set aside), with
        optional overrides (e.g. a larger `train.total_steps`)."""
        out, path = checkpoints.locate(Path(out_dir))
        checkpoints.verify(path)
        saved = yaml.safe_load((path / checkpoints.CONFIG_FILE).read_text())
        trainer = cls(load_config(base=saved, overrides=overrides), out)
        trainer.load_checkpoint(path)
        trainer.notes += [f"resumed from {path}; a later checkpoint is set aside as {moved}"
                          for moved in checkpoints.rewind(path)]
        if not trainer.runtime.denormals_flushed:  # (docs/DESIGN.md#denormals)
            trainer.notes.append("denormals could not be flushed as in MindSpore's kernel threads: once the "
                                 "optimizer state holds some, this run may differ in the last bits")
        return trainer

    # ----- export -----------------------------------------------------------------------------

    @property
    def policy_dir(self) -> Path:
        return self.out / "policy"

    def export(self, trigger: str = "schedule") -> Path:
        """Export the acting graph as the next policy version (obs statistics included) and log
        its parity against the live module (`parity/…`, TensorBoard and the console)."""
        self.push_obs_stats()
        c = self.counters
        version = self.publisher.export(self.policy_dir, c.steps, c.updates, keep=self.cfg.train.keep_versions,
                                        trigger=trigger)
        report = self.publisher.check_parity(version, c.updates)
        if self.log is not None:  # (an export before `train()` is not logged)
            self.log.scalars(report.metrics(), c.steps)
            self.log.message(report.line())
        return version

    def _in_process(self, acting: Acting | None) -> Acting:
        """The in-process actor: the exported graph, its weights following the learner (refreshed
        before the first call after each update, and when the algorithm's acting key changes)."""
        if acting is None:
            acting = load_policy(self._acting_graph(), device=self.runtime.device, fusion=self.runtime.fusion)
            c, key = self.counters, self.algo.acting_key
            acting.updates = c.updates
            acting.follow(self.network, lambda: (c.updates, *key()))
        self.acting = acting
        return acting

    def _acting_graph(self) -> Path:
        self.push_obs_stats()
        return self.publisher.private_graph(self.counters.updates)

    # ----- the loop ----------------------------------------------------------------------------

    def train(self, acting: Acting | None = None) -> dict[str, Any]:
        """Train to `train.total_steps`, then export, evaluate and write `summary.json`.

        `acting` replaces the in-process actor's exported graph (`actors: 0`; benchmarks that
        compare acting paths); it must follow the learner's weights itself."""
        if self.ckpt.resumed_from is None and (self.ckpt.directory / "LATEST").exists():
            raise ResumeError(f"{self.out} already holds a run; resume it with --resume {self.out} "
                              "or choose another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "config.yaml", to_yaml(self.cfg))
        total = self.cfg.train.total_steps
        self.log = RunLogger(self.out, total, self.counters.steps, self.cfg.train.progress,
                             self.cfg.train.log_every_seconds)
        for note in self.notes:
            self.log.message(note)
        selfplay = self._attach_selfplay()
        start, start_steps = time.perf_counter(), self.counters.steps
        self._wall_base, self._wall_start = self.counters.wall_seconds, start
        try:
            with self.stop:
                self._run(acting, total)
        finally:
            self.envs.close()
            self.publisher.close()
        elapsed = time.perf_counter() - start
        self.split.other = elapsed - self.split.env - self.split.act - self.split.learn
        checkpoint = self.save_checkpoint()  # the last network: --resume continues the run itself
        if self.stop.received is not None and self.counters.steps < total:  # (after the last update: finish)
            return self._stopped(checkpoint)
        best = self.best if self.cfg.train.keep_best else None
        if best is not None:
            self.keeper.restore()
            if self.acting is not None:
                self.acting.refresh()
            self.log.message(f"final policy: the network of the best evaluation ({best.mean_return:.2f} at "
                             f"{best.steps:,} steps)")
        summary = self._summarize(self.export(), best is not None, elapsed, start_steps)
        summary.update(self.actor_stats)
        summary.update(self.algo.summary())  # an algorithm's own entries
        if selfplay is not None:
            summary.update(selfplay.finish(self.counters, again=best is not None))
        self.log.close()
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2))
        return summary

    def _run(self, acting: Acting | None, total: int) -> None:
        if self.cfg.actors:
            source, publish = start_actors(self.cfg, self.algo, self._acting_graph(), self.policy_dir,
                                           self.counters, self.obs_space, self.action_space,
                                           self.selfplay.pool if self.selfplay is not None else None)
            kind = "processes" if self.cfg.actors_backend == "process" else f"{self.cfg.actors_backend} actors"
            self.log.message(f"actors: {self.cfg.actors} {kind} x {self.cfg.env.n_envs} envs, chunks of "
                             f"{self.algo.chunk_steps} steps")
            if self.ckpt.resumed_from is not None:
                self.log.message("resumed with actors: their environments start from a fresh reset and chunks "
                                 "arrive in the order the actors finish them (the run is not bit-exact)")
        elif self.algo.data_path is DataPath.OWN:  # e.g. a search learner's self-play games (rlstack/search.py)
            source = self.algo.make_source(self._in_process(acting), self.counters, self.rng)
            publish = source.publish
            if self.ckpt.resumed_from is not None:
                self.log.message("resumed a search learner: its self-play games and replay start afresh "
                                 "(the run is not bit-exact)")
        else:
            source = local_source(self.cfg, self.algo, self.envs, self._in_process(acting), self.counters, self.rng)
            publish = source.publish
            self.ckpt.add_extra(ENVS_FILE, source.collector)
            resumed = self.ckpt.resumed_from
            if resumed is not None and (source.collector.unsaved or not (resumed / ENVS_FILE).is_file()):
                why = source.collector.unsaved or "the checkpoint holds no environment state"
                self.log.message(f"resumed from {resumed}: {why}; the environments restart from a fresh reset "
                                 "(the run is not bit-exact)")
        learn = learn_from_replay if self.algo.data_path is DataPath.REPLAY else learn_from_chunks
        with source if self.cfg.actors else contextlib.nullcontext():
            learn(self, source, publish, total)

    def _stopped(self, checkpoint: Path) -> dict[str, Any]:
        """A run stopped by a signal: export the network, say what was saved and how to go on."""
        version = self.export(trigger="stop")
        name = self.stop.name
        summary = {"stopped_by": name, "total_steps": self.counters.steps, "updates": self.counters.updates,
                   "wall_seconds": self.counters.wall_seconds, "checkpoint": str(checkpoint),
                   "policy_version": version.name}
        self.log.message(f"stopped by {name} at {self.counters.steps:,} steps: checkpoint {checkpoint}, "
                         f"policy {version}\nresume with: python -m rlstack.train --resume {self.out}")
        self.log.close()
        return summary

    def _summarize(self, version: Path, from_best: bool, elapsed: float, start_steps: int) -> dict[str, Any]:
        c, returns = self.counters, evaluate(self.network, self.cfg, self.cfg.env.eval_episodes, self.cfg.seed + 10_000)
        summary = run_summary(self.cfg, c, returns, self.best, from_best, version.name,
                              (c.steps - start_steps) / max(elapsed, 1e-9), self.split.as_dict(), self.parity)
        self.log.scalars({k: summary[k] for k in ("eval/mean_return", "eval/std_return")}, c.steps)
        self.log.message(f"eval: mean return {summary['eval/mean_return']:.2f} +- {summary['eval/std_return']:.2f} "
                         f"over {len(returns)} episodes; {summary['steps_per_second']:,.0f} steps/s")
        return summary

    def _attach_selfplay(self) -> SelfPlayHook | None:
        keep = self.consider_best if self.cfg.train.keep_best else None
        # The agent evaluated: the in-process actor's graph; with actors, the same graph made for it.
        hook = attach_selfplay(self.cfg, self.envs, self.out, self.policy_dir, self.log,
                               lambda: self.acting or self._in_process(None), keep)
        self.selfplay = hook
        if hook is not None:
            self.ckpt.add_extra(POOL_STATE_FILE, hook)
            self.update_hooks.append(hook)
        return hook

    def receive(self, source: ChunkSource) -> Trajectory:
        """The next chunk; episode counters, observation statistics and recent obs updated."""
        start = time.perf_counter()
        traj = source.get()
        waited = time.perf_counter() - start
        for line in source.pop_messages():
            self.log.message(line)
        if traj.pool_record is not None and self.selfplay is not None:  # games played in an actor
            self.selfplay.pool.add_record(traj.pool_record)
        self.actor_stats = source.stats()
        if traj.actor < 0:  # collected here: the collector's own split
            self.split.env += traj.env_seconds
            self.split.act += waited - traj.env_seconds
        else:
            self.split.act += waited  # the learner waiting for actors
        c = self.counters
        for ret, length in zip(traj.episode_returns, traj.episode_lengths, strict=True):
            c.recent_returns.append(float(ret))
            c.recent_lengths.append(int(length))
            c.episodes += 1
        obs = traj.obs.reshape(-1, *traj.obs.shape[2:])
        self.recent_obs.add(obs)
        if self.obs_rms is not None:
            self.obs_rms.update(obs)
        return traj

    def learned(self, metrics: dict[str, float] | None, publish: Callable[[], None]) -> None:
        """After an update: publish weights, log, hooks, periodic evaluation, export, checkpoint."""
        cfg, c = self.cfg, self.counters
        c.updates += 1
        self.stop.arm()
        publish()
        if metrics is not None:
            self.log_update(metrics)
        for hook in self.update_hooks:
            hook(c)
        if self.evals.due(c.steps):
            self.push_obs_stats()
            self.evals.run(c.steps, self.log)
        if cfg.train.export_every and c.updates % cfg.train.export_every == 0:
            self.export()
        minutes = cfg.train.checkpoint_minutes
        if (cfg.train.checkpoint_every and c.updates % cfg.train.checkpoint_every == 0) or (
                minutes and time.perf_counter() - self._last_checkpoint >= 60 * minutes):
            self.save_checkpoint()

    def push_obs_stats(self) -> None:
        """Copy the running observation statistics into the network's in-graph normaliser."""
        if self.obs_rms is not None:
            self.network.set_obs_stats(self.obs_rms.mean, self.obs_rms.var)

    @property
    def best(self) -> BestEval | None:
        """The best periodic evaluation so far and its parameters."""
        return self.keeper.best

    def consider_best(self, mean_return: float, rank: tuple[float, ...]) -> bool:
        """Keep the network's parameters if `rank` beats the best evaluation so far (the earliest
        wins a tie); True if they were kept."""
        return self.keeper.consider(mean_return, rank, self.counters.steps)

    def log_update(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if key.startswith("parity/") and value is not None:  # e.g. PPO's first-minibatch ratio
                self.parity[key] = value
                self.parity[key + "_max"] = max(value, self.parity.get(key + "_max", value))
        self.history.append(self.log.update(metrics, self.counters))

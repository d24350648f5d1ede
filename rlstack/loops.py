"""The learner's loops, one per data path (`rlstack.registry.DataPath`): each takes chunks from a
`ChunkSource` and hands them to the algorithm; the trainer (`rlstack/trainer.py`) does what follows
every chunk and every update (`Trainer.receive`, `Trainer.learned`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from rlstack.collector import Trajectory
from rlstack.registry import Algorithm, ChunkSource, Progress
from rlstack.replay import CHECKPOINT_REPLAY_MAX_BYTES, REPLAY_FILE, make_replay


class Learner(Protocol):
    """What the loops use of the trainer (`rlstack.trainer.Trainer`)."""

    cfg: Any
    algo: Algorithm
    counters: Any
    rng: np.random.Generator
    split: Any
    """Seconds spent in env stepping, acting, learning (`rlstack.logger.TimeSplit`)."""
    world: Any
    stop: Any
    obs_rms: Any
    obs_space: gym.Space
    action_space: gym.Space
    ckpt: Any
    log: Any
    actor_stats: dict[str, float]
    logged: dict[str, Any]

    def receive(self, source: ChunkSource) -> Trajectory: ...

    def learned(self, metrics: dict[str, float] | None, publish: Callable[[], None]) -> None: ...

    def push_obs_stats(self) -> None: ...

    def log_update(self, metrics: dict[str, float]) -> None: ...


def learn_from_chunks(trainer: Learner, source: ChunkSource, publish: Callable[[], None], total: int) -> None:
    """`DataPath.ROLLOUT` and `OWN`: every chunk is handed to `learn` whole."""
    algo, c = trainer.algo, trainer.counters
    while c.steps < total and trainer.stop.received is None:
        traj = trainer.receive(source)
        steps = traj.reward.size * (trainer.world.size if trainer.world else 1)  # every rank collected as many
        c.steps += steps
        trainer.push_obs_stats()
        progress = Progress(c.steps, max(0.0, 1.0 - (c.steps - steps) / total))
        start = time.perf_counter()
        metrics = algo.learn(traj, progress, trainer.rng)
        trainer.split.learn += time.perf_counter() - start
        metrics.update(traj.staleness(trainer.counters.updates), **trainer.actor_stats)
        trainer.learned(metrics, publish)


def learn_from_replay(trainer: Learner, source: ChunkSource, publish: Callable[[], None], total: int) -> None:
    """Every chunk (`train_freq` vector steps) into the replay buffer, then one `learn`
    (`gradient_steps` gradient steps) once `learning_starts` steps are in. A resumed run
    without its replay buffer refills it before learning again."""
    algo, tc, c = trainer.algo, trainer.cfg.train, trainer.counters
    replay = make_replay(tc.buffer_size, trainer.obs_space, trainer.action_space, trainer.cfg.env.n_envs)
    keep = tc.checkpoint_replay if tc.checkpoint_replay is not None else (
        replay.nbytes <= CHECKPOINT_REPLAY_MAX_BYTES)
    if keep:
        trainer.ckpt.add_extra(REPLAY_FILE, replay)
    trainer.log.message(f"replay buffer: {replay.capacity:,} transitions x {replay.bytes_per_transition} B = "
                     f"{replay.nbytes / 2**20:,.1f} MiB, {'saved' if keep else 'not saved'} with checkpoints")
    min_replay = min(tc.batch_size, max(tc.learning_starts, 1))
    if trainer.obs_rms is not None:
        algo.set_obs_stats(trainer.obs_rms.mean, trainer.obs_rms.var)
    logged, stale = trainer.logged, {}
    while c.steps < total and trainer.stop.received is None:
        traj = trainer.receive(source)
        stale = {**traj.staleness(trainer.counters.updates), **trainer.actor_stats}
        for t in range(len(traj.version)):
            replay.add(traj.obs[t], traj.action[t], traj.reward[t], traj.next_obs[t], traj.terminated[t],
                       traj.truncated[t])
        c.steps += traj.reward.size
        remaining = max(0.0, 1.0 - c.steps / total)
        whole = len(traj.version) == algo.chunk_steps  # the last in-process chunk may be cut short
        if whole and c.steps > tc.learning_starts and len(replay) >= min_replay:
            if trainer.obs_rms is not None:
                algo.set_obs_stats(trainer.obs_rms.mean, trainer.obs_rms.var)
            algo.explore(remaining)  # the next chunk's exploration
            start = time.perf_counter()
            logged["pending"].append({**algo.learn(replay, Progress(c.steps, remaining), trainer.rng), **stale})
            trainer.split.learn += time.perf_counter() - start
            trainer.learned(None, publish)
        else:
            if c.steps >= tc.learning_starts:
                algo.explore(remaining)
            publish()
        if c.steps - logged["at"] >= tc.log_every_steps or c.steps >= total:
            # Updates can be every step (SAC): TensorBoard gets their mean every log_every_steps.
            pending = logged["pending"]
            keys = {k for m in pending for k in m}
            trainer.log_update({k: float(np.mean([m[k] for m in pending if k in m])) for k in keys} or stale)
            logged["at"], logged["pending"] = c.steps, []

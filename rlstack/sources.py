"""Where the learner's trajectory chunks come from: the collector in the learner's process
(`actors: 0`) or an actor backend (`actors: N`), both handing out `rlstack.collector.Trajectory`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlstack import registry
from rlstack.acting import Acting, weights_of
from rlstack.collector import ActorSpec, ArraySpec, Collector, LocalSource, trajectory_specs
from rlstack.config import Config
from rlstack.spaces import obs_dtype_of


def _replays(algo: registry.Algorithm) -> bool:
    """Whether `algo` learns from a replay buffer: its chunks then carry each step's next observation."""
    return algo.data_path is registry.DataPath.REPLAY


def chunk_specs(algo: registry.Algorithm, n_envs: int, obs_space: gym.Space,
                action_space: gym.Space) -> tuple[ArraySpec, ...]:
    box = isinstance(action_space, gym.spaces.Box)
    return trajectory_specs(algo.chunk_steps, n_envs, tuple(obs_space.shape), tuple(action_space.shape),
                            "float32" if box else "int32", _replays(algo), obs_dtype_of(obs_space).name)


def exploration(algo: registry.Algorithm, counters: Any, cfg: Config) -> Callable[[int], bool]:
    """The in-process collector's per-step hook: uniform actions before `learning_starts`, then
    the algorithm's exploration schedule (off-policy; on-policy noise explores by itself)."""
    if not _replays(algo):
        return lambda t: False
    n_envs, starts, total = cfg.env.n_envs, cfg.train.learning_starts, cfg.train.total_steps

    def explore(t: int) -> bool:
        steps = counters.steps + t * n_envs
        if steps < starts:
            return True
        algo.explore(1.0 - steps / total)
        return False

    return explore


def local_source(cfg: Config, algo: registry.Algorithm, envs: gym.vector.VectorEnv, acting: Acting,
                 counters: Any, rng: Any) -> LocalSource:
    """`actors: 0`: the collector in this process (sharing the learner's random generator)."""
    collector = Collector(envs, acting, cfg.seed + 1_000 * counters.updates, off_policy=_replays(algo), rng=rng)
    specs = chunk_specs(algo, cfg.env.n_envs, envs.single_observation_space, envs.single_action_space)
    total, n_envs = cfg.train.total_steps, cfg.env.n_envs

    def remaining() -> int:  # vector steps left
        return -(-(total - counters.steps) // n_envs)

    # Off-policy runs stop at total_steps; a rollout of an on-policy algorithm is run whole.
    return LocalSource(collector, specs, exploration(algo, counters, cfg), remaining if _replays(algo) else None)


def start_actors(cfg: Config, algo: registry.Algorithm, bootstrap: Path, policy_dir: Path, counters: Any,
                 obs_space: gym.Space, action_space: gym.Space, pool: Any = None) -> tuple[Any, Callable[[], None]]:
    """`actors: N`: N actors collect with the exported graph (`bootstrap` until versions are
    published to `policy_dir`); returns the started pool and `publish()`, which hands the
    learner's current weights to the actors (called after every update). `pool` (self-play):
    the learner's `OpponentPool`; each actor's env plays the members it names, published with
    the weights, and the games they record come back with the chunks.

    Each actor steps its own `env.n_envs` envs and sends chunks of `chunk_steps` vector steps,
    every step tagged with the update count of the weights that chose it."""
    from rlstack.acting import load_policy
    from rlstack.envs.selfplay import pool_settings

    layout = load_policy(bootstrap).layout
    selfplay = pool_settings(pool) if pool is not None else None
    spec = ActorSpec(env_id=cfg.env.id, n_envs=cfg.env.n_envs, steps=algo.chunk_steps, policy_dir=str(policy_dir),
                     bootstrap=str(bootstrap), seed=cfg.seed + 1_000 * counters.updates, vector=cfg.env.vector,
                     vectorization=cfg.env.vectorization,
                     env_kwargs=dict(cfg.env.kwargs), env_imports=tuple(cfg.env.imports),
                     env_wrappers=tuple(cfg.env.wrappers), device=cfg.device, fusion=cfg.fusion,
                     off_policy=_replays(algo), selfplay=selfplay)
    # Backend options are the config section named after the backend (`ray:`), if it has one.
    section = getattr(cfg, cfg.actors_backend, None)
    options = dataclasses.asdict(section) if dataclasses.is_dataclass(section) else {}
    actors = registry.actor_backend(cfg.actors_backend)(spec, cfg.actors, layout,
                                                        chunk_specs(algo, cfg.env.n_envs, obs_space, action_space),
                                                        **options)

    def publish() -> None:
        explore = _replays(algo) and counters.steps < cfg.train.learning_starts
        actors.publish(weights_of(algo.network, layout), counters.updates, explore,
                       opponents=pool.names if selfplay is not None else None)

    publish()
    actors.start()
    return actors, publish

"""The algorithm registry: the trainer and CLI find an algorithm by its config name (`algo: ppo`),
and `Algorithm` names everything the trainer may ask of one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


class Progress(NamedTuple):
    """Where training stands when `learn` is called."""

    steps: int
    """Environment steps so far (summed over the vector env)."""
    remaining: float
    """1.0 at the start of training, 0.0 at the end: the argument of learning-rate schedules."""


class Algorithm(Protocol):
    """What the trainer uses of an algorithm; nothing else (`algorithms/ppo.py` is an example).

    The trainer collects chunks of `chunk_steps` vector steps with the acting graph of `network`
    and hands them over: on-policy algorithms get each chunk itself (a `rlstack.collector.
    Trajectory`: they compute their advantages from it), off-policy ones the replay buffer the
    trainer adds every chunk to (`rlstack.replay.ReplayBuffer`)."""

    network: Any
    """The one network module (`rlstack.network.Network`); its acting graph is exported."""
    on_policy: bool
    chunk_steps: int
    """Vector steps per chunk: the rollout length (on-policy) or `train_freq` (off-policy)."""

    def learn(self, data: Any, progress: Progress, rng: Any) -> dict[str, float]:
        """One update from a chunk (on-policy) or the replay buffer (off-policy); returns
        TensorBoard scalars (`train/...`, `rollout/...`, `parity/...`)."""

    def state_cell(self) -> Any:
        """The Cell whose parameters a checkpoint must hold (network, target copies, optimizers)."""

    def set_obs_stats(self, mean: Any, var: Any) -> None:
        """Copy observation statistics into every network copy's in-graph normaliser."""

    def explore(self, progress_remaining: float) -> None:
        """The exploration schedule, called before each acting step (DQN: epsilon, an input of
        its acting graph); algorithms whose policy noise explores do nothing."""

    def acting_key(self) -> tuple:
        """What the acting graph depends on that may change between updates (DQN: `(epsilon,)`);
        the in-process actor refreshes those inputs when it changes. `()` if nothing."""


@dataclass(frozen=True)
class AlgorithmEntry:
    name: str
    config_cls: type
    """The algorithm's `train` dataclass (extends `rlstack.config.TrainConfig`)."""
    build: Callable[..., Any]
    """`build(cfg, obs_space, action_space) -> Algorithm`."""


_ALGORITHMS: dict[str, AlgorithmEntry] = {}


def register(name: str, config_cls: type, build: Callable[..., Any]) -> None:
    if name in _ALGORITHMS and _ALGORITHMS[name].build is not build:
        raise ValueError(f"algorithm '{name}' is registered twice")
    _ALGORITHMS[name] = AlgorithmEntry(name, config_cls, build)


def _load_builtin() -> None:
    # The built-in algorithms register themselves on import; importing here keeps
    # `rlstack` free of import-time side effects until an algorithm is asked for.
    import rlstack.algorithms  # noqa: F401


def get(name: str) -> AlgorithmEntry:
    _load_builtin()
    if name not in _ALGORITHMS:
        raise KeyError(f"unknown algorithm '{name}'; registered: {', '.join(sorted(_ALGORITHMS))}")
    return _ALGORITHMS[name]


def names() -> list[str]:
    _load_builtin()
    return sorted(_ALGORITHMS)


ACTOR_BACKENDS = "rlstack.actor_backends"
"""The entry-point group of actor backends (`pyproject.toml`): name -> a class called as
`Backend(spec: rlstack.collector.ActorSpec, n_actors, layout, chunk_specs)` that returns a
context manager with `publish(weights, updates, explore)`, `start()` and `get() -> Trajectory`."""


def actor_backend(name: str) -> Callable[..., Any]:
    """The actor backend registered under `name` (the built-in `process`: rlstack/serving/actor.py)."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=ACTOR_BACKENDS)}
    if name not in found:
        raise KeyError(f"unknown actor backend '{name}'; installed: {', '.join(sorted(found)) or 'none'} "
                       f"(backends register under the entry-point group '{ACTOR_BACKENDS}'; "
                       "reinstall rlstack if 'process' is missing)")
    return found[name].load()

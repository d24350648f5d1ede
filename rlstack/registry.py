"""The algorithm registry: the trainer and CLI find an algorithm by its config name (`algo: ppo`);
`Algorithm` is the base every algorithm extends (everything the trainer may ask of one, with
defaults), `ChunkSource` the base of where chunks come from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple


class Progress(NamedTuple):
    """Where training stands when `learn` is called."""

    steps: int
    """Environment steps so far (summed over the vector env)."""
    remaining: float
    """1.0 at the start of training, 0.0 at the end: the argument of learning-rate schedules."""


class DataPath(StrEnum):
    """How an algorithm's data reaches `learn`."""

    ROLLOUT = "rollout"
    """Each chunk the collector (or an actor) gathered, whole: on-policy algorithms (PPO)."""
    REPLAY = "replay"
    """The replay buffer the trainer adds every chunk to (`rlstack.replay.make_replay`: a
    `ReplayBuffer`, or a `FrameReplay` for image observations): off-policy algorithms (DQN, SAC)."""
    OWN = "own"
    """Chunks the algorithm makes itself (`make_source`), e.g. a search learner's self-play games."""


class ChunkSource:
    """Where the learner's chunks come from: the collector in this process, an actor backend, or
    an algorithm's own source. `get` and `publish` are the contract; `stats` and `pop_messages`
    default to nothing."""

    def get(self) -> Any:
        """The next chunk (`rlstack.collector.Trajectory`)."""
        raise NotImplementedError

    def publish(self) -> None:
        """Hand the learner's current weights to whoever acts (after every update)."""
        raise NotImplementedError

    def stats(self) -> dict[str, float]:
        """`actors/...` scalars the trainer logs."""
        return {}

    def pop_messages(self) -> list[str]:
        """Lines for the run log since the last call (e.g. an actor restarted)."""
        return []


class Algorithm:
    """What the trainer uses of an algorithm, with the defaults. A subclass sets `network` (the
    one network module, `rlstack.network.Network`, whose acting graph is exported) and
    `chunk_steps` in `__init__`, implements `learn` and `state_cell`, and overrides the rest
    where it needs to (`algorithms/ppo.py` is an example)."""

    data_path: ClassVar[DataPath] = DataPath.ROLLOUT
    network: Any
    chunk_steps: int
    """Vector steps per chunk: the rollout length (rollout) or `train_freq` (replay)."""

    def learn(self, data: Any, progress: Progress, rng: Any) -> dict[str, float]:
        """One update from a chunk (`DataPath.ROLLOUT`, `OWN`) or the replay buffer (`REPLAY`);
        returns TensorBoard scalars (`train/...`, `rollout/...`, `parity/...`)."""
        raise NotImplementedError

    def state_cell(self) -> Any:
        """The Cell whose parameters a checkpoint must hold (network, target copies, optimizers)."""
        raise NotImplementedError

    def checkpoint_extras(self) -> dict[str, Any]:
        """Host-side state a checkpoint holds besides `state_cell`'s parameters: file name -> an
        object with `save(path)` and `load(path)` (PPO: its reward scaler)."""
        return {}

    def target_networks(self) -> tuple:
        """Copies of `network` that read the same observation statistics (a DQN or SAC target)."""
        return ()

    def set_obs_stats(self, mean: Any, var: Any) -> None:
        """Copy observation statistics into every network copy's in-graph normaliser."""
        for network in (self.network, *self.target_networks()):
            network.set_obs_stats(mean, var)

    def explore(self, progress_remaining: float) -> None:
        """The exploration schedule, called before each acting step (DQN: epsilon, an input of
        its acting graph); by default the policy's own noise explores and there is nothing to do."""

    def acting_key(self) -> tuple:
        """What the acting graph depends on that may change between updates (DQN: `(epsilon,)`);
        the in-process actor refreshes those inputs when it changes."""
        return ()

    def make_source(self, acting: Any, counters: Any, rng: Any) -> ChunkSource:
        """`DataPath.OWN`: the algorithm's chunks, made with the in-process acting graph `acting`."""
        raise NotImplementedError(f"{type(self).__name__} has data path '{self.data_path}': the trainer "
                                  "collects its chunks")

    def summary(self) -> dict[str, Any]:
        """Entries the trainer adds to `summary.json`."""
        return {}


@dataclass(frozen=True)
class AlgorithmEntry:
    name: str
    config_cls: type
    """The algorithm's `train` dataclass (extends `rlstack.config.TrainConfig`)."""
    build: Callable[..., Algorithm]
    """`build(cfg, obs_space, action_space) -> Algorithm`."""


_ALGORITHMS: dict[str, AlgorithmEntry] = {}


def register(name: str, config_cls: type, build: Callable[..., Algorithm]) -> None:
    """Make algorithm `name` (`algo: name` in a config) buildable. What it can do is declared by
    its classes: the data path by the `Algorithm` subclass, data-parallel learners and the memory
    its networks need by the `train` dataclass (`rlstack.config.TrainConfig`)."""
    if name in _ALGORITHMS and _ALGORITHMS[name].build is not build:
        raise ValueError(f"algorithm '{name}' is registered twice")
    _ALGORITHMS[name] = AlgorithmEntry(name, config_cls, build)


ALGORITHMS = "rlstack.algorithms"
"""The entry-point group of algorithms (`pyproject.toml`): name -> the module that registers it on
import. The built-in ones are there, and another package's algorithm plugs in the same way."""


def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ALGORITHMS)}


def module_of(name: str) -> str | None:
    """The module that registers algorithm `name` (from its entry point; nothing is imported)."""
    ep = _entry_points().get(name)
    return ep.module if ep is not None else None


def registered(name: str) -> AlgorithmEntry | None:
    """Algorithm `name` if its module was imported already (nothing is imported here)."""
    return _ALGORITHMS.get(name)


def _load(name: str | None = None) -> None:
    """Import the module of algorithm `name` (every algorithm's, for None): it registers itself.
    Until an algorithm is asked for, `rlstack` imports none (nor MindSpore)."""
    for ep_name, ep in _entry_points().items():
        if name is None or ep_name == name:
            ep.load()


def get(name: str) -> AlgorithmEntry:
    if name not in _ALGORITHMS:
        _load(name)
    if name not in _ALGORITHMS:
        raise KeyError(f"unknown algorithm '{name}'; valid: {', '.join(names())}")
    return _ALGORITHMS[name]


def names() -> list[str]:
    """Every algorithm that can be built: the registered ones and those of the entry points."""
    return sorted(set(_ALGORITHMS) | set(_entry_points()))


ACTOR_BACKENDS = "rlstack.actor_backends"
"""The entry-point group of actor backends (`pyproject.toml`): name -> a class called as
`Backend(spec: rlstack.collector.ActorSpec, n_actors, layout, chunk_specs, **options)` that returns a
context manager with `publish(weights, updates, explore, opponents=None)` (`opponents`: a self-play
learner pool's member names), `start()` and `get() -> Trajectory`;
`options` are the fields of the config section named after the backend (`ray:`), if there is one.
Optionally `stats() -> dict` (`actors/...` scalars the trainer logs) and `pop_messages() -> list[str]`
(lines for the run log, e.g. an actor restarted)."""


def actor_backend(name: str) -> Callable[..., Any]:
    """The actor backend registered under `name` (the built-in `process`: rlstack/serving/actor.py)."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=ACTOR_BACKENDS)}
    if name not in found:
        raise KeyError(f"unknown actor backend '{name}'; installed: {', '.join(sorted(found)) or 'none'} "
                       f"(backends register under the entry-point group '{ACTOR_BACKENDS}'; "
                       "reinstall rlstack if 'process' is missing)")
    return found[name].load()

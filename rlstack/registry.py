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
    """The replay buffer the trainer adds every chunk to (`rlstack.replay.ReplayBuffer`):
    off-policy algorithms (DQN, SAC)."""
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


def _load_builtin() -> None:
    # The built-in algorithms register themselves on import; importing here keeps
    # `rlstack` free of import-time side effects until an algorithm is asked for.
    import rlstack.algorithms  # noqa: F401


def get(name: str) -> AlgorithmEntry:
    _load_builtin()
    if name not in _ALGORITHMS:
        raise KeyError(f"unknown algorithm '{name}'; registered: {', '.join(sorted(_ALGORITHMS))}")
    return _ALGORITHMS[name]


SOURCE_ATTR = "__rlstack_source__"
"""Where `help_config` keeps the source of a class it rebuilt (for its field docstrings)."""


def help_config(name: str) -> type:
    """The `train` dataclass of algorithm `name`, for help texts: the registered class, or for a
    built-in algorithm not imported yet, the class rebuilt from its file's source (only the
    dataclass definition runs), so `--help-keys` does not load MindSpore."""
    if name in _ALGORITHMS:
        return _ALGORITHMS[name].config_cls
    import __future__

    import ast
    import importlib.util
    from dataclasses import dataclass, field
    from pathlib import Path

    from rlstack import config

    spec = importlib.util.find_spec("rlstack.algorithms")  # finds the folder without importing it
    for path in sorted(Path(spec.origin).parent.glob("*.py")) if spec and spec.origin else []:
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "register" and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == name
                    and isinstance(node.args[1], ast.Name)):
                cls_name = node.args[1].id
                cls_node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
                namespace = {**vars(config), "dataclass": dataclass, "field": field, "__name__": config.__name__}
                code = compile(ast.Module([cls_node], []), str(path), "exec",
                               flags=__future__.annotations.compiler_flag, dont_inherit=True)
                exec(code, namespace)
                cls = namespace[cls_name]
                setattr(cls, SOURCE_ATTR, ast.get_source_segment(text, cls_node))
                return cls
    return get(name).config_cls  # not a built-in: load it (or raise the usual KeyError)


def names() -> list[str]:
    _load_builtin()
    return sorted(_ALGORITHMS)


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

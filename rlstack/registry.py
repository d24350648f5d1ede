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


# Optional on an algorithm:
# - `make_source(acting, counters, rng)` -> an object with `get() -> Trajectory` and `publish()`:
#   the algorithm makes its own chunks instead of the env collector, with the in-process acting
#   graph (a search learner's self-play games: `algorithms/alphazero.py`);
# - `summary() -> dict`: entries the trainer adds to `summary.json`.


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

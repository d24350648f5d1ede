"""The algorithm registry: the trainer and CLI find an algorithm by its config name (`algo: ppo`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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

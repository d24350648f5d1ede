"""Saving and restoring a vector env's state mid-episode, for exact resume from a checkpoint.

What can be saved:
- `SyncVectorEnv` of pickleable envs (gymnasium's classic-control and toy-text envs, most pure
  Python envs): every sub-env with its wrappers (time-limit counters, RNG) and the vector
  env's own autoreset bookkeeping.
- Envs with `get_state()` / `set_state(state)` (rlstack's self-play games, the native vector
  envs of rlstack/envs/vectorized.py).

What cannot: `AsyncVectorEnv` (its envs live in other processes) and envs holding unpickleable
things (simulators with native handles, e.g. MuJoCo's). `capture` then raises `NotSaved`
naming the reason, and a resumed run restarts those environments from a fresh reset.
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

_REBUILT = ("env_fns",)
"""SyncVectorEnv attributes not saved: the factories (often closures) that built the envs."""


class NotSaved(Exception):
    """This vector env's state cannot be saved; the message says why."""


def capture(envs: gym.vector.VectorEnv) -> bytes:
    """The env's whole state as bytes (restore it with `restore` into an env built the same way)."""
    if hasattr(envs, "get_state"):
        state: Any = ("method", envs.get_state())
    elif isinstance(envs, AsyncVectorEnv):
        raise NotSaved("AsyncVectorEnv (env.vector: async) steps its envs in other processes")
    elif isinstance(envs, SyncVectorEnv):
        state = ("sync", {k: v for k, v in vars(envs).items() if k not in _REBUILT})
    else:
        raise NotSaved(f"{type(envs).__name__} has no get_state()")
    try:
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as err:
        raise NotSaved(f"{envs.spec.id if envs.spec else type(envs).__name__} cannot be pickled: {err}") from None


def restore(envs: gym.vector.VectorEnv, blob: bytes) -> None:
    """Put the state `capture` returned back into `envs` (built with the same id, count and kwargs)."""
    kind, state = pickle.loads(blob)  # noqa: S301 - our own checkpoint, verified by the caller
    # A resume may build the envs another way than the saved run did (env.vectorization changed,
    # or a checkpoint from before it existed): a ValueError makes the caller start afresh.
    if kind == "method":
        if not hasattr(envs, "set_state"):
            raise ValueError(f"saved environment state is from a native vector env, this run steps {type(envs).__name__}")
        envs.set_state(state)
        return
    if not isinstance(envs, SyncVectorEnv):
        raise ValueError(f"saved environment state is from a SyncVectorEnv, this run steps {type(envs).__name__}")
    if len(state["envs"]) != envs.num_envs:
        raise ValueError(f"saved environment state has {len(state['envs'])} envs, this run has {envs.num_envs}")
    for env in envs.envs:
        env.close()
    vars(envs).update(state)

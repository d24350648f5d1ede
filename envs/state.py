"""Saving and restoring a vector env's state mid-episode, for exact resume from a checkpoint.

What can be saved:
- `SyncVectorEnv` of pickleable envs (gymnasium's classic-control and toy-text envs, most pure
  Python envs): every sub-env with its wrappers (time-limit counters, RNG) and the vector
  env's own autoreset bookkeeping.
- gymnasium's MuJoCo envs in a `SyncVectorEnv`: each is rebuilt from its constructor arguments and
  given back its simulation state (MuJoCo's integration state: time, qpos, qvel, act, warm start,
  controls, applied forces) and its own RNG; the wrappers around it are pickled as above.
- Envs with `get_state()` / `set_state(state)` (rlstack's self-play games, the native vector
  envs of rlstack/envs/vectorized.py).

What cannot: `AsyncVectorEnv` (its envs live in other processes), envs holding unpickleable
things, and other envs that pickle as their constructor arguments only (gymnasium's `EzPickle`:
Box2D, Atari), whose state a pickle would silently drop. `capture` then raises `NotSaved` naming
the reason, and a resumed run restarts those environments from a fresh reset.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import EzPickle
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

_REBUILT = ("env_fns",)
"""SyncVectorEnv attributes not saved: the factories (often closures) that built the envs."""


class NotSaved(Exception):
    """This vector env's state cannot be saved; the message says why."""


def _mujoco_env_class() -> type | None:
    """gymnasium's `MujocoEnv`, if a MuJoCo env was made in this process (none exists otherwise)."""
    module = sys.modules.get("gymnasium.envs.mujoco.mujoco_env")
    return getattr(module, "MujocoEnv", None)


_SIMULATOR = ("model", "data", "mujoco_renderer")
"""A MuJoCo env's attributes holding native handles: rebuilt, not pickled."""


def _rebuild_mujoco(cls: type, args: tuple, kwargs: dict, physics: Any, attributes: dict) -> Any:
    """A MuJoCo env built as the saved one was, with its simulation state and its other attributes
    (its RNG, its spec) put back."""
    import mujoco

    env = cls(*args, **kwargs)
    mujoco.mj_setState(env.model, env.data, physics, mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(env.model, env.data)  # the derived quantities (positions, contacts) of that state
    vars(env).update(attributes)
    return env


class _Pickler(pickle.Pickler):
    """Pickles MuJoCo envs by their constructor arguments plus their state, and refuses other
    `EzPickle` objects (they would unpickle as freshly built, their state lost)."""

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, EzPickle):
            return NotImplemented
        mujoco_env = _mujoco_env_class()
        if mujoco_env is None or not isinstance(obj, mujoco_env):
            raise NotSaved(f"{type(obj).__name__} pickles as its constructor arguments only (EzPickle): its state "
                           "would be lost")
        import mujoco

        physics = np.empty(mujoco.mj_stateSize(obj.model, mujoco.mjtState.mjSTATE_INTEGRATION))
        mujoco.mj_getState(obj.model, obj.data, physics, mujoco.mjtState.mjSTATE_INTEGRATION)
        attributes = {k: v for k, v in vars(obj).items() if k not in _SIMULATOR}
        return _rebuild_mujoco, (type(obj), obj._ezpickle_args, obj._ezpickle_kwargs, physics, attributes)


def _dumps(state: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    return buffer.getvalue()


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
        return _dumps(state)
    except NotSaved as err:
        raise NotSaved(f"{envs.spec.id if envs.spec else type(envs).__name__}: {err}") from None
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

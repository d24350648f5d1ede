"""Building seeded gymnasium vector envs for the actor stage, with plain errors for bad ids."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from rlstack.envs.vectorized import SAME_STEP_ADAPTERS, native_entry_point, rejected_kwargs


class EnvError(ValueError):
    """The environment cannot be made (unknown id, missing extra, bad kwargs)."""


def _check_id(env_id: str) -> None:
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise EnvError(f"unknown environment id '{env_id}'{hint} (see gymnasium.registry for registered ids)")


def make_env(env_id: str, kwargs: dict[str, Any] | None = None, render_mode: str | None = None) -> gym.Env:
    """One gymnasium env; raises EnvError with the reason when it cannot be made."""
    _check_id(env_id)
    try:
        return gym.make(env_id, render_mode=render_mode, **(kwargs or {}))
    except gym.error.DependencyNotInstalled as err:
        raise EnvError(f"environment '{env_id}' needs an extra package: {err}") from None
    except TypeError as err:
        raise EnvError(f"environment '{env_id}' rejected env.kwargs {kwargs}: {err}") from None


VECTORIZATIONS = ("auto", "native", "per_env")
"""How `make_vector_env` batches the copies (`env.vectorization`): `native` the env's own batched
implementation, `per_env` one env object per copy (SyncVectorEnv / AsyncVectorEnv, `env.vector`),
`auto` native when the id has one that takes `env.kwargs`, else per_env."""


def make_vector_env(env_id: str, n_envs: int, vector: str = "sync",
                    kwargs: dict[str, Any] | None = None, vectorization: str = "auto") -> gym.vector.VectorEnv:
    """`n_envs` copies of `env_id` (seed them with `envs.reset(seed=seed)`; per_env: env i gets seed + i,
    native: one generator for all copies).

    Autoreset is SAME_STEP: when an episode ends, `step` returns the first observation of the
    next episode and puts the last one in `info["final_obs"]`, so the learner can bootstrap a
    truncated episode from V(final_obs) without a dead transition on the following step.
    """
    if vectorization not in VECTORIZATIONS:
        raise EnvError(f"'env.vectorization' is {vectorization!r}; valid values: {', '.join(VECTORIZATIONS)}")
    make_env(env_id, kwargs).close()  # fail here, in this process, with a clear message
    kwargs = kwargs or {}
    native = native_entry_point(env_id)
    # rlstack's self-play games exist only as their vector env: it holds the opponent pool.
    only_native = native is not None and env_id not in SAME_STEP_ADAPTERS
    if vectorization == "per_env":
        if only_native:
            raise EnvError(f"'env.vectorization' is 'per_env' but '{env_id}' runs only as its own vector env "
                           f"({native.__name__}); use auto or native")
    elif native is None:
        if vectorization == "native":
            raise EnvError(f"'env.vectorization' is 'native' but '{env_id}' has no native vector env with "
                           f"SAME_STEP autoreset (ids with one: {', '.join(_native_ids())}); use auto or per_env")
    else:
        rejected = rejected_kwargs(native, kwargs)
        if not rejected:
            # Every copy stepped at once in numpy arrays (envs/vectorized.py), or a purpose-built
            # batched env (self-play games: opponents' moves batched across all games).
            spec = dataclasses.replace(gym.spec(env_id), vector_entry_point=native)
            return gym.make_vec(spec, num_envs=n_envs, vectorization_mode="vector_entry_point", **kwargs)
        if vectorization == "native" or only_native:
            hint = "" if only_native else "; use env.vectorization: per_env"
            raise EnvError(f"the native vector env of '{env_id}' ({native.__name__}) does not take env.kwargs "
                           f"{', '.join(rejected)}{hint}")

    def factory():
        return gym.make(env_id, **kwargs)

    cls = SyncVectorEnv if vector == "sync" else AsyncVectorEnv
    envs = cls([factory] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP)
    return envs


def _native_ids() -> list[str]:
    return [k for k in gym.registry if native_entry_point(k) is not None]

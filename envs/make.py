"""Building seeded gymnasium vector envs for the actor stage, with plain errors for bad ids."""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv


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


def make_vector_env(env_id: str, n_envs: int, vector: str = "sync",
                    kwargs: dict[str, Any] | None = None) -> gym.vector.VectorEnv:
    """`n_envs` copies of `env_id` (seed them with `envs.reset(seed=seed)`: env i gets seed + i).

    Autoreset is SAME_STEP: when an episode ends, `step` returns the first observation of the
    next episode and puts the last one in `info["final_obs"]`, so the learner can bootstrap a
    truncated episode from V(final_obs) without a dead transition on the following step.
    """
    make_env(env_id, kwargs).close()  # fail here, in this process, with a clear message
    if gym.spec(env_id).vector_entry_point is not None:
        # A purpose-built batched env (e.g. self-play games: opponents' moves batched across
        # all games); it steps every copy in this process whatever `vector` says.
        envs = gym.make_vec(env_id, num_envs=n_envs, vectorization_mode="vector_entry_point", **(kwargs or {}))
        if envs.metadata.get("autoreset_mode") == AutoresetMode.SAME_STEP:
            return envs
        # gymnasium's own vector envs (CartPole-v1's CartPoleVectorEnv) autoreset NEXT_STEP and
        # report no info["final_obs"]: the rollout and the actors need SAME_STEP.
        envs.close()

    def factory():
        return gym.make(env_id, **(kwargs or {}))

    cls = SyncVectorEnv if vector == "sync" else AsyncVectorEnv
    envs = cls([factory] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP)
    return envs

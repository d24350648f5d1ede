"""Native vector envs for the env stage: an env's own batched implementation (every copy stepped
at once, as rows of numpy arrays) made to autoreset SAME_STEP, as the collector needs.

gymnasium ships batched versions of a few envs (`EnvSpec.vector_entry_point`, e.g.
`CartPoleVectorEnv`), but they autoreset NEXT_STEP: the step after an episode ends is a dead
step that only resets, and the last observation of the episode is never reported. An adapter
here subclasses one of them so that the step which ends an episode also starts the next one and
reports the last observation as SyncVectorEnv(autoreset_mode=SAME_STEP) does:
`info["final_obs"]` (object array, the observation where `_final_obs` is True, None elsewhere),
`info["final_info"]` (the sub-envs' infos, empty for these envs) and their masks.

`SameStepCartPole` steps CartPole copies faster than SyncVectorEnv does
(docs/PERFORMANCE.md#native-cartpole).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode


class SameStepCartPole(CartPoleVectorEnv):
    """gymnasium's `CartPoleVectorEnv` (the dynamics, thresholds, `max_episode_steps` truncation
    and rewards of `gym.make("CartPole-v1")`) with SAME_STEP autoreset.

    `reset(seed=s)` seeds one generator for all copies (SyncVectorEnv seeds copy i with s + i):
    the same distribution of first observations, not the same draws.
    """

    metadata = {**CartPoleVectorEnv.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 500, render_mode: str | None = None,
                 sutton_barto_reward: bool = False):
        super().__init__(num_envs, max_episode_steps, render_mode, sutton_barto_reward)
        self.sutton_barto_reward = sutton_barto_reward
        self._forces = np.array([-self.force_mag, self.force_mag])  # by action
        self._limits = np.array([[self.x_threshold], [self.theta_threshold_radians]])  # |x|, |theta|

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every copy; action [n] int in {0, 1}. Returns obs [n, 4] float32, reward [n]
        float64 (as SyncVectorEnv's), terminated [n] bool, truncated [n] bool, info."""
        if self.state is None:
            raise gym.error.ResetNeeded("call reset before step")
        action = np.asarray(action)
        if action.shape != (self.num_envs,) or np.any(action & -2):  # an int not 0 or 1 has another bit
            raise ValueError(f"expected {self.num_envs} actions in {{0, 1}}, got {action!r}")
        # The parent's (and CartPoleEnv's) arithmetic, operation for operation, so every copy
        # steps bitwise as gym.make("CartPole-v1") does; rewritten rather than called because
        # the parent's action-space check and NEXT_STEP bookkeeping are a large share of its
        # step (docs/PERFORMANCE.md#native-cartpole).
        _, x_dot, theta, theta_dot = self.state
        force = self._forces.take(action)  # take: a bool action is an index too, not a mask
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        # Euler, the parent's default (`kinematics_integrator` is not a constructor argument).
        state = self.state + self.tau * np.array((x_dot, xacc, theta_dot, thetaacc))
        self.state = state
        terminated = (np.abs(state[::2]) > self._limits).any(axis=0)
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        # 1 every step including the terminal one; Sutton and Barto: -1 on the terminal step, else 0.
        reward = np.where(terminated, -1.0, 0.0) if self.sutton_barto_reward else np.ones(self.num_envs)
        obs = state.T.astype(np.float32)
        done = terminated | truncated
        if not done.any():
            return obs, reward, terminated, truncated, {}
        ended = np.flatnonzero(done)
        final_obs = np.full(self.num_envs, None, dtype=object)
        for i, last in zip(ended, obs[ended], strict=True):  # obs[ended] is a copy: rows stay as they are
            final_obs[i] = last
        # The parent's reset draw: uniform in [low, high) for each state variable.
        state[:, ended] = self.np_random.uniform(low=self.low, high=self.high, size=(4, len(ended)))
        self.steps[ended] = 0
        obs[ended] = state[:, ended].T.astype(np.float32)
        info = {"final_obs": final_obs, "_final_obs": done, "final_info": {}, "_final_info": done.copy()}
        return obs, reward, terminated, truncated, info

    def get_state(self) -> dict[str, Any]:
        """Everything a step depends on (copies), for `rlstack.envs.state.capture`."""
        return {"num_envs": self.num_envs, "state": copy.deepcopy(self.state), "steps": self.steps.copy(),
                "low": self.low, "high": self.high, "np_random": copy.deepcopy(self.np_random)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a `get_state()` of an env built with the same id, count and kwargs."""
        if state.get("num_envs") != self.num_envs:
            raise ValueError(f"saved environment state has {state.get('num_envs')} envs, this run has {self.num_envs}")
        self.state, self.steps = copy.deepcopy(state["state"]), state["steps"].copy()
        self.low, self.high = state["low"], state["high"]
        self.np_random = copy.deepcopy(state["np_random"])


SAME_STEP_ADAPTERS: dict[str, type[gym.vector.VectorEnv]] = {
    "CartPole-v0": SameStepCartPole,
    "CartPole-v1": SameStepCartPole,
}
"""Ids whose registered vector env autoresets NEXT_STEP -> the SAME_STEP subclass used instead.
Built through `gym.make_vec`, so the id's `max_episode_steps` (200 for v0, 500 for v1) applies."""


def native_entry_point(env_id: str) -> Callable[..., gym.vector.VectorEnv] | None:
    """The class that steps all copies of `env_id` at once with SAME_STEP autoreset: its adapter,
    or its registered vector entry point when that already autoresets SAME_STEP (rlstack's
    self-play games); None when it has neither."""
    if env_id in SAME_STEP_ADAPTERS:
        return SAME_STEP_ADAPTERS[env_id]
    entry = gym.spec(env_id).vector_entry_point
    if entry is None:
        return None
    try:
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
    except (ImportError, gym.error.DependencyNotInstalled):
        return None  # e.g. the phys2d ids' JAX vector envs without jax installed
    autoreset = getattr(creator, "metadata", {}).get("autoreset_mode")
    return creator if autoreset == AutoresetMode.SAME_STEP else None


def rejected_kwargs(creator: Callable[..., gym.vector.VectorEnv], kwargs: dict[str, Any]) -> list[str]:
    """The keys of `kwargs` (env.kwargs, as for `gym.make`) the vector env `creator` does not take."""
    params = inspect.signature(creator).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [k for k in kwargs if k not in params or k == "num_envs"]

"""Building seeded gymnasium vector envs for the actor stage, with plain errors for bad ids.

Every env rlstack steps is made here, in the learner, in actor processes and in Ray actors alike,
so the user's hooks apply everywhere through the same two functions:

- `import_env_modules(env.imports)`: modules imported before any env is made (a module that calls
  `gymnasium.register` at import makes its ids available in this process);
- `resolve_wrappers(env.wrappers)`: `"module:Callable"` entries, each applied in order to every
  single env right after `gymnasium.make` returns it (`env = fn(env)`), outside gymnasium's own
  registration wrappers (time limit, order enforcing, env checker). rlstack adds no per-env
  wrappers of its own (observation normalisation is inside the graph), so the user's are the
  outermost, and the vector env is built over the wrapped envs.

An id may also name the module that registers it, gymnasium's `"module:Id"` form
(`my_pkg.envs:MyEnv-v0`): the module is imported first, as `gymnasium.make` does.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from rlstack.envs.vectorized import SAME_STEP_ADAPTERS, native_entry_point, rejected_kwargs
from rlstack.errors import RlstackError


class EnvError(RlstackError, ValueError):
    """The environment cannot be made (unknown id, missing extra, bad kwargs)."""


Wrapper = Callable[[gym.Env], gym.Env]
"""An `env.wrappers` entry resolved: called with one env, returns the env to use instead."""


def _import(module: str) -> str | None:
    """Import `module`; None, or why it failed (the exception's type and text)."""
    try:
        importlib.import_module(module)
    except Exception as err:  # ImportError, or whatever the module's own code raised
        return f"{type(err).__name__}: {err}"
    return None


def import_env_modules(modules: Sequence[str]) -> None:
    """Import each of `modules` (`env.imports`), in order, before any env is made: a module that
    calls `gymnasium.register` at import makes its ids available in this process. Importing again
    is free (Python keeps imported modules). Raises EnvError naming the key and the module."""
    for module in modules:
        if not isinstance(module, str) or not module.strip():
            raise EnvError(f"env.imports: {module!r} is not a module name (e.g. my_pkg.envs)")
        failed = _import(module)
        if failed:
            raise EnvError(f"env.imports: could not import '{module}': {failed} (is it installed, or on "
                           "PYTHONPATH in every process that makes the env?)")


def resolve_wrappers(entries: Sequence[str | Wrapper]) -> list[Wrapper]:
    """The callables of `env.wrappers` entries (`"module:Callable"`, the attribute may be dotted:
    `"module:Class.factory"`), in order; a callable is taken as it is. Raises EnvError naming the
    key and the entry when an entry is malformed, its module does not import, or it names
    nothing callable."""
    wrappers = []
    for entry in entries:
        if callable(entry):
            wrappers.append(entry)
            continue
        where = f"env.wrappers entry {entry!r}"
        module, colon, attr = entry.partition(":") if isinstance(entry, str) else ("", "", "")
        if not (colon and module.strip() and attr.strip()) or ":" in attr:
            raise EnvError(f"{where} is not of the form 'module:Callable' (e.g. "
                           "'gymnasium.wrappers:FlattenObservation')")
        failed = _import(module)
        if failed:
            raise EnvError(f"{where}: could not import module '{module}': {failed}")
        target: Any = importlib.import_module(module)
        for i, part in enumerate(attr.split(".")):
            if not hasattr(target, part):
                owner = ".".join([module, *attr.split(".")[:i]])
                raise EnvError(f"{where}: '{owner}' has no attribute '{part}'")
            target = getattr(target, part)
        if not callable(target):
            raise EnvError(f"{where}: '{module}.{attr}' is not callable (it is of type {type(target).__name__}; "
                           "a wrapper is called with the env and returns the wrapped env)")
        wrappers.append(target)
    return wrappers


ENV_FAMILIES: dict[str, tuple[str, str]] = {
    "MinAtar/": ("minatar.gym", "minatar"),
    "ALE/": ("ale_py", "atari"),
}
"""Id prefix -> (the module whose import registers those ids, the extra that installs it). Atari's
`<Game>NoFrameskip-v4` ids (RL Baselines3 Zoo's) are ale_py's too."""


def _register_family(name: str) -> None:
    """Register the ids of the family `name` belongs to (MinAtar, Atari) if they are not yet."""
    if name in gym.registry:
        return
    family = next((v for k, v in ENV_FAMILIES.items() if name.startswith(k)), None)
    if family is None and name.endswith("NoFrameskip-v4"):
        family = ENV_FAMILIES["ALE/"]
    if family is None:
        return
    module, extra = family
    failed = _import(module)
    if failed:
        raise EnvError(f"environment '{name}' needs the '{extra}' extra: pip install -e \".[{extra}]\" ({failed})")
    if module == "minatar.gym" and not any(k.startswith("MinAtar/") for k in gym.registry):
        importlib.import_module(module).register_envs()  # once (its import alone registers nothing)


def is_atari(name: str) -> bool:
    """An ALE id: `ALE/<Game>-v5` or the Zoo's `<Game>NoFrameskip-v4`."""
    return name.startswith("ALE/") or name.endswith("NoFrameskip-v4")


GAME_EPISODES = "episodes_in_info"
"""`metadata` key of an env that ends training episodes early (Atari's lost lives) and reports
each whole game in `info["episode"]` (gymnasium's `RecordEpisodeStatistics`: `r` the unclipped
score, `l` its agent steps): the collector logs those games, not its own sums of the rewards it
learns from."""


def finished_games(info: dict[str, Any]) -> list[tuple[float, int]]:
    """(score, agent steps) of each whole game that ended in a vector step of a `GAME_EPISODES`
    env (with SAME_STEP autoreset the ending step's info is `info["final_info"]`)."""
    final = info.get("final_info", {})
    stats = final.get("episode")
    if stats is None:
        return []
    return [(float(stats["r"][i]), int(stats["l"][i])) for i in np.flatnonzero(final["_episode"])]


class EpisodicLife(gym.Wrapper):
    """A lost life ends the training episode and the game goes on: the reset after a lost life
    is a no-op step, a real reset only after the game is over (DeepMind's and Stable-Baselines3's
    `EpisodicLifeEnv`). gymnasium's `AtariPreprocessing(terminal_on_life_loss=True)` resets the
    whole game instead, so an agent would only ever play a game's first life."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.metadata = {**env.metadata, GAME_EPISODES: True}
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after every reset and after every lost life, for games that wait for it
    (Stable-Baselines3's `FireResetEnv`; gymnasium has no such wrapper). In training a lost life
    ends the episode (`EpisodicLife`), so the reset presses it; in evaluation the game goes on,
    and a greedy policy that never chose FIRE would stand still until the time limit."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        if lives < self.lives and not (terminated or truncated):
            obs, more, terminated, truncated, info = self.env.step(1)
            reward += more
        self.lives = lives
        return obs, reward, terminated, truncated, info


def atari_preprocessing(env: gym.Env, training: bool) -> gym.Env:
    """The standard Atari preprocessing (Mnih et al. 2015, as Stable-Baselines3's `AtariWrapper`
    and CleanRL's `ppo_atari.py`) from gymnasium's wrappers where they exist: up to 30 no-op
    actions at reset, frame skip 4 with the max of the last two frames, 84x84 grayscale uint8,
    FIRE at reset where the game needs it, 4 frames stacked ([4, 84, 84]); for training only, a
    lost life ends the episode (`EpisodicLife`), rewards are clipped to their sign, and each whole
    game's unclipped score is reported in `info["episode"]` (`GAME_EPISODES`). Evaluation plays
    whole games and reports the game's score."""
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                          terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    if training:
        env = EpisodicLife(gym.wrappers.RecordEpisodeStatistics(env))
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    if training:
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
    return gym.wrappers.FrameStackObservation(env, 4)


def _make(name: str, kwargs: dict[str, Any], render: dict[str, Any], training: bool) -> gym.Env:
    """`gymnasium.make`, then a family's own preprocessing (Atari's)."""
    if is_atari(name):
        # the preprocessing skips frames itself; v5's default skip of 4 would skip 16
        env = gym.make(name, **render, **{"frameskip": 1, **kwargs})
        return atari_preprocessing(env, training)
    return gym.make(name, **render, **kwargs)


def _registered_id(env_id: str) -> str:
    """The registry id `env_id` names, importing the module of a `"module:Id"` id first (as
    gymnasium.make does); raises EnvError naming the id when the module or the id does not exist."""
    module, name = "", env_id
    if ":" in env_id:
        module, _, name = env_id.partition(":")
        if not module or not name or ":" in name:
            raise EnvError(f"environment id '{env_id}' is not of the form 'Id' or 'module:Id' "
                           "(e.g. my_pkg.envs:MyEnv-v0)")
        failed = _import(module)
        if failed:
            raise EnvError(f"environment id '{env_id}': could not import module '{module}': {failed}")
    _register_family(name)
    if name in gym.registry:
        return name
    close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    where = f" (no id '{name}' is registered after importing '{module}')" if module else ""
    raise EnvError(f"unknown environment id '{env_id}'{where}{hint} (see gymnasium.registry for registered ids)")


def _wrap(env: gym.Env, wrappers: Sequence[Wrapper], entries: Sequence[Any], env_id: str) -> gym.Env:
    for fn, entry in zip(wrappers, entries, strict=True):
        try:
            wrapped = fn(env)
        except Exception as err:
            env.close()
            raise EnvError(f"env.wrappers entry {entry!r} failed on environment '{env_id}': "
                           f"{type(err).__name__}: {err}") from err
        if not isinstance(wrapped, gym.Env):
            env.close()
            raise EnvError(f"env.wrappers entry {entry!r} returned a {type(wrapped).__name__}, not a "
                           "gymnasium.Env (a wrapper is called with the env and returns the wrapped env)")
        env = wrapped
    return env


def make_env(env_id: str, kwargs: dict[str, Any] | None = None, render_mode: str | None = None, *,
             imports: Sequence[str] = (), wrappers: Sequence[str | Wrapper] = (), training: bool = True) -> gym.Env:
    """One gymnasium env, `imports` (`env.imports`) imported before and `wrappers` (`env.wrappers`)
    applied after it is made; raises EnvError with the reason when it cannot be made. `training`:
    an Atari game with training's preprocessing (`atari_preprocessing`), else evaluation's."""
    import_env_modules(imports)
    fns = resolve_wrappers(wrappers)
    name = _registered_id(env_id)
    # render_mode only when asked for, as the vector envs' copies are made: an env need not take it.
    render = {} if render_mode is None else {"render_mode": render_mode}
    try:
        env = _make(name, kwargs or {}, render, training)
    except gym.error.DependencyNotInstalled as err:
        raise EnvError(f"environment '{env_id}' needs an extra package: {err}") from None
    except TypeError as err:
        raise EnvError(f"environment '{env_id}' rejected env.kwargs {kwargs}: {err}") from None
    return _wrap(env, fns, wrappers, env_id)


VECTORIZATIONS = ("auto", "native", "per_env")
"""How `make_vector_env` batches the copies (`env.vectorization`): `native` the env's own batched
implementation, `per_env` one env object per copy (SyncVectorEnv / AsyncVectorEnv, `env.vector`),
`auto` native when the id has one that takes `env.kwargs`, else per_env."""


def make_vector_env(env_id: str, n_envs: int, vector: str = "sync",
                    kwargs: dict[str, Any] | None = None, vectorization: str = "auto", *,
                    imports: Sequence[str] = (), wrappers: Sequence[str | Wrapper] = (),
                    training: bool = True) -> gym.vector.VectorEnv:
    """`n_envs` copies of `env_id` (seed them with `envs.reset(seed=seed)`; per_env: env i gets seed + i,
    native: one generator for all copies). `imports` (`env.imports`) are imported first; `wrappers`
    (`env.wrappers`) wrap every copy, so they need one env object per copy: `auto` is then
    per_env, and `native` is refused.

    Autoreset is SAME_STEP: when an episode ends, `step` returns the first observation of the
    next episode and puts the last one in `info["final_obs"]`, so the learner can bootstrap a
    truncated episode from V(final_obs) without a dead transition on the following step.
    """
    if vectorization not in VECTORIZATIONS:
        raise EnvError(f"'env.vectorization' is {vectorization!r}; valid values: {', '.join(VECTORIZATIONS)}")
    make_env(env_id, kwargs, imports=imports, wrappers=wrappers, training=training).close()  # fail here, clearly
    fns = resolve_wrappers(wrappers)
    name = _registered_id(env_id)  # a "module:Id" id's module is imported by now
    kwargs = kwargs or {}
    native = native_entry_point(name)
    # rlstack's self-play games exist only as their vector env: it holds the opponent pool.
    only_native = native is not None and name not in SAME_STEP_ADAPTERS
    if fns and native is not None and (vectorization == "native" or only_native):
        raise EnvError(f"env.wrappers wrap single envs, but '{env_id}' would run as its own vector env "
                       f"({native.__name__}), which steps every copy in one object"
                       + ("" if only_native else "; use env.vectorization: auto or per_env"))
    if vectorization == "per_env" or (fns and vectorization == "auto"):  # one env object per copy
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
            spec = dataclasses.replace(gym.spec(name), vector_entry_point=native)
            return gym.make_vec(spec, num_envs=n_envs, vectorization_mode="vector_entry_point", **kwargs)
        if vectorization == "native" or only_native:
            hint = "" if only_native else "; use env.vectorization: per_env"
            raise EnvError(f"the native vector env of '{env_id}' ({native.__name__}) does not take env.kwargs "
                           f"{', '.join(rejected)}{hint}")

    def factory():
        return _wrap(_make(name, kwargs, {}, training), fns, wrappers, env_id)

    cls = SyncVectorEnv if vector == "sync" else AsyncVectorEnv
    envs = cls([factory] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP)
    return envs


def _native_ids() -> list[str]:
    return [k for k in gym.registry if native_entry_point(k) is not None]

"""A user's own environment: a module outside rlstack that registers a gymnasium id at import,
reached by `env.id: module:Id` or by `env.imports`, with `env.wrappers` applied to every env, in
the learner and in actor processes; and the errors for a module or an entry that is wrong.

The user's modules (the env, and apart from it the wrappers) are written to a temporary directory
put on sys.path (in-process) and on PYTHONPATH (subprocesses). Spawned actor processes start from a
fresh interpreter, so an env made there proves that the actor imported the module itself; the env
and the wrappers record in a file which process made and wrapped an env."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from rlstack.config import ConfigError, load_config
from rlstack.envs import EnvError, make_env, make_vector_env
from rlstack.envs.make import import_env_modules, resolve_wrappers

pytestmark = pytest.mark.slow  # ~1 minute here: three short training runs, with actor processes and a Ray actor

MODULE = "rlstack_test_user_envs"
WRAPPER_MODULE = "rlstack_test_user_wrappers"
"""Apart from MODULE, so that importing the wrappers does not register the env."""
ENV_ID = "UserTarget-v0"
LENGTH = 8
"""Steps per episode of the user env (then truncated)."""

ENV_SOURCE = f'''
"""A user's env package: `import {MODULE}` registers {ENV_ID}."""

import os

import gymnasium as gym
import numpy as np


def mark(path, what):
    """Append `what` and this process's id to the file `path` (the test reads who did what where)."""
    if path:
        with open(path, "a") as f:
            f.write(f"{{what}} {{os.getpid()}}\\n")


class Target(gym.Env):
    """A random point in [-1, 1]^2; action 1 pays 1 when its x > 0, action 0 when x <= 0.
    {LENGTH} steps an episode (truncated)."""

    def __init__(self, marker=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.marker = marker
        mark(marker, "made")

    def _draw(self):
        self.point = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self.point

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {{}}

    def step(self, action):
        reward = float(int(action) == int(self.point[0] > 0))
        self.t += 1
        return self._draw(), reward, False, self.t >= {LENGTH}, {{}}


gym.register(id="{ENV_ID}", entry_point="{MODULE}:Target")
'''

WRAPPER_SOURCE = '''
"""A user's reward wrappers."""

import os

import gymnasium as gym


def mark(path, what):
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {os.getpid()}\\n")


class AddOne(gym.RewardWrapper):
    def __init__(self, env):
        super().__init__(env)
        mark(env.unwrapped.marker, "wrapped")

    def reward(self, reward):
        return reward + 1.0


class Times(gym.RewardWrapper):
    def __init__(self, env, factor):
        super().__init__(env)
        self.factor = factor

    def reward(self, reward):
        return self.factor * reward


def times_ten(env):
    return Times(env, 10.0)


NOT_CALLABLE = 3
'''

WRAPPERS = [f"{WRAPPER_MODULE}:AddOne", f"{WRAPPER_MODULE}:times_ten"]
"""In this order every step pays (r + 1) * 10, 10 or 20: an episode returns 80..160 in tens (the
other order pays 10 r + 1; unwrapped an episode returns 0..8)."""


def _forget_module() -> None:
    sys.modules.pop(MODULE, None)
    gym.registry.pop(ENV_ID, None)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory holding the user's modules, on sys.path and PYTHONPATH while this file runs."""
    where = tmp_path_factory.mktemp("user_pkg")
    (where / f"{MODULE}.py").write_text(ENV_SOURCE)
    (where / f"{WRAPPER_MODULE}.py").write_text(WRAPPER_SOURCE)
    old_path = os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(where))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(where), old_path) if p)
    yield where
    sys.path.remove(str(where))
    if old_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old_path
    _forget_module()
    sys.modules.pop(WRAPPER_MODULE, None)


def _marks(path: Path) -> dict[str, set[int]]:
    """What the user's module recorded: {"made": pids, "wrapped": pids}."""
    seen: dict[str, set[int]] = {"made": set(), "wrapped": set()}
    for line in path.read_text().splitlines() if path.exists() else []:
        what, pid = line.split()
        seen[what].add(int(pid))
    return seen


def _short_ppo(marker: Path, *overrides: str) -> list[str]:
    return ["train.total_steps=3072", "train.n_steps=32", "train.batch_size=64", "train.n_epochs=4",
            "train.lr=3e-3", "train.progress=off", "env.n_envs=4", "env.eval_episodes=4",
            f"env.kwargs={{marker: {marker}}}", *overrides]


def test_ppo_trains_on_a_module_colon_id(user_dir, tmp_path):
    """`env.id: module:Id`: gymnasium's form, the module imported by the id itself (nothing else)."""
    from rlstack.trainer import Trainer

    _forget_module()  # not imported, not registered: only the id's module part can bring it
    marker = tmp_path / "marks.txt"
    cfg = load_config(None, _short_ppo(marker, f"env.id={MODULE}:{ENV_ID}"))
    assert MODULE not in sys.modules
    summary = Trainer(cfg, tmp_path / "run").train()
    assert MODULE in sys.modules and ENV_ID in gym.registry
    assert summary["total_steps"] >= 3072 and summary["episodes"] >= 3072 // LENGTH - 4
    assert _marks(marker)["made"] == {os.getpid()}
    # A random policy returns 4 of 8 on average; the rule (act on the sign of x) is learnt.
    assert summary["eval/mean_return"] >= 6.5, summary["eval/returns"]


def test_env_imports_and_wrappers_reach_two_actor_processes(user_dir, tmp_path):
    """`env.imports` + `env.wrappers` with `actors: 2`: each actor process (a fresh interpreter)
    imports the module, makes the user env and wraps every copy; the learner's evaluation too."""
    from rlstack.trainer import Trainer

    _forget_module()
    marker = tmp_path / "marks.txt"
    cfg = load_config(None, _short_ppo(marker, f"env.id={ENV_ID}", f"env.imports=[{MODULE}]",
                                       f"env.wrappers=[{', '.join(WRAPPERS)}]", "actors=2",
                                       "train.total_steps=2048"))
    assert MODULE in sys.modules  # the learner imported it while resolving the config
    summary = Trainer(cfg, tmp_path / "run").train()
    assert summary["total_steps"] >= 2048 and summary["episodes"] >= 2048 // LENGTH - 8
    marks = _marks(marker)
    actors = marks["made"] - {os.getpid()}
    assert len(actors) == 2, marks  # both actor processes made the user env...
    assert actors <= marks["wrapped"], marks  # ...and wrapped it
    assert os.getpid() in marks["wrapped"]  # the learner's evaluation envs
    # The chunks' episodes (collected in the actors) and the evaluation are wrapped, in order.
    assert 10 * LENGTH <= summary["rollout/ep_return_mean"] <= 20 * LENGTH, summary["rollout/ep_return_mean"]
    returns = np.asarray(summary["eval/returns"])
    assert np.all(returns % 10 == 0) and np.all((returns >= 10 * LENGTH) & (returns <= 20 * LENGTH)), returns


def test_wrappers_apply_to_the_learners_own_envs(user_dir, tmp_path):
    """`actors: 0`: the learner collects with its own envs, which are wrapped too."""
    from rlstack.trainer import Trainer

    cfg = load_config(None, _short_ppo(tmp_path / "marks.txt", f"env.id={ENV_ID}", f"env.imports=[{MODULE}]",
                                       f"env.wrappers=[{', '.join(WRAPPERS)}]", "train.total_steps=1024"))
    summary = Trainer(cfg, tmp_path / "run").train()
    assert 10 * LENGTH <= summary["rollout/ep_return_mean"] <= 20 * LENGTH, summary["rollout/ep_return_mean"]


def test_env_imports_and_wrappers_reach_a_ray_actor(user_dir, tmp_path):
    """The same through the command line and `actors_backend: ray` (a Ray instance on this machine
    started by the run; its workers find the module on PYTHONPATH, as a cluster's nodes must). Ray
    is in the `ray` extra README command 2 installs: without it the run fails."""
    marker = tmp_path / "marks.txt"
    done = subprocess.run([sys.executable, "-m", "rlstack.train", "--out", str(tmp_path / "run"),
                           *_short_ppo(marker, f"env.id={ENV_ID}", f"env.imports=[{MODULE}]",
                                       f"env.wrappers=[{', '.join(WRAPPERS)}]", "actors=1", "actors_backend=ray",
                                       "train.total_steps=1024", "train.progress=log")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["total_steps"] >= 1024 and summary["episodes"] > 0
    placed = next(line for line in done.stdout.splitlines() if "ray actors: " in line)
    actor = int(re.search(r"pid (\d+)", placed).group(1))
    marks = _marks(marker)
    assert actor in marks["made"] and actor in marks["wrapped"], (placed, marks)
    assert 10 * LENGTH <= summary["rollout/ep_return_mean"] <= 20 * LENGTH, summary["rollout/ep_return_mean"]


def test_wrappers_wrap_every_copy_in_order(user_dir, tmp_path):
    marker = tmp_path / "marks.txt"
    envs = make_vector_env(ENV_ID, 3, kwargs={"marker": str(marker)}, imports=[MODULE], wrappers=WRAPPERS)
    assert isinstance(envs, SyncVectorEnv)
    assert marker.read_text().count("wrapped") == 3 + 1  # every copy, and the env made first to check
    envs.reset(seed=0)
    rewards = np.concatenate([envs.step(envs.action_space.sample())[1] for _ in range(20)])
    assert set(np.unique(rewards)) <= {10.0, 20.0} and len(np.unique(rewards)) == 2
    single = make_env(ENV_ID, imports=[MODULE], wrappers=list(reversed(WRAPPERS)))
    single.reset(seed=0)
    assert {single.step(a)[1] for a in (0, 1) * 4} == {1.0, 11.0}  # the other order: 10 r + 1
    # A callable may stand in for an entry (the Python API).
    assert resolve_wrappers([f"{WRAPPER_MODULE}:Times", len]) == [sys.modules[WRAPPER_MODULE].Times, len]


def test_wrappers_need_one_env_per_copy():
    wrap = ["gymnasium.wrappers:RecordEpisodeStatistics"]
    assert isinstance(make_vector_env("CartPole-v1", 2, wrappers=wrap), SyncVectorEnv)  # auto: per_env
    with pytest.raises(EnvError, match="env.wrappers wrap single envs.*CartPole-v1.*auto or per_env"):
        make_vector_env("CartPole-v1", 2, vectorization="native", wrappers=wrap)
    with pytest.raises(EnvError, match="env.wrappers wrap single envs.*rlstack/TicTacToe-v0"):
        make_vector_env("rlstack/TicTacToe-v0", 2, wrappers=wrap)


def test_a_module_that_does_not_import_is_a_config_error(user_dir, tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["env.imports=[no_such_pkg.envs]"])
    assert "env.imports" in str(err.value) and "'no_such_pkg.envs'" in str(err.value)
    assert "No module named 'no_such_pkg'" in str(err.value)
    (tmp_path / "broken_user_envs.py").write_text("import gymnasium\nraise RuntimeError('half-written module')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(EnvError, match=r"env.imports: could not import 'broken_user_envs': "
                                           r"RuntimeError: half-written module"):
            import_env_modules(["broken_user_envs"])  # what an actor process runs
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("broken_user_envs", None)


@pytest.mark.parametrize(("entry", "says"), [
    ("no_colon", "is not of the form 'module:Callable'"),
    (f"{WRAPPER_MODULE}:", "is not of the form 'module:Callable'"),
    ("no_such_pkg.wrappers:Scale", "could not import module 'no_such_pkg.wrappers': ModuleNotFoundError"),
    (f"{WRAPPER_MODULE}:Missing", f"'{WRAPPER_MODULE}' has no attribute 'Missing'"),
    (f"{WRAPPER_MODULE}:Times.__name__", f"'{WRAPPER_MODULE}.Times.__name__' is not callable"),
    (f"{WRAPPER_MODULE}:NOT_CALLABLE", f"'{WRAPPER_MODULE}.NOT_CALLABLE' is not callable (it is of type int"),
])
def test_a_bad_wrapper_entry_is_a_config_error_naming_it(user_dir, entry, says):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"env.wrappers=['{entry}']"])
    assert str(err.value).startswith(f"env.wrappers entry '{entry}'") and says in str(err.value)


def test_a_module_colon_id_names_the_id_when_the_module_or_the_id_is_missing(user_dir):
    with pytest.raises(EnvError) as err:
        make_env("no_such_pkg.envs:MyEnv-v0")
    assert "'no_such_pkg.envs:MyEnv-v0'" in str(err.value) and "No module named 'no_such_pkg'" in str(err.value)
    with pytest.raises(EnvError) as err:
        make_vector_env(f"{MODULE}:UserTargt-v0", 2)
    assert f"unknown environment id '{MODULE}:UserTargt-v0'" in str(err.value)
    assert f"no id 'UserTargt-v0' is registered after importing '{MODULE}'" in str(err.value)
    assert f"did you mean {ENV_ID}" in str(err.value)
    with pytest.raises(EnvError, match="is not of the form 'Id' or 'module:Id'"):
        make_env("a:b:c")


def test_the_command_line_reports_a_bad_entry_and_exits_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlstack.train", "--out", str(tmp_path / "run"),
                           "env.wrappers=[gymnasium.wrappers:NoSuchWrapper]"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert ("error: env.wrappers entry 'gymnasium.wrappers:NoSuchWrapper': 'gymnasium.wrappers' has no "
            "attribute 'NoSuchWrapper'") in done.stderr
    assert not (tmp_path / "run").exists()

"""The memory budget (rlstack/budget.py): hostile sizes are refused before allocating, naming the
key, its value and the memory; every shipped config fits; the estimate follows the sizes."""

import re
import resource
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlstack import budget
from rlstack.config import ConfigError, load_config, shipped_configs
from rlstack.envs import EnvError, make_vector_env
from rlstack.replay import make_replay

GiB = 2**30
MACHINE = 64 * GiB
"""A fixed machine for the refusals, so they do not depend on the memory free while tests run."""
SIZE = r"~[\d,.]+ (B|KiB|MiB|GiB|TiB|PiB|EiB|ZiB|YiB)"

# Spaces of envs that need an extra not installed everywhere (`pip install -e ".[mujoco]"`).
KNOWN_SPACES = {"HalfCheetah-v5": (gym.spaces.Box(-np.inf, np.inf, (17,), np.float64),
                                   gym.spaces.Box(-1.0, 1.0, (6,), np.float32))}


def spaces_of(cfg):
    try:
        return budget.probe_spaces(cfg)
    except EnvError:
        return KNOWN_SPACES[cfg.env.id]


def refusal(config: str, *overrides: str, available: int = MACHINE) -> str:
    cfg = load_config(config, list(overrides))
    with pytest.raises(ConfigError) as err:
        budget.check_fits(cfg, *spaces_of(cfg), available_bytes=available)
    return str(err.value)


@pytest.mark.parametrize("config, override, needed_for", [
    ("ppo_cartpole", "net.hidden=[100000,100000]", "the networks' parameters"),
    ("dqn_cartpole", "net.hidden=[100000,100000]", "the networks' parameters"),
    ("sac_pendulum", "net.hidden=[100000,100000]", "the networks' parameters"),
    ("ppo_cartpole", "env.n_envs=100000000", "the environments"),
    ("dqn_cartpole", "train.buffer_size=10000000000", "the replay buffer"),
    ("sac_pendulum", "train.buffer_size=10000000000", "the replay buffer"),
    ("sac_pendulum", "train.n_critics=1000000", "the networks' parameters"),
])
def test_hostile_size_is_refused_naming_key_value_and_memory(config, override, needed_for):
    message = refusal(config, override)
    key, value = override.split("=")
    shown = value.replace(",", ", ") if value.startswith("[") else value
    assert re.search(rf"{re.escape(key)}={re.escape(shown)}(?!\d).* needs {SIZE} for {needed_for}", message), message
    assert "64.0 GiB available" in message and "To fit," in message


@pytest.mark.parametrize("config, overrides, needed_for", [
    ("ppo_cartpole", ["train.n_steps=100000000", "train.batch_size=256"], "the rollout storage"),
    ("dqn_cartpole", ["train.train_freq=10000000000"], "the rollout storage"),
    ("dqn_cartpole", ["train.batch_size=1000000000"], "the activations"),
    ("dqn_cartpole", ["train.gradient_steps=1000000000"], "the sampled minibatches"),
    ("ppo_cartpole", ["env.eval_episodes=100000000"], "the evaluation"),
    ("ppo_tictactoe_selfplay", ["selfplay.eval_games=100000000"], "the evaluation"),
    ("ppo_cartpole", ["actors=1000"], "the actor processes"),
    ("ppo_cartpole", ["env.n_envs=100000", "env.vector=async", "train.batch_size=256"], "the environments"),
])
def test_every_other_size_key_is_refused(config, overrides, needed_for):
    message = refusal(config, *overrides)
    assert re.search(rf"{re.escape(overrides[0])}(?!\d).* needs {SIZE} for {needed_for}", message), message


@pytest.mark.parametrize("path", sorted(shipped_configs().glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_fits_on_this_machine(path):
    cfg = load_config(path)
    budget.check_fits(cfg, *spaces_of(cfg))  # the memory this machine has available now
    # Atari from pixels: DQN's replay of 100k transitions, each 84x84 frame stored once, ~0.7 GiB
    # (Stable-Baselines3's, an obs and a next obs of 4 frames each: ~5.3 GiB); PPO's minibatch
    # through Nature CNN ~0.8 GiB.
    limit = {"dqn_atari": GiB, "ppo_atari": 2 * GiB}.get(path.stem, GiB)
    assert sum(n.nbytes for n in budget.estimate(cfg, *spaces_of(cfg))) < limit


def needs_of(config: str, *overrides: str) -> dict[str, int]:
    cfg = load_config(config, list(overrides))
    return {need.what: need.nbytes for need in budget.estimate(cfg, *spaces_of(cfg))}


def test_the_estimate_grows_with_the_value():
    replay = "the replay buffer"
    assert needs_of("sac_pendulum", "train.buffer_size=2000000")[replay] == \
        2 * needs_of("sac_pendulum", "train.buffer_size=1000000")[replay]
    envs = "the environments"
    assert needs_of("ppo_cartpole", "env.n_envs=64")[envs] == 2 * needs_of("ppo_cartpole", "env.n_envs=32")[envs]
    rollout = "the rollout storage"
    ratio = needs_of("ppo_pendulum", "train.n_steps=2048")[rollout] / needs_of("ppo_pendulum")[rollout]
    assert 1.9 < ratio <= 2.0
    nets = "the networks' parameters, gradients and Adam state"
    ratio = needs_of("dqn_cartpole", "net.hidden=[2048,2048]")[nets] / needs_of("dqn_cartpole", "net.hidden=[1024,1024]")[nets]
    assert 3.9 < ratio < 4.0  # the square of the width, less the first and last layers' share


def test_replay_estimate_is_what_the_replay_buffer_allocates():
    # MinAtar's planes and Atari's stacked frames as uint8, each stored once (FrameReplay)
    for config in ("dqn_cartpole", "sac_pendulum", "dqn_minatar", "dqn_atari"):
        cfg = load_config(config)
        obs_space, action_space = budget.probe_spaces(cfg)
        replay = make_replay(cfg.train.buffer_size, obs_space, action_space, cfg.env.n_envs)  # (untouched pages)
        assert needs_of(config)["the replay buffer"] == replay.nbytes


def test_probe_spaces_are_the_vector_envs_single_spaces():
    for config in ("ppo_cartpole", "ppo_pendulum", "ppo_tictactoe_selfplay"):
        cfg = load_config(config)
        envs = make_vector_env(cfg.env.id, 2, cfg.env.vector, cfg.env.kwargs)
        try:
            assert budget.probe_spaces(cfg) == (envs.single_observation_space, envs.single_action_space)
        finally:
            envs.close()


def test_the_advice_fits():
    message = refusal("dqn_cartpole", "train.buffer_size=10000000000")
    limit = int(re.search(r"lower train\.buffer_size to at most ~([\d,]+)", message).group(1).replace(",", ""))
    cfg = load_config("dqn_cartpole", [f"train.buffer_size={limit}"])
    budget.check_fits(cfg, *budget.probe_spaces(cfg), available_bytes=MACHINE)
    message = refusal("ppo_cartpole", "net.hidden=[100000,100000]")
    width = int(re.search(r"at most ~([\d,]+) wide", message).group(1).replace(",", ""))
    cfg = load_config("ppo_cartpole", [f"net.hidden=[{width},{width}]"])
    budget.check_fits(cfg, *budget.probe_spaces(cfg), available_bytes=MACHINE)


def test_a_rollout_beyond_int32_rows_is_refused_even_with_the_memory():
    message = refusal("ppo_cartpole", "train.n_steps=268435456", "env.n_envs=16", available=2**60)
    assert "train.n_steps=268435456 x env.n_envs=16" in message and "int32" in message


def test_sizes_must_be_positive():
    assert "'net.hidden[1]' must be >= 1, got 0" in refusal("ppo_cartpole", "net.hidden=[64,0]")
    assert "'train.n_steps' must be >= 1, got 0" in refusal("ppo_cartpole", "train.n_steps=0")


def test_available_memory_reads_meminfo_and_a_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
    no_cgroup = tmp_path / "none"
    assert budget.available_memory(meminfo, no_cgroup) == 20_000_000 * 1024
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(f"{8 * GiB}\n")
    (cgroup / "memory.current").write_text(f"{3 * GiB}\n")
    (cgroup / "memory.stat").write_text(f"anon {2 * GiB}\ninactive_file {GiB}\n")
    assert budget.available_memory(meminfo, cgroup) == 6 * GiB  # a container's limit, cache reclaimable
    (cgroup / "memory.max").write_text("max\n")
    assert budget.available_memory(meminfo, cgroup) == 20_000_000 * 1024


def test_human_units():
    assert [budget.human(n) for n in (512, 1536, 21.3 * GiB, 1.2 * 2**40)] == \
        ["512 B", "1.5 KiB", "21.3 GiB", "1.2 TiB"]


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (8 * GiB, 8 * GiB))  # if the check is missing: MemoryError, not OOM


def test_cli_refuses_a_network_that_cannot_fit_before_allocating(tmp_path):
    """Needs the wiring in `Trainer.__init__`: `budget.check_fits(cfg, *budget.probe_spaces(cfg))`."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlstack.train", "net.hidden=[200000,200000]", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, preexec_fn=_limit_memory)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert re.search(rf"error: net\.hidden=\[200000, 200000\] needs {SIZE} for the networks'", proc.stderr), \
        proc.stderr[-3000:]
    assert not Path(out).exists()

"""`python -m rlstack.bench peer`: the Stable-Baselines3 side is built from the same config (the
SB3 runs themselves need the peer's venv: `python -m rlstack.bench peer --python VENV/bin/python`)."""

import ast
import json

import pytest

from rlstack.bench import update
from rlstack.bench.peer import SB3_SCRIPT, sb3_spec
from rlstack.bench.update import SB3_UPDATE
from rlstack.config import load_config


@pytest.mark.parametrize(("config", "family", "policy", "encoder"), [
    ("ppo_cartpole", None, "MlpPolicy", "mlp"),
    ("ppo_minatar", "minatar", "CnnPolicy", "minatar_cnn"),
    ("ppo_atari", "atari", "CnnPolicy", "nature_cnn"),
    ("dqn_atari", "atari", "CnnPolicy", "nature_cnn"),
])
def test_the_peer_gets_the_same_config_steps_and_seed(config, family, policy, encoder):
    cfg = load_config(config, ["seed=7", "train.total_steps=4096", "env.eval_episodes=3"])
    spec = sb3_spec(cfg, evaluate=True)
    assert (spec["family"], spec["policy"], spec["encoder"]) == (family, policy, encoder)
    assert (spec["seed"], spec["total_steps"], spec["eval_episodes"]) == (7, 4096, 3)
    assert (spec["env"], spec["n_envs"], spec["hidden"]) == (cfg.env.id, cfg.env.n_envs, list(cfg.net.hidden))
    t = cfg.train
    if cfg.algo == "ppo":
        assert spec["kwargs"]["clip_range"] == t.clip_range and spec["kwargs"]["n_epochs"] == t.n_epochs
    else:
        assert spec["kwargs"]["learning_starts"] == t.learning_starts
        assert spec["kwargs"]["exploration_final_eps"] == t.exploration_final_eps
    assert sb3_spec(cfg)["eval_episodes"] == 0  # no evaluation unless asked


def test_the_peer_scripts_are_valid_python():
    ast.parse(SB3_SCRIPT)
    ast.parse(SB3_UPDATE)


def test_bench_update_times_the_gradient_step_and_refuses_on_policy_configs(capsys):
    """rlstack's side of `bench update` (SB3's needs the peer's venv): a real SAC step graph on a
    replay of random transitions, timed per gradient step."""
    assert update.main(["--configs", "sac_pendulum", "--repeats", "2", "--calls", "2", "--fill", "300",
                        "net.hidden=[16,16]"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])
    (row,) = result["rows"]
    assert row["algo"] == "sac" and row["hidden"] == [16, 16] and "sb3_ms" not in row
    assert 0 < row["rlstack_ms"]["min"] <= row["rlstack_ms"]["median"] <= row["rlstack_ms"]["max"]
    with pytest.raises(SystemExit, match="replay buffer, not ppo"):
        update.main(["--configs", "ppo_cartpole", "--repeats", "1", "--calls", "1", "--fill", "10"])


@pytest.mark.parametrize("config", ["sac_pendulum", "td3_pendulum"])
def test_the_peer_gets_sac_and_td3_settings(config):
    cfg = load_config(config, ["train.noise_std=0.3"] if config.startswith("td3") else [])
    spec = sb3_spec(cfg)
    t, kwargs = cfg.train, spec["kwargs"]
    assert (kwargs["learning_rate"], kwargs["tau"], kwargs["gamma"], kwargs["batch_size"]) == (t.lr, t.tau, t.gamma,
                                                                                               t.batch_size)
    if cfg.algo == "td3":
        assert (kwargs["policy_delay"], kwargs["target_policy_noise"], kwargs["target_noise_clip"]) == (2, 0.2, 0.5)
        assert spec["action_noise"] == {"type": "normal", "std": 0.3} and "target_update_interval" not in kwargs
        assert sb3_spec(load_config(config, ["train.noise_type=none"]))["action_noise"] is None
    else:
        assert kwargs["target_update_interval"] == 1 and spec["action_noise"] is None


def test_the_peer_normalizes_as_the_config_does():
    cfg = load_config("ppo_halfcheetah")
    spec = sb3_spec(cfg)
    assert spec["normalize"] == {"obs": True, "reward": True, "clip_obs": 10.0, "clip_reward": 10.0, "gamma": 0.98}
    assert spec["policy_kwargs"] == {"ortho_init": False, "log_std_init": -2.0}
    assert spec["hidden"] == [256, 256] and spec["activation"] == "relu"
    assert sb3_spec(load_config("ppo_cartpole"))["normalize"] is None


def test_bench_mujoco_finds_the_shipped_configs_and_names_them_otherwise():
    from rlstack.bench.mujoco import config_name

    assert config_name("td3", "HalfCheetah") == "td3_halfcheetah"
    assert config_name("sac", "hopper") == "sac_hopper"
    with pytest.raises(SystemExit, match="no shipped MuJoCo config 'ppo_hopper'; available: .*ppo_halfcheetah"):
        config_name("ppo", "Hopper")

"""`python -m rlstack.bench peer`: the Stable-Baselines3 side is built from the same config (the
SB3 runs themselves need the peer's venv: `python -m rlstack.bench peer --python VENV/bin/python`)."""

import ast

import pytest

from rlstack.bench.peer import SB3_SCRIPT, sb3_spec
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


def test_the_peer_script_is_valid_python():
    ast.parse(SB3_SCRIPT)

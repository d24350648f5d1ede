"""Config loading: YAML + dotted overrides; typos and wrong types are named with their close matches."""

from pathlib import Path

import pytest

from rlstack.config import ConfigError, config_hash, load_config, to_dict
from rlstack.envs import EnvError, make_vector_env

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_default_config_is_the_zoo_cartpole():
    cfg = load_config()
    assert (cfg.algo, cfg.env.id, cfg.env.n_envs) == ("ppo", "CartPole-v1", 8)
    t = cfg.train
    assert (t.n_steps, t.batch_size, t.n_epochs, t.gae_lambda, t.gamma, t.ent_coef, t.lr, t.clip_range,
            t.total_steps) == (32, 256, 20, 0.8, 0.98, 0.0, "lin_1e-3", "lin_0.2", 100_000)


def test_overrides_are_typed_and_nested():
    cfg = load_config(None, ["seed=3", "env.id=Acrobot-v1", "train.total_steps=50000", "train.lr=3e-4",
                             "net.hidden=[32,32]"])
    assert cfg.seed == 3 and cfg.env.id == "Acrobot-v1" and cfg.train.total_steps == 50_000
    assert float(cfg.train.lr) == 3e-4 and cfg.net.hidden == [32, 32]


def test_unknown_key_names_the_key_and_close_matches():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.total_step=10"])
    msg = str(err.value)
    assert "train.total_step" in msg and "train.total_steps" in msg


def test_unknown_top_level_key_lists_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["sed=1"])
    assert "'sed'" in str(err.value) and "seed" in str(err.value)


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match="train.n_epochs"):
        load_config(None, ["train.n_epochs=many"])


def test_bad_choice_and_bad_schedule():
    with pytest.raises(ConfigError, match="device.*cpu, gpu, ascend"):
        load_config(None, ["device=tpu"])
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(None, ["train.lr=fast"])
    with pytest.raises(ConfigError, match="batch_size"):
        load_config(None, ["train.batch_size=100"])


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.lr"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  n_epochz: 3\n")
    with pytest.raises(ConfigError, match=r"n_epochz.*n_epochs"):
        load_config(bad)


def test_unknown_algorithm_lists_every_algorithm_that_can_be_built():
    """Not only those already imported: the entry points' too."""
    with pytest.raises(ConfigError, match="unknown algorithm 'a2c'; valid: alphazero, dqn, ppo, sac, td3"):
        load_config(None, ["algo=a2c"])


def test_saved_config_round_trips_and_hash_is_stable():
    cfg = load_config(None, ["seed=7"])
    again = load_config(base=to_dict(cfg))
    assert to_dict(again) == to_dict(cfg) and config_hash(again) == config_hash(cfg)
    assert config_hash(load_config(None, ["seed=8"])) != config_hash(cfg)


def test_bad_env_id_says_so_plainly():
    with pytest.raises(EnvError, match="unknown environment id 'CartPol-v1'.*CartPole-v1"):
        make_vector_env("CartPol-v1", 2)


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_loads(name):
    cfg = load_config(CONFIGS / name)
    assert cfg.env.id and cfg.train.total_steps > 0

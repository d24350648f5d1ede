"""Conv encoders in the one network module: chosen by the observation space, frames taken as the
env gives them (uint8, or bool planes) and scaled inside the graph, either channel layout, the
exported graph answering exactly as the live network on uint8 frames, and the fast CPU form
computing what MindSpore's `nn.Conv2d` computes."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from mindspore import Tensor

from rlstack.acting import Acting, load_policy
from rlstack.artifact import MANIFEST_FILE, export_policy
from rlstack.config import ConfigError, load_config
from rlstack.encoders import ENCODERS, resolve_encoder
from rlstack.envs.games import play_random
from rlstack.network import NetSpec, Network, PolicyKind, QKind, copy_parameters
from rlstack.spaces import image_layout, obs_dtype_of

ATARI = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # FrameStackObservation over 84x84 grayscale
ATARI_LAST = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
MINATAR = gym.spaces.Box(0, 1, (10, 10, 4), bool)  # minatar.gym's Breakout
ACTIONS = gym.spaces.Discrete(4)


def _frames(space: gym.Space, batch: int, seed: int = 0) -> np.ndarray:
    high = 2 if space.dtype == bool else 256
    return np.random.default_rng(seed).integers(0, high, (batch, *space.shape)).astype(np.uint8)


def _act(network: Network, obs: np.ndarray) -> tuple[np.ndarray, ...]:
    out = network(Tensor(obs), Tensor(np.zeros((len(obs), network.noise_dim), np.float32)))
    return tuple(x.asnumpy() for x in out)


def test_auto_takes_a_conv_encoder_for_frames_by_their_size_and_mlp_otherwise():
    assert resolve_encoder("auto", ATARI) == "nature_cnn"
    assert resolve_encoder("auto", ATARI_LAST) == "nature_cnn"
    assert resolve_encoder("auto", MINATAR) == "minatar_cnn"
    assert resolve_encoder("auto", gym.spaces.Box(-1, 1, (4,), np.float32)) == "mlp"
    assert resolve_encoder("auto", gym.spaces.Box(-1, 1, (3, 7, 7), np.float32)) == "mlp"  # not frames
    assert resolve_encoder("mlp", ATARI) == "mlp"
    assert image_layout(ATARI) == ((4, 84, 84), False) and image_layout(ATARI_LAST) == ((4, 84, 84), True)
    assert image_layout(MINATAR) == ((4, 10, 10), True)
    assert obs_dtype_of(MINATAR) == np.uint8 and obs_dtype_of(gym.spaces.Box(-1, 1, (4,))) == np.float32
    # the config's list of names is the registry's (config.py does not import MindSpore)
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["net.encoder=transformer"])
    listed = str(refused.value).split("valid values: ")[1]
    assert set(listed.split(", ")) == {"auto", *ENCODERS}, refused.value


def test_the_encoder_is_shared_and_its_features_feed_every_head():
    net = Network(ATARI, ACTIONS, NetSpec(hidden=(), activation="relu", encoder="auto"))
    names = [p.name for p in net.encoder_params()]
    assert names[0] == "encoder.stack.convs.0.weight" and len(names) == 8  # 3 convolutions + dense
    assert net.encoder.out_dim == 512 and net.encoder.form == "matmul"
    # the heads are one dense layer each on the 512 features
    assert tuple(net.pi.trainable_params()[0].shape) == (4, 512)
    assert tuple(net.vf.trainable_params()[0].shape) == (1, 512)
    dqn = Network(MINATAR, ACTIONS, NetSpec(hidden=(), activation="relu", policy=PolicyKind.NONE, value=False,
                                            q=QKind.DISCRETE, encoder="auto"))
    assert dqn.encoder.out_dim == 128 and tuple(dqn.qf.trainable_params()[0].shape) == (4, 128)


def test_frames_are_scaled_in_the_graph_and_either_layout_computes_the_same():
    spec = NetSpec(hidden=(), activation="relu", encoder="nature_cnn")
    small, small_last = (gym.spaces.Box(0, 255, shape, np.uint8) for shape in ((4, 36, 36), (36, 36, 4)))
    first, last = Network(small, ACTIONS, spec), Network(small_last, ACTIONS, spec)
    copy_parameters(first, last)
    frames = _frames(small, 3)
    a = _act(first, frames)
    b = _act(last, np.ascontiguousarray(frames.transpose(0, 2, 3, 1)))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    # uint8 frames and the same frames as float32 0..255 (how minibatches carry them) are one input
    c = _act(first, frames.astype(np.float32))
    np.testing.assert_array_equal(a[2], c[2])


def test_the_fast_cpu_form_computes_what_native_conv2d_computes():
    # (Nature CNN's layers and stack: tests/rlstack/test_conv.py)
    space = MINATAR
    fast = Network(space, ACTIONS, NetSpec(hidden=(), activation="relu", conv_form="matmul"))
    native = Network(space, ACTIONS, NetSpec(hidden=(), activation="relu", conv_form="native"))
    assert fast.encoder.form == "matmul" and native.encoder.form == "native"
    assert [p.name for p in fast.get_parameters()] == [p.name for p in native.get_parameters()]
    copy_parameters(fast, native)
    frames = _frames(space, 5)
    _, logp_fast, value_fast = _act(fast, frames)
    _, logp_native, value_native = _act(native, frames)
    np.testing.assert_allclose(value_fast, value_native, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logp_fast, logp_native, rtol=1e-4, atol=1e-5)


def test_the_exported_graph_takes_uint8_frames_and_answers_as_the_live_network(tmp_path):
    net = Network(MINATAR, ACTIONS, NetSpec(hidden=(), activation="relu", encoder="auto"))
    version = export_policy(net, tmp_path / "policy", algorithm="ppo", obs_space=MINATAR, action_space=ACTIONS,
                            device="cpu", fusion=False, config_hash="test")
    manifest = json.loads((version / MANIFEST_FILE).read_text())
    assert manifest["inputs"]["obs_dtype"] == "uint8"
    assert manifest["encoder"] == {"name": "minatar_cnn", "conv_form": "matmul"}
    policy = load_policy(version)
    live = Acting.of_network(net, MINATAR, ACTIONS)
    frames = _frames(MINATAR, 7, seed=3)
    exported, direct = policy.run(frames, policy.noise(7, None)), live.run(frames, live.noise(7, None))
    for x, y in zip(exported, direct, strict=True):
        np.testing.assert_array_equal(x, y)
    # one frame as the env gives it (bool planes), and a batch of them
    one = policy.act(frames[0].astype(bool), deterministic=True)
    assert one.action == exported.action[0]
    assert policy.act(frames.astype(bool), deterministic=True).action.tolist() == exported.action.tolist()


def test_conv_encoders_refuse_what_they_cannot_take():
    with pytest.raises(ValueError, match="needs image observations"):
        Network(gym.spaces.Box(-1, 1, (4,), np.float32), ACTIONS, NetSpec(encoder="nature_cnn"))
    with pytest.raises(ValueError, match="normalize_obs"):
        Network(ATARI, ACTIONS, NetSpec(encoder="auto", normalize_obs=True))
    with pytest.raises(ValueError, match="unknown encoder 'transformer'"):
        Network(ATARI, ACTIONS, NetSpec(encoder="transformer"))


# ----- the residual board tower (net.encoder: resnet) ----------------------------------------------

def _positions(game, n, plies, seed=0):
    """Flat observations of the games still going after `plies` random moves."""
    p = play_random(game.positions(n), plies, np.random.default_rng(seed))
    return p.flat_obs(np.flatnonzero(~p.over))


@pytest.mark.parametrize("name", ["connect4", "openspiel:othello"])
def test_the_resnet_tower_computes_the_same_in_both_conv_forms_and_keeps_the_board_size(name):
    from rlstack.envs.games import game_spec

    game = game_spec(name)
    space, actions = game.flat_space(), gym.spaces.Discrete(game.n_actions)
    nets = {form: Network(space, actions, NetSpec(hidden=(32,), encoder="resnet", blocks=2, channels=8,
                                                  conv_form=form)) for form in ("matmul", "native")}
    h, w, _ = space.obs_shape
    assert nets["matmul"].encoder.out_dim == 3 * h * w  # AlphaZero's 2 policy planes and 1 value plane
    rng = np.random.default_rng(0)
    for param, twin in zip(nets["native"].get_parameters(), nets["matmul"].get_parameters(), strict=True):
        assert param.name == twin.name and param.shape == twin.shape
        value = (0.2 * rng.standard_normal(param.shape)).astype(np.float32)
        param.set_data(Tensor(value))
        twin.set_data(Tensor(value.copy()))
    obs = _positions(game, 16, 6)
    fast, native = _act(nets["matmul"], obs), _act(nets["native"], obs)
    assert np.array_equal(fast[0], native[0])
    for a, b in zip(fast[1:], native[1:], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_fresh_resnet_block_is_the_identity_and_the_tower_refuses_flat_observations():
    from rlstack.envs.games import CONNECT_FOUR

    net = Network(CONNECT_FOUR.flat_space(), gym.spaces.Discrete(7), NetSpec(encoder="resnet", blocks=1, channels=4))
    second = net.encoder.blocks[0][1]
    assert not second.weight.asnumpy().any() and not second.bias.asnumpy().any()  # Fixup: starts at zero
    with pytest.raises(ValueError, match="needs a board game's observation"):
        Network(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), NetSpec(encoder="resnet"))


def test_alphazero_trains_and_exports_a_resnet_with_its_priors_entry_point(tmp_path):
    from rlstack.trainer import Trainer

    cfg = load_config("alphazero_tictactoe", ["net.encoder=resnet", "net.blocks=1", "net.channels=8",
                                               "train.total_steps=600", "train.games=16", "train.games_per_update=16",
                                               "train.simulations=4", "train.gradient_steps=4", "train.batch_size=32",
                                               "selfplay.eval_games=4", "selfplay.elo_games=2", "selfplay.eval_search=0",
                                               "env.eval_episodes=2", "train.progress=off"])
    summary = Trainer(cfg, tmp_path / "run").train()
    assert summary["updates"] >= 2
    policy = load_policy(tmp_path / "run")
    manifest = json.loads((policy.path / MANIFEST_FILE).read_text())
    assert manifest["encoder"]["name"] == "resnet" and "priors" in manifest["entry_points"]
    from rlstack.envs.games import TICTACTOE

    obs = _positions(TICTACTOE, 8, 2)
    logp_all, value = policy.priors(obs)
    result = policy.run(obs, np.zeros((8, 9), np.float32))
    np.testing.assert_allclose(logp_all[np.arange(8), result.action], result.logp, atol=1e-6)
    np.testing.assert_allclose(value, result.value, atol=1e-6)

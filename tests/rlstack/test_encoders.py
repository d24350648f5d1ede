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
        load_config(None, ["net.encoder=resnet"])
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
    with pytest.raises(ValueError, match="unknown encoder 'resnet'"):
        Network(ATARI, ACTIONS, NetSpec(encoder="resnet"))

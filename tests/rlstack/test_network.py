"""The network module: distributions against numpy, Gumbel-max sampling, act/evaluate agreement."""

import dataclasses
import math

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from rlstack.network import NetSpec, Network, PolicyKind, QKind, sample_noise

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def _policy_head(net, obs):
    """The raw policy head output (logits or Gaussian mean) of `net` at `obs`."""

    def head(o):
        return net.pi(net.features(o))

    return ms.jit(head)(Tensor(obs)).asnumpy()


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_categorical_logp_and_entropy_match_numpy():
    net = Network(OBS, gym.spaces.Discrete(3), NetSpec(policy=PolicyKind.CATEGORICAL))
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((16, 4)).astype(np.float32)
    action = rng.integers(0, 3, 16).astype(np.int32)
    logp, entropy, _ = ms.jit(net.evaluate)(Tensor(obs), Tensor(action))
    ref = _log_softmax(_policy_head(net, obs).astype(np.float64))
    np.testing.assert_allclose(logp.asnumpy(), ref[np.arange(16), action], atol=1e-6)
    np.testing.assert_allclose(entropy.asnumpy(), -(np.exp(ref) * ref).sum(-1), atol=1e-5)


def test_gaussian_logp_and_entropy_match_numpy():
    box = gym.spaces.Box(-2, 2, (2,), np.float32)
    net = Network(OBS, box, NetSpec(policy=PolicyKind.GAUSSIAN, log_std_init=-0.5))
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((8, 4)).astype(np.float32)
    action = rng.standard_normal((8, 2)).astype(np.float32)
    logp, entropy, _ = ms.jit(net.evaluate)(Tensor(obs), Tensor(action))
    mean = _policy_head(net, obs).astype(np.float64)
    std = math.exp(-0.5)
    ref = (-0.5 * ((action - mean) / std) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
    np.testing.assert_allclose(logp.asnumpy(), ref, atol=1e-5)
    np.testing.assert_allclose(entropy.asnumpy(), 2 * (0.5 + 0.5 * math.log(2 * math.pi) - 0.5), atol=1e-6)


def test_gumbel_max_frequencies_match_softmax():
    net = Network(OBS, gym.spaces.Discrete(4), NetSpec(policy=PolicyKind.CATEGORICAL))
    # distinct probabilities (~0.45 / 0.17 / 0.06 / 0.31), not the near-uniform initial policy
    net.pi[-1].bias.set_data(Tensor(np.array([1.0, 0.0, -1.0, 0.6], np.float32)))
    n = 40_000
    obs = np.tile(np.array([[0.3, -0.2, 0.5, 1.0]], np.float32), (n, 1))
    noise = sample_noise(net.noise_kind, net.noise_dim, n, np.random.default_rng(2))
    action, logp, _ = net(Tensor(obs), Tensor(noise))
    probs = np.exp(_log_softmax(_policy_head(net, obs[:1]).astype(np.float64)))[0]
    freq = np.bincount(action.asnumpy(), minlength=4) / n
    assert probs.max() - probs.min() > 0.3
    # within 4 standard errors of a binomial proportion (< 0.01 at n = 40,000)
    assert np.all(np.abs(freq - probs) <= 4 * np.sqrt(probs * (1 - probs) / n)), (freq, probs)
    np.testing.assert_allclose(np.exp(logp.asnumpy()[:4]), probs[action.asnumpy()[:4]], rtol=1e-5)


@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)])
def test_act_and_evaluate_agree(space):
    discrete = isinstance(space, gym.spaces.Discrete)
    spec = NetSpec(policy=PolicyKind.CATEGORICAL if discrete else PolicyKind.GAUSSIAN, normalize_obs=True)
    net = Network(OBS, space, spec)
    net.set_obs_stats(np.array([0.1, 0.2, 0.3, 0.4]), np.array([1.5, 0.5, 2.0, 1.0]))
    rng = np.random.default_rng(3)
    obs = rng.standard_normal((32, 4)).astype(np.float32)
    noise = sample_noise(net.noise_kind, net.noise_dim, 32, rng)
    action, logp, value = net(Tensor(obs), Tensor(noise))
    logp2, _, value2 = ms.jit(net.evaluate)(Tensor(obs), action)
    np.testing.assert_allclose(logp2.asnumpy(), logp.asnumpy(), atol=1e-5)
    np.testing.assert_array_equal(value2.asnumpy(), value.asnumpy())


def test_zero_noise_is_deterministic_mode():
    net = Network(OBS, gym.spaces.Box(-1, 1, (2,), np.float32), NetSpec(policy=PolicyKind.GAUSSIAN))
    obs = np.random.default_rng(4).standard_normal((5, 4)).astype(np.float32)
    action, _, _ = net(Tensor(obs), Tensor(np.zeros((5, 2), np.float32)))
    np.testing.assert_array_equal(action.asnumpy(), _policy_head(net, obs))


def test_observation_normalisation_is_inside_the_graph():
    net = Network(OBS, gym.spaces.Discrete(2), NetSpec(normalize_obs=True, obs_clip=5.0))
    mean, var = np.array([1.0, -1.0, 0.0, 2.0]), np.array([4.0, 1.0, 0.25, 1.0])
    net.set_obs_stats(mean, var)
    obs = np.array([[3.0, -1.0, 100.0, 2.0]], np.float32)
    got = ms.jit(net.features)(Tensor(obs)).asnumpy()
    np.testing.assert_allclose(got, [[1.0, 0.0, 5.0, 0.0]], atol=1e-6)


def test_heads_are_checked_against_spaces():
    with pytest.raises(ValueError, match="Discrete action space"):
        Network(OBS, gym.spaces.Box(-1, 1, (2,)), NetSpec(policy=PolicyKind.CATEGORICAL))
    with pytest.raises(ValueError, match="Box action space"):
        Network(OBS, gym.spaces.Discrete(2), NetSpec(policy=PolicyKind.NONE, value=False, q=QKind.CONTINUOUS))


def test_act_value_is_min_q_for_twin_critics_unless_switched_off():
    box = gym.spaces.Box(-2, 2, (2,), np.float32)
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((16, 3)).astype(np.float32)
    noise = rng.standard_normal((16, 2)).astype(np.float32)
    spec = NetSpec(policy=PolicyKind.SQUASHED_GAUSSIAN, value=False, q=QKind.CONTINUOUS)
    ms.set_seed(0)
    with_q = Network(obs_space, box, spec)
    ms.set_seed(0)
    without = Network(obs_space, box, dataclasses.replace(spec, act_value=False))
    assert (with_q.value_kind, without.value_kind) == ("min_q", "none")
    action, logp, value = (x.asnumpy() for x in with_q(Tensor(obs), Tensor(noise)))
    q = ms.jit(with_q.q_sa)(Tensor(obs), Tensor(action)).asnumpy()
    np.testing.assert_allclose(value, q.min(0), rtol=1e-5, atol=1e-6)
    action2, logp2, zeros = (x.asnumpy() for x in without(Tensor(obs), Tensor(noise)))
    np.testing.assert_array_equal(action2, action)  # same parameters, same actor
    np.testing.assert_array_equal(logp2, logp)
    np.testing.assert_array_equal(zeros, np.zeros(16, np.float32))


def test_without_orthogonal_init_the_mlp_starts_as_pytorch_linear():
    """`net.ortho_init: false` is SB3's `ortho_init=False`: every Dense layer starts as PyTorch's
    `nn.Linear`, weights and biases uniform in +-1/sqrt(fan_in) (std 1/sqrt(3 fan_in)); with it,
    orthogonal weights and zero biases."""
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    plain = Network(OBS, box, NetSpec(policy=PolicyKind.GAUSSIAN, hidden=(256, 256), ortho_init=False))
    dense = {p.name: p.asnumpy() for p in plain.pi.trainable_params() if p.name.endswith((".weight", ".bias"))}
    assert len(dense) == 6
    for name, value in dense.items():
        fan_in = dense[name.replace(".bias", ".weight")].shape[1]
        bound = 1.0 / math.sqrt(fan_in)
        assert np.abs(value).max() <= bound + 1e-7, name
        if value.size >= 256:  # enough values to see the spread of U(-bound, bound)
            assert abs(value.std() - bound / math.sqrt(3.0)) < 0.1 * bound, name
    ortho = Network(OBS, box, NetSpec(policy=PolicyKind.GAUSSIAN, hidden=(256, 256)))
    w = ortho.pi[0].weight.asnumpy()  # [256, 4]: orthonormal columns, scaled by sqrt(2)
    np.testing.assert_allclose(w.T @ w, 2.0 * np.eye(4), atol=1e-4)
    assert not np.any(ortho.pi[0].bias.asnumpy())

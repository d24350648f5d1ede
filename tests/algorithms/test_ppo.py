"""PPO: the clipped surrogate against numpy, and CartPole solved from a fixed seed."""

import dataclasses

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from rlstack.algorithms.ppo import PPO, Columns, PPOLoss, PPOStep, ValueLoss, surrogate_inputs
from rlstack.bench.seeds import LEARNING_RUNS
from rlstack.config import load_config
from rlstack.encoders import ENCODERS, obs_dim_of
from rlstack.network import NetSpec, Network, PolicyKind
from rlstack.trainer import Trainer


def test_clipped_surrogate_matches_numpy():
    cfg = load_config(None, ["train.clip_range_vf=0.1", "train.ent_coef=0.01"])
    env = gym.make("CartPole-v1")
    algo = PPO(cfg, env.observation_space, env.action_space)
    loss_cell = PPOLoss(algo.network, cfg.train)
    rng = np.random.default_rng(0)
    b = 64
    obs = rng.standard_normal((b, 4)).astype(np.float32)
    action = rng.integers(0, 2, b).astype(np.int32)
    old_logp = np.log(rng.uniform(0.2, 0.8, b)).astype(np.float32)
    adv = rng.standard_normal(b).astype(np.float32)
    ret = rng.standard_normal(b).astype(np.float32)
    old_value = rng.standard_normal(b).astype(np.float32)
    clip = 0.2
    terms = surrogate_inputs(adv, np.ones(b, np.float32), clip, normalize=True)
    loss, info = loss_cell(*(Tensor(x) for x in (obs, action, old_logp, *terms)), Tensor(clip, ms.float32),
                           Tensor(ret), Tensor(old_value))
    logp, entropy, value = (x.asnumpy().astype(np.float64) for x in ms.jit(algo.network.evaluate)(Tensor(obs), Tensor(action)))
    a = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    ratio = np.exp(logp - old_logp)
    policy_loss = -np.minimum(a * ratio, a * np.clip(ratio, 1 - clip, 1 + clip)).mean()
    value_clipped = old_value + np.clip(value - old_value, -0.1, 0.1)
    value_loss = ((ret - value_clipped) ** 2).mean()
    expected = policy_loss + 0.5 * value_loss - 0.01 * entropy.mean()
    np.testing.assert_allclose(float(loss.asnumpy()), expected, rtol=1e-5)
    info = info.asnumpy()
    np.testing.assert_allclose(info[:3], [policy_loss, value_loss, entropy.mean()], rtol=1e-5)
    np.testing.assert_allclose(info[3], ((ratio - 1) - np.log(ratio)).mean(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(info[4], (np.abs(ratio - 1) > clip).mean(), atol=1e-6)


def test_linear_schedules_reach_the_optimizer(tmp_path):
    cfg = load_config(None, ["train.total_steps=512", "train.progress=off", "env.eval_episodes=1"])
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.train()
    # Two updates at progress_remaining 1.0 and 0.5: the last lr set is 1e-3 * 0.5.
    assert float(trainer.algo.optimizer.learning_rate.asnumpy()) == pytest.approx(5e-4)


@pytest.mark.learning
def test_ppo_solves_cartpole_within_6e4_steps(tmp_path):
    # The Zoo config at 6e4 of its 1e5 steps; seeds 0-4 reach 500 there
    # (docs/PERFORMANCE.md#learning-tests-budgets).
    summary = LEARNING_RUNS["ppo"].train(0, tmp_path / "run")  # also `python -m rlstack.bench seeds`
    assert summary["total_steps"] <= 60_000 + 256
    assert summary["eval/mean_return"] >= 475, summary["eval/returns"]


@pytest.mark.learning
def test_ppo_learns_minatar_breakout_from_frames_within_1e5_steps(tmp_path):
    # configs/ppo_minatar.yaml at a tenth of its budget: frames stored as uint8, the MinAtar conv
    # encoder shared by both heads. A random policy scores 0.41 +- 0.65 an episode; seeds 0-4 end at
    # 1.5-2.9 (docs/PERFORMANCE.md#pixels; `python -m rlstack.bench seeds --runs ppo_minatar`).
    summary = LEARNING_RUNS["ppo_minatar"].train(0, tmp_path / "run")
    assert 100_000 <= summary["total_steps"] < 100_000 + 1024
    assert summary["eval/mean_return"] >= 1.2, summary["eval/returns"]


class _DenseEncoder(nn.Cell):
    """An encoder with parameters (a conv encoder's place): one Dense + tanh, shared by both heads."""

    frames, form = False, None

    def __init__(self, obs_space, spec=None):
        super().__init__()
        self.out_dim = 8
        self.dense = nn.Dense(obs_dim_of(obs_space), self.out_dim)

    def construct(self, x):
        return ops.tanh(self.dense(x))


class _First(nn.Cell):
    """A loss Cell's first output (the loss) alone, to differentiate."""

    def __init__(self, loss: nn.Cell):
        super().__init__()
        self.loss = loss

    def construct(self, *args):
        return self.loss(*args)[0]


@pytest.mark.parametrize("encoder", ["dense_test", "minatar_cnn"])
def test_a_shared_encoder_is_trained_by_the_policy_and_the_value_loss(monkeypatch, encoder):
    """An encoder both heads read must get the gradient of the whole loss, value term included, as
    SB3's CnnPolicy trains its shared features extractor: PPO's step is then one graph (the
    encoder's passes once), not the MLP's two. With SGD at lr 1 and no clipping the step moves
    every parameter by exactly minus its gradient. A test-only dense encoder on CartPole, and the
    MinAtar conv encoder on MinAtar-shaped frames."""
    monkeypatch.setitem(ENCODERS, "dense_test", _DenseEncoder)
    cfg = load_config(None, ["train.ent_coef=0.01", "train.max_grad_norm=1e9", "net.hidden=[16]"])
    frames = encoder != "dense_test"
    obs_space = gym.spaces.Box(0, 1, (10, 10, 4), bool) if frames else gym.make("CartPole-v1").observation_space
    spec = dataclasses.replace(NetSpec.of(cfg.net, policy=PolicyKind.CATEGORICAL), encoder=encoder)
    network = Network(obs_space, gym.spaces.Discrete(2), spec)
    shared = network.encoder_params()
    expected = (["encoder.stack.convs.0.weight", "encoder.stack.convs.0.bias", "encoder.stack.dense.weight",
                 "encoder.stack.dense.bias"] if frames else ["encoder.dense.weight", "encoder.dense.bias"])
    assert [p.name for p in shared] == expected
    policy, value = shared + network.pi.trainable_params(), network.vf.trainable_params()
    optimizer = nn.SGD(policy + value, learning_rate=1.0)
    columns = Columns(0, 1)  # one graph: the obs go to it apart
    step = PPOStep(network, optimizer, cfg.train, policy, value, columns, shared_params=tuple(shared))
    assert step.whole and step.policy_grad is None
    step.set_schedule(1.0, 0.3)  # the clip range reaches the one graph
    assert float(step.value_step.cell.clip_range.asnumpy()) == pytest.approx(0.3)
    step.set_schedule(1.0, 0.2)

    rng = np.random.default_rng(0)
    b = 64
    obs = (rng.integers(0, 2, (b, 10, 10, 4)) if frames else rng.standard_normal((b, 4))).astype(np.float32)
    action = rng.integers(0, 2, b).astype(np.int32)
    old_logp = np.log(rng.uniform(0.2, 0.8, b)).astype(np.float32)
    ret, old_value = rng.standard_normal(b).astype(np.float32), rng.standard_normal(b).astype(np.float32)
    terms = surrogate_inputs(rng.standard_normal(b).astype(np.float32), np.ones(b, np.float32), 0.2, normalize=True)
    whole = ms.grad(_First(PPOLoss(network, cfg.train)), None, ms.ParameterTuple(policy + value))(
        *(Tensor(x) for x in (obs, action, old_logp, *terms)), Tensor(0.2, ms.float32), Tensor(ret), Tensor(old_value))
    value_only = ms.grad(_First(ValueLoss(network, cfg.train)), None, ms.ParameterTuple(shared))(
        Tensor(obs), Tensor(ret), Tensor(old_value))
    assert all(np.abs(g.asnumpy()).max() > 1e-4 for g in value_only)  # the value term reaches the encoder

    before = [p.asnumpy().copy() for p in policy + value]
    step.step(Tensor(Columns.pack(np.zeros((b, 0), np.float32), action, old_logp, *terms, ret, old_value)),
              Tensor(obs.astype(np.uint8) if frames else obs))
    for p, start, grad in zip(policy + value, before, whole, strict=True):
        np.testing.assert_allclose(start - p.asnumpy(), grad.asnumpy(), rtol=1e-4, atol=1e-6, err_msg=p.name)

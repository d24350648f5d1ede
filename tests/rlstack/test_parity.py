"""Parity: `parity: strict` is bit-for-bit batch-invariant, and the trainer measures and logs parity."""

import json

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from rlstack.acting import Acting, load_policy
from rlstack.artifact import export_policy
from rlstack.config import load_config
from rlstack.network import BLOCK_ROWS, NetSpec, Network, PolicyKind, QKind, sample_noise
from rlstack.parity import RecentObs, measure_parity, parity_rows
from rlstack.trainer import Trainer

OBS = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)
BOX = gym.spaces.Box(-1, 1, (2,), np.float32)
HEADS = {
    "ppo_categorical": (gym.spaces.Discrete(3), {"policy": PolicyKind.CATEGORICAL}),
    "ppo_gaussian": (BOX, {"policy": PolicyKind.GAUSSIAN}),
    "sac": (BOX, {"policy": PolicyKind.SQUASHED_GAUSSIAN, "value": False, "q": QKind.CONTINUOUS}),
    "dqn_dueling": (gym.spaces.Discrete(3), {"policy": PolicyKind.NONE, "value": False, "q": QKind.DISCRETE,
                                             "dueling": True}),
}


def _net(head: str, strict: bool) -> Network:
    space, kw = HEADS[head]
    ms.set_seed(0)
    net = Network(OBS, space, NetSpec(batch_invariant=strict, **kw))
    net.set_epsilon(0.3)
    return net


def _rows_at(fn, obs, noise, batch):
    parts = [fn(obs[i:i + batch], noise[i:i + batch]) for i in range(0, len(obs), batch)]
    return [np.concatenate([np.asarray(p[k]) for p in parts]) for k in range(3)]


@pytest.mark.parametrize("head", sorted(HEADS))
def test_strict_mode_is_bitwise_equal_across_batch_sizes(tmp_path, head):
    net = _net(head, strict=True)
    space = HEADS[head][0]
    version = export_policy(net, tmp_path, algorithm=head, obs_space=OBS, action_space=space, device="cpu",
                            fusion=False, config_hash="t")
    policy = load_policy(version)
    assert policy.manifest["batch_rows"] == BLOCK_ROWS
    live = Acting.of_network(net, OBS, space)  # called on whole BLOCK_ROWS-row blocks, as a strict graph must be
    assert live.batch_rows == BLOCK_ROWS
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((448, 6)).astype(np.float32)  # 448 = 7 * 64 rows
    noise = sample_noise(net.noise_kind, net.noise_dim, len(obs), rng)
    reference = _rows_at(live, obs, noise, len(obs))  # one call on every row
    for fn, where in ((live, "live module"), (policy.run, "exported graph (rlstack.load_policy)")):
        for batch in (1, 7, 64, 256):
            rows = (len(obs) // batch) * batch if batch != 1 else 21  # batch 1: 21 single-row calls
            got = _rows_at(fn, obs[:rows], noise[:rows], batch)
            for name, a, b in zip(("action", "logp", "value"), got, reference, strict=True):
                assert np.array_equal(a, b[:rows]), f"{head}: {where} {name} at batch {batch} differs"
    # Plain MindSpore on the same file, called on whole blocks, computes the same rows.
    graph = nn.GraphCell(ms.load(str(version / "policy.mindir")))
    plain = graph(Tensor(obs[:64]), Tensor(noise[:64]))
    assert all(np.array_equal(a.asnumpy(), b[:64]) for a, b in zip(plain, reference, strict=True))


FRAMES = {"minatar_cnn": gym.spaces.Box(0, 1, (10, 10, 4), bool),  # planes, channels last
          "nature_cnn": gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)}  # Atari's stacked frames


@pytest.mark.parametrize("encoder", sorted(FRAMES))
def test_strict_conv_encoders_are_bitwise_equal_across_batch_sizes(tmp_path, encoder):
    """The conv encoders' rows, live and exported, at every batch size: the same bits."""
    space, actions = FRAMES[encoder], gym.spaces.Discrete(3)
    ms.set_seed(0)
    net = Network(space, actions, NetSpec(hidden=(), encoder=encoder, batch_invariant=True,
                                          policy=PolicyKind.CATEGORICAL))
    assert net.encoder.form == "matmul"
    version = export_policy(net, tmp_path, algorithm="ppo", obs_space=space, action_space=actions, device="cpu",
                            fusion=False, config_hash="t")
    policy, live = load_policy(version), Acting.of_network(net, space, actions)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 2 if space.dtype == bool else 256, (96, *space.shape)).astype(np.uint8)
    noise = sample_noise(net.noise_kind, net.noise_dim, len(obs), rng)
    reference = _rows_at(live, obs, noise, len(obs))
    for fn, where in ((live, "live module"), (policy.run, "exported graph")):
        for batch in (1, 5, 32):
            rows = (len(obs) // batch) * batch if batch != 1 else 6
            got = _rows_at(fn, obs[:rows], noise[:rows], batch)
            for name, a, b in zip(("action", "logp", "value"), got, reference, strict=True):
                assert np.array_equal(a, b[:rows]), f"{encoder}: {where} {name} at batch {batch} differs"
    with pytest.raises(ValueError, match="conv_form: matmul"):
        Network(space, actions, NetSpec(hidden=(), encoder=encoder, conv_form="native", batch_invariant=True,
                                        policy=PolicyKind.CATEGORICAL))


def test_strict_and_fast_networks_have_the_same_parameters():
    fast, strict = _net("sac", strict=False), _net("sac", strict=True)
    assert [(p.name, p.shape) for p in fast.get_parameters()] == [(p.name, p.shape) for p in strict.get_parameters()]


@pytest.mark.parametrize("strict", [False, True])
def test_measure_parity_against_the_exported_graph(tmp_path, strict):
    net = _net("ppo_categorical", strict)
    version = export_policy(net, tmp_path, algorithm="ppo", obs_space=OBS, action_space=gym.spaces.Discrete(3),
                            device="cpu", fusion=False, config_hash="t")
    policy = load_policy(version)
    recent = RecentObs(300)
    rng = np.random.default_rng(3)
    recent.add(rng.standard_normal((350, 6)).astype(np.float32))
    assert len(recent.get()) == 300
    rows = parity_rows(8, 64)
    obs = recent.get()[-rows:]
    live = Acting.of_network(net, OBS, gym.spaces.Discrete(3))
    report = measure_parity(policy, live, obs, policy.noise(rows, rng), rollout_batch=8, minibatch=64)
    assert report.export_bitwise, report  # the MindIR computes what the module computes, same batch
    assert report.max_abs_logp < 1e-5 and report.max_abs_value < 1e-5
    if strict:
        assert report.bitwise and report.max_abs_logp == 0.0 and report.max_abs_action == 0.0, report
    assert set(report.metrics()) >= {"parity/max_abs_logp", "parity/max_abs_action", "parity/bitwise"}


@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_ppo_logs_parity_and_strict_gives_ratio_exactly_one(tmp_path, mode):
    cfg = load_config(None, [f"parity={mode}", "train.total_steps=768", "train.n_epochs=1",
                             "train.export_every=1", "train.progress=off", "env.eval_episodes=1"])
    summary = Trainer(cfg, tmp_path / "run").train()
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["parity/version"] == "v000004"  # three exports during training, one at the end
    assert saved["parity/export_bitwise"] == 1.0
    ratio_dev = summary["parity/ppo_ratio_dev_max"]  # max over updates of max |ratio - 1|, first minibatch
    if mode == "strict":
        assert ratio_dev == 0.0
        assert saved["parity/max_abs_logp"] == 0.0 and saved["parity/bitwise"] == 1.0
    else:
        assert 0.0 <= ratio_dev < 1e-5 and saved["parity/max_abs_logp"] < 1e-5
    events = list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    assert events and b"parity/max_abs_logp" in events[0].read_bytes()


class _EvaluateLoss(nn.Cell):
    def __init__(self, net: Network):
        super().__init__()
        self.net = net

    def construct(self, obs, action):
        logp, entropy, value = self.net.evaluate(obs, action)
        return (logp * value).mean() + entropy.mean()


def test_strict_network_trains_with_the_same_gradients_as_the_fast_one():
    """The row-wise product's backward is the ordinary matrix product: same gradients, to rounding."""
    rng = np.random.default_rng(1)
    obs = Tensor(rng.standard_normal((64, 6)).astype(np.float32))
    action = Tensor(rng.integers(0, 3, 64).astype(np.int32))
    grads = []
    for strict in (False, True):
        loss = _EvaluateLoss(_net("ppo_categorical", strict))
        grads.append(ms.grad(loss, None, loss.trainable_params())(obs, action))
    assert len(grads[0]) == len(grads[1]) > 0
    for fast, strict in zip(*grads, strict=True):
        np.testing.assert_allclose(strict.asnumpy(), fast.asnumpy(), rtol=1e-4, atol=1e-6)

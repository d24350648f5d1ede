"""The actor stage: the exported graph acts, follows the learner's weights and LATEST, in-process
and in actor processes; DQN collects and updates with `actors: 2` (PPO's learning runs with both
actor backends are in test_actor_backends.py)."""

import os
import signal
import time
from pathlib import Path

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from rlstack.acting import load_policy, weights_of
from rlstack.artifact import export_policy
from rlstack.collector import ActorSpec, Trajectory, trajectory_specs
from rlstack.config import load_config
from rlstack.network import NetSpec, Network, PolicyKind, QKind
from rlstack.serving.actor import ActorError, ActorPool

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ENV = gym.make("CartPole-v1")
OBS, ACT = ENV.observation_space, ENV.action_space


def _export(net: Network, policy_dir: Path, updates: int) -> Path:
    return export_policy(net, policy_dir, algorithm="ppo", obs_space=OBS, action_space=ACT, device="cpu",
                         fusion=False, config_hash="t", extra={"updates": updates})


def _perturb(net: Network, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for p in net.trainable_params():
        p.set_data(Tensor(p.asnumpy() + 0.5 * rng.standard_normal(p.shape).astype(np.float32)))


def test_graph_acting_runs_the_export_and_follows_the_learner(tmp_path):
    ms.set_seed(0)
    net = Network(OBS, ACT, NetSpec())
    acting = load_policy(_export(net, tmp_path, 0))
    state = {"updates": 0}
    acting.follow(net, lambda: (state["updates"],))
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((8, 4)).astype(np.float32)
    noise = acting.noise(8, rng)

    def same_as_live() -> bool:
        live = net(Tensor(obs), Tensor(noise))
        return all(np.array_equal(a, b.asnumpy()) for a, b in zip(acting(obs, noise), live, strict=True))

    assert same_as_live() and acting.updates == 0
    _perturb(net, 1)
    assert not same_as_live()  # the learner changed, but no update was counted: still the old weights
    state["updates"] = 1
    assert same_as_live() and acting.updates == 1 and acting.refreshes == 2


def test_graph_acting_refreshes_only_epsilon_between_updates(tmp_path):
    ms.set_seed(0)
    net = Network(OBS, ACT, NetSpec(policy=PolicyKind.NONE, value=False, q=QKind.DISCRETE))
    acting = load_policy(_export(net, tmp_path, 0))
    state = {"epsilon": 0.0}
    acting.follow(net, lambda: (0, state["epsilon"]))
    obs = np.zeros((4, 4), np.float32)
    greedy = acting(obs, np.zeros((4, 3), np.float32))[0]
    other = 1 - greedy
    # Column 0 explores iff epsilon > 0.01; the random action is argmax of the other columns.
    noise = np.stack([np.full(4, 0.99), 5.0 * (other == 0), 5.0 * (other == 1)], 1).astype(np.float32)
    assert np.array_equal(acting(obs, noise)[0], greedy)
    net.set_epsilon(1.0)
    state["epsilon"] = 1.0
    assert np.array_equal(acting(obs, noise)[0], other)
    assert acting.refreshes == 1  # epsilon came over without a full weight refresh


def _first_with(pool: ActorPool, version: int, tries: int = 200) -> Trajectory:
    for _ in range(tries):
        traj = pool.get(timeout=300)
        if traj.version[0] == version:
            return traj
    raise AssertionError(f"no chunk collected with version {version} in {tries} chunks")


def _check_logp(net: Network, traj: Trajectory) -> None:
    """The recorded logp is the one of the weights `net` holds now (a numpy forward pass)."""
    w = {p.name: p.asnumpy().astype(np.float64) for p in net.get_parameters()}
    h = traj.obs.reshape(-1, 4).astype(np.float64)
    for layer in ("pi.0", "pi.2"):
        h = np.tanh(h @ w[f"{layer}.weight"].T + w[f"{layer}.bias"])
    logits = h @ w["pi.4.weight"].T + w["pi.4.bias"]
    logp_all = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    logp = np.take_along_axis(logp_all, traj.action.reshape(-1, 1).astype(np.int64), 1)[:, 0]
    # float32 graph vs float64 numpy: ~1e-5 apart for large logits; other weights differ by >1e-2.
    np.testing.assert_allclose(traj.logp.reshape(-1), logp, rtol=1e-3, atol=1e-4)


def test_an_actor_process_picks_up_published_versions_and_weights(tmp_path):
    ms.set_seed(0)
    net = Network(OBS, ACT, NetSpec())
    bootstrap = _export(net, tmp_path / "bootstrap", 0)
    policy_dir = tmp_path / "run" / "policy"
    layout = load_policy(bootstrap).layout
    spec = ActorSpec(env_id="CartPole-v1", n_envs=2, steps=8, policy_dir=str(policy_dir), bootstrap=str(bootstrap),
                     seed=3, poll_seconds=0.05)
    with ActorPool(spec, 1, layout, trajectory_specs(spec.steps, spec.n_envs, (4,), (), "int32", False)) as pool:
        pool.publish(weights_of(net, layout), 0)
        pool.start()
        traj = pool.get(timeout=300)
        assert traj.obs.shape == (8, 2, 4) and traj.action.dtype == np.int32 and traj.next_obs is None
        assert np.all(traj.version == 0)
        _check_logp(net, traj)

        _perturb(net, 1)
        _export(net, policy_dir, 5)  # a new version on disk: the actor follows LATEST
        _check_logp(net, _first_with(pool, 5))

        _perturb(net, 2)
        pool.publish(weights_of(net, layout), 9)  # fresh weights through shared memory
        _check_logp(net, _first_with(pool, 9))
    assert pool.processes[0].exitcode == 0  # stopped by close() after its chunk, not killed


def test_a_signalled_actor_keeps_collecting_for_the_learner_then_exits_0(tmp_path, capfd):
    """Ctrl-C / a group SIGTERM reach the learner too, which may need more chunks to finish its
    update: the actor keeps collecting for the grace time, then stops cleanly and says why."""
    ms.set_seed(0)
    net = Network(OBS, ACT, NetSpec())
    bootstrap = _export(net, tmp_path / "bootstrap", 0)
    layout = load_policy(bootstrap).layout
    spec = ActorSpec(env_id="CartPole-v1", n_envs=2, steps=8, policy_dir=str(tmp_path / "none"),
                     bootstrap=str(bootstrap), seed=0)
    with ActorPool(spec, 1, layout, trajectory_specs(spec.steps, spec.n_envs, (4,), (), "int32", False),
                   signal_grace_s=3.0) as pool:
        pool.publish(weights_of(net, layout), 0)
        pool.start()
        pool.get(timeout=300)  # running: MindSpore has installed its SIGINT handler by now
        actor = pool.processes[0]
        signalled = time.monotonic()
        os.kill(actor.pid, signal.SIGINT)
        time.sleep(0.2)
        os.kill(actor.pid, signal.SIGTERM)
        chunks = 0
        with pytest.raises(ActorError, match=r"actor 0 stopped after SIG(INT|TERM): the learner did not stop"):
            while True:
                pool.get(timeout=60)
                chunks += 1
        assert chunks > 0 and time.monotonic() - signalled >= 3.0
        actor.join(30)
        assert actor.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err


def test_a_failing_actor_is_reported_with_its_traceback(tmp_path):
    ms.set_seed(0)
    net = Network(OBS, ACT, NetSpec())
    bootstrap = _export(net, tmp_path / "bootstrap", 0)
    layout = load_policy(bootstrap).layout
    spec = ActorSpec(env_id="CartPole-v1", n_envs=1, steps=4, policy_dir=str(tmp_path / "none"),
                     bootstrap=str(tmp_path / "missing"), seed=0)
    with ActorPool(spec, 1, layout, trajectory_specs(spec.steps, spec.n_envs, (4,), (), "int32", False)) as pool:
        pool.publish(weights_of(net, layout), 0)
        pool.start()
        with pytest.raises(ActorError, match="actor 0 failed:(.|\n)*ArtifactError(.|\n)*missing"):
            pool.get(timeout=300)


def test_dqn_collects_and_updates_through_two_actor_processes(tmp_path):
    """DQN's off-policy path through actors (uniform warm-up, real next observations, gradient
    steps once learning starts) on a short run. DQN learning to 475 with two actor processes
    takes ~2 minutes: `python -m rlstack.bench seeds --runs dqn_actors`."""
    from rlstack.trainer import Trainer

    cfg = load_config("dqn_cartpole", ["actors=2", "train.total_steps=4000", "train.learning_starts=1000",
                                       "train.progress=off", "env.eval_episodes=2"])
    summary = Trainer(cfg, tmp_path / "run").train()
    assert 4000 <= summary["total_steps"] <= 4000 + 2 * cfg.env.n_envs * cfg.train.train_freq
    assert summary["updates"] >= (4000 - 1000) // (cfg.env.n_envs * cfg.train.train_freq) - 2
    assert summary["episodes"] > 0


def test_truncated_importance_weights_correct_stale_samples():
    from rlstack.algorithms.ppo import PPO, LearnerLogp, PPOLoss, surrogate_inputs
    from rlstack.buffers import RolloutBatch

    cfg = load_config(None, ["train.is_clip=1.5", "train.n_steps=8", "train.batch_size=32", "train.n_epochs=1"])
    algo = PPO(cfg, OBS, ACT)
    rng = np.random.default_rng(0)
    rows = 64
    obs = rng.standard_normal((rows, 4)).astype(np.float32)
    action = rng.integers(0, 2, rows).astype(np.int32)
    learner = LearnerLogp(algo.network)(Tensor(obs), Tensor(action)).asnumpy()
    behaviour = (learner + rng.normal(0, 0.5, rows)).astype(np.float32)  # an older policy's logp
    adv, ret, value = (rng.standard_normal(rows).astype(np.float32) for _ in range(3))
    metrics = algo.learn_batch(RolloutBatch(obs, action, behaviour, value, adv, ret), 1.0, rng)
    rho = np.exp(learner.astype(np.float64) - behaviour)
    assert metrics["train/is_weight_mean"] == pytest.approx(np.minimum(rho, 1.5).mean(), rel=1e-5)
    assert metrics["train/is_truncated_fraction"] == pytest.approx((rho > 1.5).mean())
    # The weight multiplies the clipped surrogate sample by sample.
    loss_cell = PPOLoss(algo.network, cfg.train)
    weight = np.minimum(rho, 1.5).astype(np.float32)
    clip = Tensor(0.2, ms.float32)

    def loss(is_weight):
        terms = surrogate_inputs(adv, is_weight, 0.2, normalize=True)
        return loss_cell(*(Tensor(x) for x in (obs, action, learner, *terms)), clip, Tensor(ret), Tensor(value))[1]

    plain, weighted = loss(np.ones(rows, np.float32)), loss(weight)
    a = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    ratio = np.exp(LearnerLogp(algo.network)(Tensor(obs), Tensor(action)).asnumpy().astype(np.float64) - learner)
    surrogate = np.minimum(a * ratio, a * np.clip(ratio, 0.8, 1.2))
    np.testing.assert_allclose(plain.asnumpy()[0], -surrogate.mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(weighted.asnumpy()[0], -(surrogate * weight).mean(), rtol=1e-4, atol=1e-6)

"""DQN: the Double-DQN target by hand, the update against numpy, target-network updates,
epsilon-greedy inside the acting graph of the shared `Network`, and CartPole from a fixed seed."""

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from rlstack.algorithms.dqn import DQN, linear_epsilon, target_update_count, td_target
from rlstack.algorithms.ppo import PPO
from rlstack.bench.seeds import LEARNING_RUNS
from rlstack.config import load_config
from rlstack.network import Network, NoiseKind
from rlstack.registry import Progress
from rlstack.replay import ReplayBuffer
from rlstack.trainer import Trainer

CONFIG = "configs/dqn_cartpole.yaml"


def _dqn(*overrides: str) -> DQN:
    cfg = load_config(CONFIG, ["net.hidden=[32, 32]", *overrides])
    env = gym.make("CartPole-v1")
    return DQN(cfg, env.observation_space, env.action_space)


def _params(cell) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in cell.trainable_params()}


def _np_q(params: dict[str, np.ndarray], prefix: str, obs: np.ndarray) -> np.ndarray:
    """The [32, 32] ReLU Q-MLP in float64 numpy."""
    w = [params[f"{prefix}qf.{i}.weight"].astype(np.float64) for i in (0, 2, 4)]
    b = [params[f"{prefix}qf.{i}.bias"].astype(np.float64) for i in (0, 2, 4)]
    h = np.maximum(obs @ w[0].T + b[0], 0)
    h = np.maximum(h @ w[1].T + b[1], 0)
    return h @ w[2].T + b[2]


def test_double_dqn_target_on_a_hand_made_batch():
    q_next_online = Tensor(np.array([[1.0, 2.0], [3.0, 0.0], [5.0, 4.0]], np.float32))
    q_next_target = Tensor(np.array([[10.0, 20.0], [30.0, 40.0], [7.0, 9.0]], np.float32))
    reward = Tensor(np.array([1.0, 1.0, -1.0], np.float32))
    terminated = Tensor(np.array([0.0, 0.0, 1.0], np.float32))
    y = td_target(q_next_online, q_next_target, reward, terminated, 0.9, True).asnumpy()
    # online argmax: actions 1, 0, 0 -> target values 20, 30, (terminal: none)
    np.testing.assert_allclose(y, [1 + 0.9 * 20, 1 + 0.9 * 30, -1.0], rtol=1e-6)
    plain = td_target(q_next_online, q_next_target, reward, terminated, 0.9, False).asnumpy()
    np.testing.assert_allclose(plain, [1 + 0.9 * 20, 1 + 0.9 * 40, -1.0], rtol=1e-6)


def test_update_minimises_huber_td_error_against_numpy():
    algo = _dqn("train.gradient_steps=1", "train.target_update_interval=1000000")
    # Make the target network differ from the online one, so the two roles are tested.
    for p in algo.target.trainable_params():
        p.set_data(Tensor(p.asnumpy() * 1.5))
    online, target = _params(algo.network), _params(algo.target)
    on_prefix = next(k for k in online if k.endswith("qf.0.weight"))[: -len("qf.0.weight")]
    tg_prefix = next(k for k in target if k.endswith("qf.0.weight"))[: -len("qf.0.weight")]
    rng = np.random.default_rng(3)
    replay = ReplayBuffer.for_spaces(64, gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2))
    obs, next_obs = rng.standard_normal((64, 4)), rng.standard_normal((64, 4))
    terminated = rng.random(64) < 0.3
    replay.add(obs, rng.integers(0, 2, 64), rng.standard_normal(64) * 3, next_obs, terminated, rng.random(64) < 0.3)
    # learn() samples its minibatch from this generator: replay it to know the rows.
    rows = replay.sample_index((1, 64), np.random.default_rng(11))[0]
    metrics = algo.learn(replay, Progress(10, 1.0), np.random.default_rng(11))
    b = replay.gather(rows)
    q_online_next = _np_q(online, on_prefix, b.next_obs)
    q_target_next = _np_q(target, tg_prefix, b.next_obs)
    best = q_online_next.argmax(1)
    y = b.reward + 0.99 * (1 - b.terminated) * q_target_next[np.arange(64), best]
    q = _np_q(online, on_prefix, b.obs)[np.arange(64), b.action]
    err = np.abs(q - y)
    huber = np.where(err < 1, 0.5 * err**2, err - 0.5).mean()
    assert metrics["train/td_loss"] == pytest.approx(huber, rel=1e-4)
    assert metrics["train/q_mean"] == pytest.approx(q.mean(), rel=1e-4, abs=1e-5)
    assert metrics["train/target_mean"] == pytest.approx(y.mean(), rel=1e-4, abs=1e-5)
    # and the step moved the online network, not the target
    assert any(not np.array_equal(online[k], v) for k, v in _params(algo.network).items())
    for k, v in _params(algo.target).items():
        np.testing.assert_array_equal(v, target[k])


def _replay_with_data() -> ReplayBuffer:
    rng = np.random.default_rng(0)
    replay = ReplayBuffer.for_spaces(256, gym.spaces.Box(-5, 5, (4,)), gym.spaces.Discrete(2))
    replay.add(rng.standard_normal((256, 4)), rng.integers(0, 2, 256), rng.standard_normal(256),
               rng.standard_normal((256, 4)), rng.random(256) < 0.1, np.zeros(256, bool))
    return replay


def test_hard_target_update_every_interval_of_env_steps():
    algo = _dqn("train.gradient_steps=4", "train.target_update_interval=10", "train.tau=1.0")
    replay, rng = _replay_with_data(), np.random.default_rng(1)
    algo.learn(replay, Progress(8, 1.0), rng)  # no multiple of 10 crossed: target untouched
    before = _params(algo.network)
    first_target, first_online = (next(iter(_params(c).values())) for c in (algo.target, algo.network))
    assert not np.array_equal(first_target, first_online)  # the online net moved, the target did not
    algo.learn(replay, Progress(12, 1.0), rng)  # crossed 10: hard copy of the online net, then 4 steps
    for (_, t), (_, o) in zip(_params(algo.target).items(), before.items(), strict=True):
        np.testing.assert_array_equal(t, o)
    synced = _params(algo.target)
    algo.learn(replay, Progress(19, 1.0), rng)  # next multiple (20) not reached
    for k, v in _params(algo.target).items():
        np.testing.assert_array_equal(v, synced[k])
    assert int(algo.step.target_synced_at.asnumpy()) == 12


def test_polyak_target_update_compounds_the_updates_due():
    algo = _dqn("train.gradient_steps=2", "train.target_update_interval=10", "train.tau=0.25")
    replay, rng = _replay_with_data(), np.random.default_rng(1)
    target_before, online_before = _params(algo.target), _params(algo.network)
    algo.learn(replay, Progress(30, 1.0), rng)  # three updates due towards an unchanged online net
    mix = 1 - 0.75**3
    for (k, t), o in zip(_params(algo.target).items(), online_before.values(), strict=True):
        np.testing.assert_allclose(t, target_before[k] * (1 - mix) + o * mix, rtol=1e-6, atol=1e-7)


def test_epsilon_greedy_inside_the_acting_graph():
    algo = _dqn()
    net = algo.network
    assert type(net) is Network and net.noise_kind == NoiseKind.EPSILON_GREEDY and net.noise_dim == 3
    obs = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    q = ms.jit(net.q_values)(Tensor(obs)).asnumpy()
    greedy = q.argmax(1)
    noise = np.zeros((6, 3), np.float32)
    noise[:, 0] = [0.0, 0.5, 0.95, 0.97, 0.99, 0.999]  # explore when > 1 - epsilon
    noise[np.arange(6), 1 + (1 - greedy)] = 5.0  # the random (Gumbel) choice is the non-greedy action
    eps = 0.04
    net.set_epsilon(eps)
    action, logp, value = (x.asnumpy() for x in net(Tensor(obs), Tensor(noise)))
    explore = noise[:, 0] > 1 - eps
    np.testing.assert_array_equal(action, np.where(explore, 1 - greedy, greedy))
    np.testing.assert_allclose(logp, np.log(np.where(explore, eps / 2, 1 - eps + eps / 2)), rtol=1e-6)
    np.testing.assert_allclose(value, q.max(1), rtol=1e-6)
    # zero noise is the greedy (deterministic) action whatever epsilon is
    net.set_epsilon(1.0)
    zero_action, _, _ = net(Tensor(obs), Tensor(np.zeros((6, 3), np.float32)))
    np.testing.assert_array_equal(zero_action.asnumpy(), greedy)


def test_linear_epsilon_schedule_and_explore():
    assert linear_epsilon(1.0, 1.0, 0.04, 0.16) == 1.0
    assert linear_epsilon(1.0 - 0.08, 1.0, 0.04, 0.16) == pytest.approx(0.52)
    assert linear_epsilon(0.5, 1.0, 0.04, 0.16) == 0.04
    algo = _dqn()
    algo.explore(1.0 - 0.08)
    assert float(algo.network.epsilon.asnumpy()) == pytest.approx(0.52)


def test_dqn_and_ppo_share_the_network_class():
    env = gym.make("CartPole-v1")
    ppo = PPO(load_config(None, []), env.observation_space, env.action_space)
    dqn = _dqn("train.dueling=true")
    assert type(ppo.network) is type(dqn.network) is type(dqn.target) is Network
    # dueling: Q = V + A - mean(A) from the one qf head [B, 1 + n]
    obs = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    out = dqn.network.qf(Tensor(obs)).asnumpy()
    q = ms.jit(dqn.network.q_values)(Tensor(obs)).asnumpy()
    np.testing.assert_allclose(q, out[:, :1] + out[:, 1:] - out[:, 1:].mean(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_zoo_hyperparameters_in_the_config():
    t = load_config(CONFIG).train
    assert (t.total_steps, t.lr, t.batch_size, t.buffer_size, t.learning_starts, t.gamma) == \
        (50_000, "2.3e-3", 64, 100_000, 1000, 0.99)
    assert (t.target_update_interval, t.train_freq, t.gradient_steps) == (10, 256, 128)
    assert (t.exploration_fraction, t.exploration_final_eps) == (0.16, 0.04)
    assert load_config(CONFIG).net.hidden == [256, 256]


def _tb_tags(run_dir) -> set[str]:
    """Scalar tags in a TensorBoard event file (TFRecord framing, read with tensorboardX's protos)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for path in (run_dir / "tb").glob("events.out.tfevents.*"):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            length = int.from_bytes(data[pos: pos + 8], "little")
            event = event_pb2.Event.FromString(data[pos + 12: pos + 12 + length])
            tags.update(v.tag for v in event.summary.value)
            pos += 12 + length + 4
    return tags


def test_short_run_logs_scalars_and_resumes(tmp_path):
    overrides = ["net.hidden=[32, 32]", "train.total_steps=600", "train.learning_starts=200",
                 "train.train_freq=100", "train.gradient_steps=8", "train.checkpoint_every=2",
                 "train.log_every_steps=100", "train.progress=off", "env.eval_episodes=2"]
    run = tmp_path / "run"
    summary = Trainer(load_config(CONFIG, overrides), run).train()
    assert summary["total_steps"] == 600 and summary["updates"] == 4
    tags = _tb_tags(run)
    for tag in ("train/td_loss", "train/q_mean", "rollout/epsilon", "rollout/ep_return_mean",
                "time/steps_per_second", "eval/mean_return"):
        assert tag in tags, sorted(tags)
    resumed = Trainer.resume(run, ["train.total_steps=800"])
    assert resumed.counters.steps == 600
    with np.load(run / "checkpoints" / "step_0000000600" / "replay.npz") as data:
        saved_obs = data["obs"].copy()
    assert len(saved_obs) == 600
    summary = resumed.train()
    assert summary["total_steps"] == 800 and summary["updates"] == 6
    with np.load(run / "checkpoints" / "step_0000000800" / "replay.npz") as data:
        assert len(data["reward"]) == 800
        np.testing.assert_array_equal(data["obs"][:600], saved_obs)


@pytest.mark.learning
def test_dqn_solves_cartpole_within_4e4_steps(tmp_path):
    # The Zoo config at 4e4 of its 5e4 steps; seeds 0-4 keep a network that scores 500 there
    # (docs/PERFORMANCE.md#learning-tests-budgets).
    summary = LEARNING_RUNS["dqn"].train(0, tmp_path / "run")  # also `python -m rlstack.bench seeds`
    assert summary["total_steps"] == 40_000
    assert summary["final_policy"] == "best"  # configs/dqn_cartpole.yaml: train.keep_best
    assert summary["eval/mean_return"] >= 475, summary["eval/returns"]


def test_target_update_count_counts_crossed_multiples():
    assert target_update_count(0, 9, 10) == 0
    assert target_update_count(9, 10, 10) == 1
    assert target_update_count(10, 19, 10) == 0
    assert target_update_count(5, 256, 10) == 25


@pytest.mark.parametrize("double_q", [False, True])
def test_frames_apart_train_as_the_packed_columns(monkeypatch, double_q):
    """Large frames reach the step graph apart as uint8 (`FRAMES_APART`), small ones packed as
    float32 columns: the same minibatches give bitwise the same step either way."""
    from rlstack.algorithms import dqn as dqn_module

    space = gym.spaces.Box(0, 1, (10, 10, 4), bool)
    rng = np.random.default_rng(0)
    replay = ReplayBuffer.for_spaces(128, space, gym.spaces.Discrete(3))
    replay.add(rng.random((128, 10, 10, 4)) < 0.2, rng.integers(0, 3, 128), rng.standard_normal(128),
               rng.random((128, 10, 10, 4)) < 0.2, rng.random(128) < 0.1, np.zeros(128, bool))
    weights = []
    for apart in (False, True):
        monkeypatch.setattr(dqn_module, "FRAMES_APART", 0 if apart else 10**9)
        ms.set_seed(0)
        cfg = load_config("dqn_minatar", ["train.gradient_steps=2", f"train.double_q={str(double_q).lower()}"])
        algo = DQN(cfg, space, gym.spaces.Discrete(3))
        assert algo.step.frames == apart
        metrics = algo.learn(replay, Progress(10, 1.0), np.random.default_rng(1))
        weights.append((metrics["train/td_loss"], _params(algo.network)))
    assert weights[0][0] == weights[1][0]
    for name, value in weights[0][1].items():
        np.testing.assert_array_equal(value, weights[1][1][name], err_msg=name)

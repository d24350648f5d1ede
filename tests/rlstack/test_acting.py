"""The acting module: one class acts for every caller, live network or exported graph."""

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from rlstack.acting import Acting, load_policy
from rlstack.artifact import ArtifactError, export_policy, interface
from rlstack.envs.games import TICTACTOE, Boards
from rlstack.network import BLOCK_ROWS, NetSpec, Network, PolicyKind


def _tictactoe_policy(tmp_path, normalize_obs=False):
    ms.set_seed(0)
    space = TICTACTOE.flat_space()
    net = Network(space, gym.spaces.Discrete(9), NetSpec(hidden=(16,), normalize_obs=normalize_obs))
    version = export_policy(net, tmp_path / "policy", algorithm="ppo", obs_space=space.dict_space,
                            action_space=gym.spaces.Discrete(9), device="cpu", fusion=False, config_hash="t")
    return net, load_policy(version)


def test_act_takes_pettingzoo_dicts_single_batched_and_listed(tmp_path):
    _, policy = _tictactoe_policy(tmp_path)
    boards = Boards(TICTACTOE, 5)
    boards.play(np.array([0, 4, 8, 2, 6]))  # five positions, one move each
    flat = boards.flat_obs()
    space = TICTACTOE.flat_space()
    dicts = [space.unflatten(row) for row in flat]
    expected = policy.act(flat, deterministic=True).action
    assert np.array_equal(policy.act(dicts, deterministic=True).action, expected)
    batched = {"observation": np.stack([d["observation"] for d in dicts]),
               "action_mask": np.stack([d["action_mask"] for d in dicts])}
    assert np.array_equal(policy.act(batched, deterministic=True).action, expected)
    assert policy.act(dicts[0], deterministic=True).action == expected[0]
    # The mask is in the graph: an occupied cell is never chosen, sampled or not.
    sampled = policy.act(dicts * 50, seed=3).action.reshape(50, 5)
    assert all(flat[i, 18 + sampled[:, i]].all() for i in range(5))
    with pytest.raises(ArtifactError, match="'observation' and 'action_mask'"):
        policy.act({"observation": batched["observation"]})
    with pytest.raises(ArtifactError, match="do not match"):
        policy.act({"observation": np.zeros((3, 3)), "action_mask": np.ones(9)})


def test_live_and_exported_acting_agree_and_pad_to_compiled_rows(tmp_path):
    net, policy = _tictactoe_policy(tmp_path)
    live = Acting.of_network(net, TICTACTOE.flat_space(), gym.spaces.Discrete(9))
    obs = Boards(TICTACTOE, 7).flat_obs()
    noise = policy.noise(7, np.random.default_rng(0))
    a, b = policy.run(obs, noise), live.run(obs, noise)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    padded = policy.run(obs, noise, rows=16)  # run at a compiled batch size, cut back to 7 rows
    assert padded.action.shape == (7,) and np.array_equal(padded.action, a.action)
    assert live.version is None and policy.version == "v000001"


def test_strict_graphs_run_on_whole_blocks():
    ms.set_seed(0)
    obs_space, action_space = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2)
    net = Network(obs_space, action_space, NetSpec(batch_invariant=True))
    calls = []

    def graph(obs, noise):
        calls.append(obs.shape[0])
        return net(obs, noise)

    acting = Acting(graph, interface(net, obs_space, action_space), lean=False)
    assert acting.batch_rows == BLOCK_ROWS
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((BLOCK_ROWS + 3, 3)).astype(np.float32)
    noise = acting.noise(len(obs), rng)
    whole = acting.run(obs, noise)
    assert calls == [2 * BLOCK_ROWS] and whole.action.shape == (BLOCK_ROWS + 3,)
    alone = acting.run(obs[-3:], noise[-3:])  # the same rows in another batch: bitwise the same
    assert np.array_equal(alone.logp, whole.logp[-3:])


def test_random_actions_noise_and_clipping():
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    discrete = Acting.of_network(Network(obs_space, gym.spaces.Discrete(3), NetSpec()), obs_space,
                                 gym.spaces.Discrete(3))
    actions = discrete.random_actions(1000, rng)
    assert actions.dtype == np.int32 and set(np.unique(actions)) == {0, 1, 2}
    assert not discrete.noise(4, None).any() and discrete.noise(4, rng).any()
    box = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    gaussian = Acting.of_network(Network(obs_space, box, NetSpec(policy=PolicyKind.GAUSSIAN)), obs_space, box)
    sampled = gaussian.random_actions(1000, rng)
    assert sampled.shape == (1000, 2) and sampled.dtype == np.float32 and all(box.contains(a) for a in sampled)
    wide = np.array([[5.0, -3.0]], np.float32)
    assert np.array_equal(gaussian.to_env(wide), [[2.0, 0.0]])
    assert np.array_equal(discrete.to_env(np.array([2])), [2])


def test_weights_follow_the_network_and_refuse_a_wrong_shape(tmp_path):
    net, policy = _tictactoe_policy(tmp_path)
    updates = {"n": 0}
    policy.follow(net, lambda: (updates["n"],))
    obs = Boards(TICTACTOE, 2).flat_obs()
    before = policy.run(obs, policy.noise(2, None)).logp
    for p in net.trainable_params():
        p.set_data(Tensor(p.asnumpy() + 0.3))
    assert np.array_equal(policy.run(obs, policy.noise(2, None)).logp, before)  # no update counted yet
    updates["n"] = 1
    after = policy.run(obs, policy.noise(2, None)).logp
    assert not np.array_equal(after, before) and policy.updates == 1
    with pytest.raises(ArtifactError, match="has shape"):
        policy.load_weights({n: np.zeros((1,) + s) for n, s in policy.layout}, 2)


def test_followed_weights_are_copied_bitwise_and_only_the_frozen_ones_on_a_light_refresh(tmp_path):
    net, policy = _tictactoe_policy(tmp_path, normalize_obs=True)  # the obs statistics: frozen parameters
    key = {"updates": 0, "epsilon": 0.0}
    policy.follow(net, lambda: (key["updates"], key["epsilon"]))
    obs = Boards(TICTACTOE, 3).flat_obs()
    policy.run(obs, policy.noise(3, None))
    graph = dict(policy.graph.parameters_and_names())
    live = {p.name: p for p in net.get_parameters()}

    def graph_equals_live(names):
        return all(np.array_equal(graph[n].asnumpy(), live[n].asnumpy()) for n in names)

    trainable = [n for n, _ in policy.layout if live[n].requires_grad]
    frozen = [n for n, _ in policy.layout if not live[n].requires_grad]
    assert trainable and frozen and graph_equals_live(trainable + frozen)
    for name in trainable + frozen:
        live[name].set_data(Tensor(live[name].asnumpy() + 0.25))
    key["epsilon"] = 0.1  # the light refresh: only the non-trainable parameters follow
    policy.run(obs, policy.noise(3, None))
    assert graph_equals_live(frozen) and not any(graph_equals_live([n]) for n in trainable)
    assert policy.updates == 0 and policy.refreshes == 1  # (the first call copied everything)
    key["updates"] = 1
    got = policy.run(obs, policy.noise(3, None))
    assert graph_equals_live(trainable + frozen) and policy.updates == 1 and policy.refreshes == 2
    want = Acting.of_network(net, TICTACTOE.flat_space().dict_space, gym.spaces.Discrete(9)).run(obs, policy.noise(3, None))
    np.testing.assert_array_equal(got.logp, want.logp)
    # a copy, not an alias: the learner's next change reaches the graph only at the next refresh
    for name in trainable:
        live[name].set_data(Tensor(live[name].asnumpy() * 2.0))
    assert not any(graph_equals_live([n]) for n in trainable)

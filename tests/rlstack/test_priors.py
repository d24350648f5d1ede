"""The priors entry point of a game's network: exported beside the acting graph, recorded and
checked in the manifest, equal to the acting graph's log-probabilities, following the learner's
weights, and what the search evaluates leaves with."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from rlstack.acting import Acting, load_policy
from rlstack.artifact import PRIORS_FILE, ArtifactError, export_policy
from rlstack.envs.games import CONNECT_FOUR, game_spec, play_random
from rlstack.network import NetSpec, Network, PolicyKind
from rlstack.search import FORCE, policy_value


def _export(game, tmp_path, hidden=(64, 64)):
    space, actions = game.flat_space(), gym.spaces.Discrete(game.n_actions)
    net = Network(space, actions, NetSpec(hidden=tuple(hidden), policy=PolicyKind.CATEGORICAL, value=True))
    version = export_policy(net, tmp_path / "policy", algorithm="alphazero", obs_space=space, action_space=actions,
                            device="cpu", fusion=False, config_hash="test")
    return net, version


def _positions(game, n, plies, seed=0):
    """Flat observations of the games still going after `plies` random moves."""
    p = play_random(game.positions(n), plies, np.random.default_rng(seed))
    return p.flat_obs(np.flatnonzero(~p.over))


@pytest.mark.parametrize("name", ["connect4", "openspiel:othello"])
def test_priors_equal_the_acting_graphs_log_probabilities_of_every_move(name, tmp_path):
    game = game_spec(name)
    net, version = _export(game, tmp_path)
    manifest = json.loads((version / "manifest.json").read_text())
    entry = manifest["entry_points"]["priors"]
    assert entry["graph_file"] == PRIORS_FILE and entry["outputs"] == ["logp_all", "value"]
    policy = load_policy(version)
    assert policy.has_priors
    obs = _positions(game, 16, 5)
    m, n = len(obs), game.n_actions
    logp_all, value = policy.priors(obs)
    assert logp_all.shape == (m, n) and value.shape == (m,)
    # The acting graph, one row per move, its noise forcing that move.
    forced = policy.run(np.repeat(obs, n, 0), np.tile(np.eye(n, dtype=np.float32) * FORCE, (m, 1)))
    legal = obs[:, -n:] > 0.5
    np.testing.assert_allclose(logp_all[legal], forced.logp.reshape(m, n)[legal], atol=2e-6)
    assert (logp_all[~legal] < -1e8).all()  # illegal moves: 0 probability
    np.testing.assert_allclose(value, forced.value.reshape(m, n)[:, 0], atol=2e-6)
    # The live network's entry point computes the same at the same batch.
    live = Acting.of_network(net, game.flat_space(), gym.spaces.Discrete(n))
    for a, b in zip(live.priors(obs), (logp_all, value), strict=True):
        assert np.array_equal(a, b)


def test_the_search_evaluates_leaves_in_one_row_each_and_gets_what_the_forced_rows_give(tmp_path):
    _, version = _export(CONNECT_FOUR, tmp_path)
    policy = load_policy(version)
    obs = _positions(CONNECT_FOUR, 32, 4)
    calls = []
    run, priors = policy.run, policy.priors
    policy.run = lambda *a, **k: calls.append("run") or run(*a, **k)
    policy.priors = lambda o, rows=None: calls.append(("priors", len(o), rows)) or priors(o, rows)
    prior, value = policy_value(policy, obs)
    assert calls == [("priors", 32, 128)]  # one call of one row per position (padded to a compiled size)
    without = Acting(policy.cell, policy.manifest, policy.path)  # as a graph exported without the entry point
    assert not without.has_priors
    without.run = lambda *a, **k: calls.append(("run", len(a[0]))) or run(*a, **k)
    calls.clear()
    old_prior, old_value = policy_value(without, obs)
    assert calls == [("run", 32 * 7)]
    np.testing.assert_allclose(prior, old_prior, atol=1e-6)
    np.testing.assert_allclose(value, old_value, atol=1e-6)


def test_priors_follow_the_learners_weights(tmp_path):
    net, version = _export(CONNECT_FOUR, tmp_path)
    policy = load_policy(version)
    obs = _positions(CONNECT_FOUR, 8, 3)
    before = policy.priors(obs)[0]
    for p in net.trainable_params():
        p.set_data(p + 0.05)
    policy.sync_from(net, updates=1)
    live = Acting.of_network(net, CONNECT_FOUR.flat_space(), gym.spaces.Discrete(7))
    after = policy.priors(obs)
    assert not np.array_equal(after[0], before)
    for a, b in zip(after, live.priors(obs), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_a_corrupt_priors_graph_is_refused_and_other_policies_have_none(tmp_path):
    _, version = _export(CONNECT_FOUR, tmp_path)
    data = bytearray((version / PRIORS_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (version / PRIORS_FILE).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=f"{PRIORS_FILE} is corrupt"):
        load_policy(version)
    space, actions = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    net = Network(space, actions, NetSpec(hidden=(16,), policy=PolicyKind.CATEGORICAL, value=True))
    plain = export_policy(net, tmp_path / "plain", algorithm="ppo", obs_space=space, action_space=actions,
                          device="cpu", fusion=False, config_hash="test")
    assert not (plain / PRIORS_FILE).exists()
    policy = load_policy(plain)
    assert not policy.has_priors
    with pytest.raises(ArtifactError, match="no priors entry point"):
        policy.priors(np.zeros((1, 4), np.float32))


def test_a_version_sent_elsewhere_carries_its_priors_graph(tmp_path):
    """Actors on Ray receive a version as bytes (`version_files`, `write_version`): the priors
    graph travels with the acting graph and is verified where it lands."""
    from rlstack.artifact import version_files, write_version

    _, version = _export(CONNECT_FOUR, tmp_path)
    files = version_files(version)
    assert PRIORS_FILE in files
    landed = load_policy(write_version(files, tmp_path / "elsewhere"))
    assert landed.has_priors
    obs = _positions(CONNECT_FOUR, 4, 2)
    for a, b in zip(landed.priors(obs), load_policy(version).priors(obs), strict=True):
        assert np.array_equal(a, b)


def test_a_version_sent_elsewhere_is_exactly_its_manifest_and_the_graphs_it_names(tmp_path):
    """`write_version` accepts the files its manifest names and nothing else: a file it does not
    name, a graph it names but that was not sent, or a name reaching outside the version directory
    is refused before anything is written."""
    import json

    from rlstack.artifact import GRAPH_FILE, MANIFEST_FILE, version_files, write_version

    _, version = _export(CONNECT_FOUR, tmp_path)
    files = version_files(version)
    manifest = json.loads(files[MANIFEST_FILE])
    outside = {**manifest, "entry_points": {"priors": {**manifest["entry_points"]["priors"], "graph_file": "../x"}}}
    bad = {
        "an extra file": {**files, "notes.txt": b"x"},
        "a missing graph": {k: v for k, v in files.items() if k != PRIORS_FILE},
        "no manifest": {GRAPH_FILE: files[GRAPH_FILE]},
        "an unreadable manifest": {**files, MANIFEST_FILE: b"{"},
        "a name outside": {**files, MANIFEST_FILE: json.dumps(outside).encode()},
    }
    for what, sent in bad.items():
        dest = tmp_path / what.replace(" ", "_")
        with pytest.raises(ArtifactError):
            write_version(sent, dest)
        assert not dest.exists(), what

"""The policy artifact: plain-MindSpore reload is the live module bit for bit, any batch size,
refusals with clear messages, train/serve config mismatches reported, and LATEST under fire."""

import json
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from rlstack.acting import PolicyWatcher, load_policy
from rlstack.artifact import ArtifactError, export_policy
from rlstack.network import NetSpec, Network, PolicyKind, sample_noise
from rlstack.runtime import DeviceError, resolve_fusion

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def _network(action_space: gym.Space, policy: PolicyKind, seed: int = 0) -> Network:
    ms.set_seed(seed)
    net = Network(OBS, action_space, NetSpec(policy=policy, normalize_obs=True))
    rng = np.random.default_rng(seed)
    # Non-trivial weights and obs statistics (they are exported inside the graph).
    for p in net.trainable_params():
        p.set_data(Tensor(p.asnumpy() + 0.3 * rng.standard_normal(p.shape).astype(np.float32)))
    net.set_obs_stats(rng.standard_normal(4), rng.uniform(0.5, 2.0, 4))
    return net


def _export(net: Network, policy_dir, action_space: gym.Space, **kw):
    return export_policy(net, policy_dir, algorithm="ppo", obs_space=OBS, action_space=action_space,
                         device="cpu", fusion=False, config_hash="test", **kw)


@pytest.mark.parametrize("policy,space", [(PolicyKind.CATEGORICAL, gym.spaces.Discrete(3)),
                                          (PolicyKind.GAUSSIAN, gym.spaces.Box(-1, 1, (2,), np.float32))])
def test_plain_mindspore_reload_is_the_live_module_bit_for_bit_at_any_batch(tmp_path, policy, space):
    net = _network(space, policy)
    version = _export(net, tmp_path / "policy", space)
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["inputs"]["obs"] == [None, 4]  # dynamic batch: the shape-mismatch fix of the seed's table
    graph = nn.GraphCell(ms.load(str(version / "policy.mindir")))  # no rlstack code on this path
    rng = np.random.default_rng(1)
    for batch in (1, 7, 64, 300):
        obs = rng.standard_normal((batch, 4)).astype(np.float32) * 3
        noise = sample_noise(net.noise_kind, net.noise_dim, batch, rng)
        exported = graph(Tensor(obs), Tensor(noise))
        live = net(Tensor(obs), Tensor(noise))
        for name, a, b in zip(("action", "logp", "value"), exported, live, strict=True):
            assert a.shape[0] == batch
            assert np.array_equal(a.asnumpy(), b.asnumpy()), f"{name} differs at batch {batch}"


def test_a_flipped_byte_and_a_wrong_observation_shape_are_refused(tmp_path):
    space = gym.spaces.Discrete(2)
    version = _export(_network(space, PolicyKind.CATEGORICAL), tmp_path / "policy", space)
    policy = load_policy(tmp_path)  # a run dir: follows policy/LATEST
    with pytest.raises(ArtifactError, match=r"observation shape \(5,\) does not match the policy: expected \(4,\)"):
        policy.act(np.zeros(5, np.float32))
    with pytest.raises(ArtifactError, match=r"takes observations of shape \(4,\), the caller expects \(3, 3\)"):
        load_policy(version, obs_shape=(3, 3))

    graph = version / "policy.mindir"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0x01
    graph.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="is corrupt: sha256 .* refusing to load it"):
        load_policy(version)


def test_train_serve_config_mismatches_are_reported(tmp_path):
    space = gym.spaces.Discrete(2)
    version = _export(_network(space, PolicyKind.CATEGORICAL), tmp_path / "policy", space)
    with pytest.warns(UserWarning, match="trained with graph-kernel fusion off, running with it on"):
        load_policy(version, fusion=True)
    with pytest.warns(UserWarning, match="exported on device 'cpu', running on 'gpu'"):
        load_policy(version, device="gpu")
    manifest = json.loads((version / "manifest.json").read_text())
    (version / "manifest.json").write_text(json.dumps({**manifest, "dtype": "float16"}))
    with pytest.raises(ArtifactError, match="graph dtype is float16, expected float32"):
        load_policy(version)
    (version / "manifest.json").write_text(json.dumps({**manifest, "mindspore_version": "1.9.0"}))
    with pytest.raises(ArtifactError, match=r"exported by MindSpore 1\.9\.0, this process runs MindSpore 2\.10"):
        load_policy(version)
    # Unsupported fusion is a clear error before any compiler runs.
    with pytest.raises(DeviceError, match="graph-kernel fusion needs the Ascend or GPU backend"):
        resolve_fusion("cpu", "on")


_WRITER = textwrap.dedent("""
    import os
    import sys
    import gymnasium as gym
    import numpy as np
    from mindspore import Tensor
    from rlstack.artifact import export_policy
    from rlstack.network import Network, NetSpec
    from rlstack.runtime import configure

    configure()
    obs = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    net = Network(obs, gym.spaces.Discrete(2), NetSpec())
    bias = net.pi[-1].bias
    for i in range(int(sys.argv[2])):
        if os.path.exists(sys.argv[3]):  # the reader has seen enough
            break
        bias.set_data(Tensor(np.array([float(i), 0.0], np.float32)))  # version i+1 is recognisable
        export_policy(net, sys.argv[1], algorithm="ppo", obs_space=obs, action_space=gym.spaces.Discrete(2),
                      device="cpu", fusion=False, config_hash="w", keep=1, extra={"updates": i})
""")


def test_a_reader_polling_latest_never_fails_while_versions_are_published(tmp_path):
    policy_dir, stop = tmp_path / "policy", tmp_path / "stop"
    # The writer publishes up to 1,000 versions, until the reader has loaded 50 (however fast
    # either runs on a busy machine).
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(policy_dir), "1000", str(stop)],
                              stderr=subprocess.PIPE, text=True)
    watcher = PolicyWatcher(policy_dir, obs_shape=(4,))
    loads, seen, obs = 0, [], np.zeros((3, 4), np.float32)
    try:
        deadline = time.monotonic() + 240
        while writer.poll() is None and time.monotonic() < deadline:
            direct = load_policy(policy_dir) if (policy_dir / "LATEST").exists() else None  # run/policy dir form
            polled = watcher.poll()
            for policy in (direct, polled):
                if policy is None:
                    continue
                loads += 1
                # Each version is whole: its manifest, its graph and its weights belong together.
                number = int(policy.version[1:])
                assert policy.manifest["updates"] == number - 1
                logits_bias = policy.graph.parameters_dict()["pi.4.bias"].asnumpy()
                assert logits_bias[0] == number - 1
                seen.append(number)
            if polled is not None:  # running compiles the graph (~0.2 s): only the watcher's
                assert polled.run(obs, np.zeros((3, 2), np.float32)).action.shape == (3,)
            if loads >= 50 and len(set(seen)) >= 5:
                stop.touch()
    finally:
        if writer.poll() is None:
            writer.kill()
        _, err = writer.communicate()
    assert writer.returncode == 0, err[-2000:]
    assert loads >= 50 and len(set(seen)) >= 5, (loads, sorted(set(seen)))
    # keep=1: every older version was pruned while the reader was following LATEST.
    latest = (policy_dir / "LATEST").read_text().strip()
    assert int(latest[1:]) >= max(seen)
    assert [p.name for p in policy_dir.iterdir() if p.name.startswith("v")] == [latest]

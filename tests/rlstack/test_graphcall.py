"""The lean graph call returns bitwise what the public call returns, for every signature, and
falls back to the public call when the direct path is unavailable."""

import gymnasium as gym
import numpy as np
from mindspore import Tensor

from rlstack.acting import load_policy
from rlstack.artifact import export_policy
from rlstack.graphcall import LeanCall
from rlstack.network import NetSpec, Network

OBS, ACT = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(3)


def _policy(tmp_path):
    net = Network(OBS, ACT, NetSpec())
    version = export_policy(net, tmp_path / "policy", algorithm="ppo", obs_space=OBS, action_space=ACT,
                            device="cpu", fusion=False, config_hash="test")
    return load_policy(version)


def test_lean_call_matches_the_public_call_at_every_batch_size(tmp_path):
    policy = _policy(tmp_path)
    rng = np.random.default_rng(0)
    for rows in (1, 8, 8, 5, 8, 64):  # repeated and new signatures
        obs = rng.standard_normal((rows, 4)).astype(np.float32)
        noise = rng.gumbel(size=(rows, 3)).astype(np.float32)
        lean = policy.call(Tensor(obs), Tensor(noise))
        public = policy.graph(Tensor(obs), Tensor(noise))
        for a, b in zip(lean, public, strict=True):
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    assert policy.call.direct  # the direct path was checked and kept on this MindSpore


def test_a_direct_run_that_differs_switches_to_the_public_call(tmp_path):
    policy = _policy(tmp_path)
    call = LeanCall(policy.graph)
    real = call._run
    call._run = lambda args, phase: tuple(Tensor(t.asnumpy() + 1) for t in real(args, phase))
    obs, noise = np.zeros((2, 4), np.float32), np.zeros((2, 3), np.float32)
    call(Tensor(obs), Tensor(noise))
    assert not call.direct and not call._phases

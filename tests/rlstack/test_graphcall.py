"""The lean graph call returns bitwise what the public call returns (and, for a graph with side
effects, leaves the same state), for every signature, and falls back to the public call when the
direct path is unavailable or differs."""

from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from rlstack.acting import load_policy
from rlstack.artifact import export_policy
from rlstack.graphcall import (
    SMALL_OUTPUT,
    LeanCall,
    ParameterCopy,
    ParameterWrite,
    to_numpy,
    written_by,
)
from rlstack.network import NetSpec, Network
from rlstack.runtime import flush_denormals

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


class _AdamStep(nn.Cell):
    """A graph with side effects: one Adam step on a small regression loss."""

    def __init__(self, seed: int):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = Parameter(Tensor(rng.standard_normal((4, 3)).astype(np.float32)), name="w")
        self.optimizer = nn.Adam([self.w], learning_rate=1e-2)
        self.grad = ops.value_and_grad(self.loss, None, self.optimizer.parameters)

    def loss(self, x, y):
        return ((ops.matmul(x, self.w) - y) ** 2).mean()

    def construct(self, x, y):
        loss, grads = self.grad(x, y)
        self.optimizer(grads)
        return loss


def test_a_lean_call_with_side_effects_leaves_the_state_the_public_call_leaves():
    lean_cell, public = _AdamStep(0), _AdamStep(0)
    call = LeanCall(lean_cell, state=written_by(lean_cell))
    rng = np.random.default_rng(1)
    for rows in (8, 8, 8, 5, 8):  # the first call of each signature is checked from the same state twice
        x, y = rng.standard_normal((rows, 4)).astype(np.float32), rng.standard_normal((rows, 3)).astype(np.float32)
        np.testing.assert_array_equal(call(Tensor(x), Tensor(y)).asnumpy(), public(Tensor(x), Tensor(y)).asnumpy())
        for a, b in zip(written_by(lean_cell), written_by(public), strict=True):
            np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    assert call.direct and len(call._phases) == 2
    assert int(lean_cell.optimizer.global_step.asnumpy()[0]) == 5


def test_a_side_effect_check_that_fails_keeps_the_public_callswritten_by():
    lean_cell, public = _AdamStep(0), _AdamStep(0)
    call = LeanCall(lean_cell, state=written_by(lean_cell))
    real = call._run

    def skewed(args, phase):  # a direct run that also moves a parameter
        out = real(args, phase)
        lean_cell.w.set_data(Tensor(lean_cell.w.asnumpy() + 1))
        return out

    call._run = skewed
    x, y = np.ones((2, 4), np.float32), np.zeros((2, 3), np.float32)
    call(Tensor(x), Tensor(y))
    public(Tensor(x), Tensor(y))
    assert not call.direct
    for a, b in zip(written_by(lean_cell), written_by(public), strict=True):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_parameter_copy_writes_every_source_in_chunks_and_keeps_no_alias():
    rng = np.random.default_rng(0)
    shapes = [(3, 2), (5,), (1,)] * 30  # 90 parameters: two assign graphs of ASSIGN_CHUNK
    sources = [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)), name=f"src{i}")
               for i, s in enumerate(shapes)]
    targets = [Parameter(Tensor(np.zeros(s, np.float32)), name=f"dst{i}") for i, s in enumerate(shapes)]
    copy = ParameterCopy(targets, sources)
    for round_ in range(3):
        copy()
        for src, dst in zip(sources, targets, strict=True):
            np.testing.assert_array_equal(dst.asnumpy(), src.asnumpy())
        for src in sources:
            src.set_data(Tensor(src.asnumpy() * 3.0 + round_))
        assert not np.array_equal(targets[0].asnumpy(), sources[0].asnumpy())  # copied, not aliased
    assert len(copy._writes) == 2 and all(write._call.direct for write in copy._writes)


def test_parameter_copy_refuses_unequal_lists():
    p = Parameter(Tensor(np.zeros(2, np.float32)), name="p")
    with pytest.raises(ValueError, match="1 targets but 0 sources"):
        ParameterCopy([p], [])


class _Outputs(nn.Cell):
    """Graph outputs of each kind `to_numpy` reads: float32 and int32, small and large."""

    def construct(self, x):
        return x * 1.0, ops.Argmax(-1, ms.int32)(x), (x - 1.0).reshape(-1)


def test_to_numpy_reads_graph_outputs_bit_for_bit_at_every_size():
    call = LeanCall(_Outputs())
    rng = np.random.default_rng(0)
    for rows in (1, 8, SMALL_OUTPUT // 4, SMALL_OUTPUT, 300):  # both sides of the tolist / asnumpy switch
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        x[0] = [np.nan, np.inf, -0.0, 1e-45]  # values a float round trip could change
        for out in call(Tensor(x)):
            got, want = to_numpy(out), out.asnumpy()
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes()


class _Scaled(nn.Cell):
    """A graph that reads two scheduled scalars."""

    def __init__(self):
        super().__init__()
        self.lr = Parameter(Tensor(0.5, ms.float32), name="lr", requires_grad=False)
        self.steps = Parameter(Tensor(0, ms.int32), name="steps", requires_grad=False)

    def construct(self, x):
        return x * self.lr + self.steps.astype(ms.float32)


def test_parameter_write_reaches_the_graphs_that_read_the_parameters():
    cell = _Scaled()
    call, write = LeanCall(cell), ParameterWrite([cell.lr, cell.steps])
    x = Tensor(np.ones(3, np.float32))
    np.testing.assert_array_equal(call(x).asnumpy(), [0.5] * 3)
    for lr, steps in ((0.25, 3), (1e-3, 7), (2.0, 0)):
        write(lr, steps)
        assert cell.lr.asnumpy() == np.float32(lr) and cell.steps.asnumpy() == steps
        np.testing.assert_array_equal(call(x).asnumpy(), np.float32(lr) * np.ones(3, np.float32) + steps)
    with pytest.raises(ValueError, match="2 parameters but 1 values"):
        write(0.1)
    with pytest.raises(ValueError, match="1 to 64 parameters per write, got 0"):
        ParameterWrite([])


class _Times(nn.Cell):
    def construct(self, x):
        return x * 0.5


def test_denormals_are_flushed_on_every_path_a_graph_runs():
    """The calling thread flushes denormals as MindSpore's CPU kernel threads do (the suite's
    processes are set up by `rlstack.runtime.configure`), so a graph's first calls (on the kernel
    threads) and its later ones (on the calling thread) give the same bits."""
    assert flush_denormals()
    x = Tensor(np.array([4, 1 << 22, 0x3F800000], np.uint32).view(np.float32))  # denormals, then 1.0
    call = LeanCall(_Times())
    outputs = [call(x) for _ in range(3)] + [_Times()(x)]
    with ThreadPoolExecutor(1) as pool:  # a thread started later inherits the mode
        outputs.append(pool.submit(call, x).result())
    for out in outputs:
        assert out.asnumpy().tolist() == [0.0, 0.0, 0.5]
    assert call.direct
    assert (np.array([4], np.uint32).view(np.float32) * np.float32(1.0))[0] == 0  # the host's numpy too

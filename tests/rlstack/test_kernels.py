"""The graph pieces of `rlstack.kernels` compute what the slower kernels they replace compute:
slices equal numpy's (static and dynamic batch, with gradients), the log softmax equals float64's
within float32 rounding, its written gradient equals automatic differentiation's of
`ops.log_softmax`, and it returns the same bits on every call of a new graph."""

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rlstack.kernels import LogSoftmax, column, columns, rows


class _Slices(nn.Cell):
    def construct(self, x, flat):
        return columns(x, 1, 3), column(x, 4), rows(x, 2, 5), rows(flat, 3, 9)


def test_slices_equal_numpy_at_static_and_dynamic_batch():
    rng = np.random.default_rng(0)
    flat = rng.standard_normal(20).astype(np.float32)
    dynamic = _Slices()
    dynamic.set_inputs(Tensor(shape=[None, 6], dtype=ms.float32), Tensor(shape=[20], dtype=ms.float32))
    for n in (7, 11):
        x = rng.standard_normal((n, 6)).astype(np.float32)
        for cell in (_Slices(), dynamic):
            out = [o.asnumpy() for o in cell(Tensor(x), Tensor(flat))]
            for got, want in zip(out, (x[:, 1:3], x[:, 4], x[2:5], flat[3:9]), strict=True):
                assert got.shape == want.shape and np.array_equal(got, want)


class _Weighted(nn.Cell):
    """sum(f(x * w) * y): the gradient with respect to w carries f's gradient for any dy = y."""

    def __init__(self, f, shape):
        super().__init__()
        self.f = f
        self.w = Parameter(Tensor(np.random.default_rng(1).uniform(0.5, 1.5, shape).astype(np.float32)), name="w")

    def construct(self, x, y):
        return (self.f(x * self.w) * y).sum()


class _SliceSum(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones((7, 6), np.float32)), name="w")

    def construct(self, x):
        z = x * self.w
        return columns(z, 1, 3).sum() + 2.0 * column(z, 4).sum() + 3.0 * rows(z, 2, 5).sum()


def test_slice_gradients_land_on_the_sliced_entries():
    x = Tensor(np.random.default_rng(0).standard_normal((7, 6)).astype(np.float32))
    net = _SliceSum()
    grad = ms.grad(net, None, net.trainable_params())(x)[0].asnumpy()
    coef = np.zeros((7, 6), np.float32)
    coef[:, 1:3] += 1.0
    coef[:, 4] += 2.0
    coef[2:5] += 3.0
    np.testing.assert_allclose(grad, coef * x.asnumpy(), rtol=1e-6)


class _Builtin(nn.Cell):
    def construct(self, x):
        return ops.log_softmax(x, -1)


def test_log_softmax_matches_float64_and_its_gradient_matches_autodiff():
    rng = np.random.default_rng(0)
    for shape in ((1, 2), (5, 2), (256, 2), (7, 3), (3, 7)):
        logits = (rng.standard_normal(shape) * 3).astype(np.float32)
        x64 = logits.astype(np.float64)
        shifted = x64 - x64.max(-1, keepdims=True)
        exact = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        ours = LogSoftmax()(Tensor(logits)).asnumpy()
        np.testing.assert_allclose(ours, exact, rtol=0, atol=2e-6)
        y = Tensor(rng.standard_normal(shape).astype(np.float32))
        grads = []
        for f in (LogSoftmax(), _Builtin()):
            net = _Weighted(f, shape)
            grads.append(ms.grad(net, None, net.trainable_params())(Tensor(logits), y)[0].asnumpy())
        np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-4)


def test_log_softmax_is_bitwise_stable_from_the_first_call():
    """MindSpore's CPU `Log` kernel changed its last bits over a new graph's first calls on sizes
    that are not a multiple of 8 (its parallel launch tuning); the exported graph and the learner
    must agree bit for bit however often each ran."""
    for shape in ((4, 2), (5, 3), (17, 2)):  # with `ops.log`: two results on each
        logits = Tensor(np.random.default_rng(0).uniform(-5, 5, shape).astype(np.float32))
        seen = set()
        for _ in range(3):
            cell = LogSoftmax()
            seen.update(cell(logits).asnumpy().tobytes() for _ in range(30))
        assert len(seen) == 1, shape

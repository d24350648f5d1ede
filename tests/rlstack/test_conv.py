"""`rlstack.conv` computes what MindSpore's `nn.Conv2d` computes: the output and the gradients of
the input, weight and bias of `Conv2dFast` (every method) match the native layer's with the same
weights within `RTOL` of the largest reference value, for the Nature CNN and MinAtar layer shapes at
batch 1 and 5 (one graph of dynamic batch per layer and method, as exported graphs are); the stack
of layers matches the native stack; `conv_layer` picks its form; bad shapes are refused naming them."""

import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.common.initializer import Orthogonal

from rlstack.conv import Conv2dFast, ConvStack, InputMajorDense, choose_method, conv_layer

RTOL = 2e-5
"""Max |fast - native| / max |native| allowed; measured up to ~1e-6 (float32 sums in another
order)."""

LAYERS = {
    "nature_8x8/4": (4, 32, 8, 4, 84),
    "nature_4x4/2": (32, 64, 4, 2, 20),
    "nature_3x3/1": (64, 64, 3, 1, 9),
    "minatar_3x3/1": (4, 16, 3, 1, 10),
}
BATCHES = (1, 5)


class _OutAndGrads(nn.Cell):
    """For each conv: (output, d/dx, d/dweight, d/dbias) of sum(conv(x) * r); one graph for all."""

    def __init__(self, convs):
        super().__init__()
        self.convs = nn.CellList(convs)
        self.grads = [ops.value_and_grad(self._loss(conv), grad_position=0, weights=conv.trainable_params(),
                                         has_aux=True) for conv in convs]

    @staticmethod
    def _loss(conv):
        def loss(x, r):
            out = conv(x)
            return (out * r).sum(), out
        return loss

    def construct(self, x, r):
        results = ()
        for grad in self.grads:
            (_, out), (dx, (dw, db)) = grad(x, r)
            results += ((out, dx, dw, db),)
        return results


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_output_and_gradients_match_native_conv2d(layer):
    cin, cout, k, s, size = LAYERS[layer]
    oh = (size - k) // s + 1
    rng = np.random.default_rng(0)
    native = nn.Conv2d(cin, cout, k, s, pad_mode="valid", has_bias=True)
    native.bias.set_data(Tensor(rng.standard_normal(cout).astype(np.float32)))
    methods = ("split", "concat", "gather")
    convs = [native]
    for method in methods:
        fast = Conv2dFast(cin, cout, k, s, method=method)
        fast.weight.set_data(native.weight.data.copy())
        fast.bias.set_data(native.bias.data.copy())
        convs.append(fast)
    graph = _OutAndGrads(convs)
    # one graph of dynamic batch, as exported graphs are
    graph.set_inputs(Tensor(shape=[None, cin, size, size], dtype=ms.float32),
                     Tensor(shape=[None, cout, oh, oh], dtype=ms.float32))
    for batch in BATCHES:
        x = Tensor(rng.standard_normal((batch, cin, size, size)).astype(np.float32))
        r = Tensor(rng.standard_normal((batch, cout, oh, oh)).astype(np.float32))
        want, *got_by_method = [[t.asnumpy() for t in result] for result in graph(x, r)]
        for method, got in zip(methods, got_by_method, strict=True):
            for name, g, w in zip(("output", "d_input", "d_weight", "d_bias"), got, want, strict=True):
                assert g.shape == w.shape, (layer, method, name, g.shape, w.shape)
                err = float(np.abs(g - w).max() / np.abs(w).max())
                assert err <= RTOL, f"{layer} {method} batch {batch} {name}: relative error {err:.2e}"


def test_auto_method_by_layer_shape_and_batch():
    """The choices measured fastest (docs/PERFORMANCE.md#convolutions); 3x3/1 on 64 channels
    changes with the batch: `concat` at 8 rows or a dynamic batch, `split` at 256."""
    for rows, nature_3x3 in ((None, "concat"), (8 * 49, "concat"), (256 * 49, "split")):
        assert [choose_method(cin, (k, k), (s, s), rows) for cin, _, k, s, _ in LAYERS.values()] == [
            "split", "split", nature_3x3, "gather"]
    assert choose_method(4, (5, 5), (2, 2)) == "gather"  # the stride does not divide the kernel
    assert Conv2dFast(64, 64, 3).method == "auto" and Conv2dFast(4, 32, 8, 4).method == "split"


def test_auto_by_batch_when_compiled():
    """An `auto` layer whose choice depends on the batch computes the same at a large static batch
    and at a dynamic one."""
    rng = np.random.default_rng(6)
    native = nn.Conv2d(64, 64, 3, 1, pad_mode="valid", has_bias=True)
    static, dynamic = Conv2dFast(64, 64, 3, 1), Conv2dFast(64, 64, 3, 1)
    dynamic.set_inputs(Tensor(shape=[None, 64, 9, 9], dtype=ms.float32))
    for fast, batch in ((static, 48), (dynamic, 2)):  # 2352 rows: split; dynamic: concat
        fast.weight.set_data(native.weight.data.copy())
        fast.bias.set_data(native.bias.data.copy())
        x = Tensor(rng.standard_normal((batch, 64, 9, 9)).astype(np.float32))
        want = native(x).asnumpy()
        np.testing.assert_allclose(fast(x).asnumpy(), want, rtol=0, atol=RTOL * np.abs(want).max())


def test_nhwc_layout_and_an_uneven_input():
    """NHWC in and out give the NCHW result transposed; rows and columns the stride leaves out
    (87 x 50 with 8x6/4x3) are cropped."""
    rng = np.random.default_rng(1)
    native = nn.Conv2d(3, 5, (8, 6), (4, 3), pad_mode="valid", has_bias=True)
    x = rng.standard_normal((2, 3, 87, 50)).astype(np.float32)
    want = native(Tensor(x)).asnumpy()
    for fmt in ("NCHW", "NHWC"):
        fast = Conv2dFast(3, 5, (8, 6), (4, 3), in_format=fmt, out_format=fmt)
        fast.weight.set_data(native.weight.data.copy())
        fast.bias.set_data(native.bias.data.copy())
        got = fast(Tensor(x if fmt == "NCHW" else x.transpose(0, 2, 3, 1).copy())).asnumpy()
        got = got if fmt == "NCHW" else got.transpose(0, 3, 1, 2)
        np.testing.assert_allclose(got, want, rtol=0, atol=RTOL * np.abs(want).max())


def test_stack_matches_the_native_stack_with_the_same_parameter_names():
    """Nature CNN's features both ways."""
    shape, convs = (4, 84, 84), ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    native, fast = ConvStack(shape, convs, form="native", dense=32), ConvStack(shape, convs, form="matmul", dense=32)
    assert [p.name for p in fast.get_parameters()] == [p.name for p in native.get_parameters()]
    for p, q in zip(fast.get_parameters(), native.get_parameters(), strict=True):
        p.set_data(q.data.copy())
    assert fast.conv_shape == native.conv_shape == (64, 7, 7) and fast.out_dim == 32
    x = Tensor(np.random.default_rng(2).uniform(0, 1, (2, *shape)).astype(np.float32))
    want = native(x).asnumpy()
    np.testing.assert_allclose(fast(x).asnumpy(), want, rtol=0, atol=RTOL * np.abs(want).max())


def test_exported_with_a_dynamic_batch(tmp_path):
    """The MinAtar stack exported as policies are (a dynamic batch) computes what the Cell does."""
    shape = (4, 10, 10)
    stack = ConvStack(shape, ((16, 3, 1),), form="matmul", dense=8)
    ms.export(stack, Tensor(shape=[None, *shape], dtype=ms.float32), file_name=str(tmp_path / "stack"),
              file_format="MINDIR")
    exported = nn.GraphCell(ms.load(os.fspath(tmp_path / "stack.mindir")))
    x = Tensor(np.random.default_rng(7).uniform(0, 1, (3, *shape)).astype(np.float32))
    for rows in (1, 3):
        np.testing.assert_allclose(exported(x[:rows]).asnumpy(), stack(x[:rows]).asnumpy(), rtol=0, atol=1e-6)


def test_input_major_dense_is_nn_dense_with_the_weight_transposed():
    ms.set_seed(4)
    dense = InputMajorDense(6, 3)
    ms.set_seed(4)
    reference = nn.Dense(6, 3)
    assert np.array_equal(dense.weight.asnumpy(), reference.weight.asnumpy().T)
    assert np.array_equal(dense.bias.asnumpy(), reference.bias.asnumpy())
    x = Tensor(np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32))
    np.testing.assert_allclose(dense(x).asnumpy(), reference(x).asnumpy(), rtol=0, atol=1e-6)


def test_conv_layer_form_and_initialisation():
    assert type(conv_layer(4, 16, 3, form="native")) is nn.Conv2d
    assert isinstance(conv_layer(4, 16, 3, form="matmul"), Conv2dFast)
    assert ms.get_context("device_target") == "CPU"
    assert isinstance(conv_layer(4, 16, 3), Conv2dFast)  # auto, on the CPU
    with pytest.raises(ValueError, match="form"):
        conv_layer(4, 16, 3, form="fast")
    # The same initialisers draw the same weights as nn.Conv2d's, defaults included.
    for init in (None, Orthogonal(gain=2 ** 0.5)):
        ms.set_seed(3)
        fast = conv_layer(4, 32, 8, 4, weight_init=init, form="matmul")
        ms.set_seed(3)
        native = conv_layer(4, 32, 8, 4, weight_init=init, form="native")
        assert np.array_equal(fast.weight.asnumpy(), native.weight.asnumpy())
        assert np.array_equal(fast.bias.asnumpy(), native.bias.asnumpy())


def test_bad_shapes_are_refused_naming_them():
    conv = Conv2dFast(4, 32, 8, 4)
    with pytest.raises(ValueError, match=r"input 7x84 .* smaller than the kernel 8x8"):
        conv(Tensor(np.zeros((2, 4, 7, 84), np.float32)))
    with pytest.raises(ValueError, match=r"got 3 input channels .*expected 4"):
        conv(Tensor(np.zeros((2, 3, 84, 84), np.float32)))
    with pytest.raises(ValueError, match=r"stride \(2, 2\) to divide the kernel \(5, 5\)"):
        Conv2dFast(4, 8, 5, 2, method="split")
    with pytest.raises(ValueError, match="smaller than the kernel"):
        ConvStack((4, 10, 10), ((16, 3, 1), (16, 9, 1)), form="matmul")

"""Convolutions ("valid" padding) built from the kernels MindSpore 2.10's CPU runtime runs fast.

Owns `Conv2dFast` (a convolution as matrix products: `nn.Conv2d`'s parameters, names and
initialisation, another computation), `conv_layer` (the fast layer on the CPU, MindSpore's
`nn.Conv2d` on Ascend and GPU) and `ConvStack` (convolutions with ReLU, flattened in `nn.Conv2d`'s
(C, H, W) order, optionally a dense layer: Nature CNN's features).

- The CPU `Conv2D` runs oneDNN's reference kernel: docs/PERFORMANCE.md#convolutions.
- Stride by space-to-depth (one `Reshape` + `Transpose`), then one `Slice` per kernel tap; one
  index `Gather` only for narrow inputs or a stride that does not divide the kernel (slower
  elsewhere, and its gradient is a scatter-add): docs/PERFORMANCE.md#convolutions.
- The taps meet the weight as one `MatMul` per tap summed by `AddN` (`split`) or one `Concat` and
  one `MatMul` (`concat`), whichever measured faster for the layer's shape and batch
  (`choose_method`; `Concat` of narrow pieces is slow): docs/PERFORMANCE.md#convolutions.
- Products through the `MatMul` primitive (its gradient uses the transpose flags; `ops.matmul`'s
  gradient adds `Transpose` kernels): docs/PERFORMANCE.md#convolutions.
- The bias gradient as a product with a row of ones (`BiasAddGrad` and `ReduceSum` over the rows
  of a tall matrix are slow): docs/PERFORMANCE.md#convolutions.
- Between convolutions the activations stay channels-last (NHWC): no layout change between layers.
- The dense layer after them stores its weight input-major (`InputMajorDense`):
  docs/PERFORMANCE.md#convolutions.
- `parity: strict` (`batch_invariant`): every product with the rows along the columns
  (`rlstack.layers.RowWiseMatMul`) and one method at every batch size, so each output row is
  bitwise independent of the batch: docs/PERFORMANCE.md#strict-parity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import HeUniform, Uniform, initializer
from mindspore.ops import functional as F

from rlstack.layers import RowWiseMatMul

METHODS = ("auto", "split", "concat", "gather")
"""How `Conv2dFast` gathers the input windows: `split` (one product per kernel tap, summed), `concat`
(the taps side by side, one product), `gather` (im2col by one `Gather` with indices computed when
the graph is compiled, one product; any stride), `auto` (`choose_method`, when each graph is
compiled: the choice may depend on its batch size)."""
FORMATS = ("NCHW", "NHWC")
FORMS = ("auto", "native", "matmul")
"""`conv_layer`'s choice: `native` is MindSpore's `nn.Conv2d`, `matmul` is `Conv2dFast`, `auto` the
latter on the CPU and the former elsewhere."""

SPLIT_MIN_WIDTH = 256
"""`auto` takes `split` at every batch when at most `SPLIT_MAX_TAPS` taps hold at least this many
input values per output position between them (Nature CNN's 8x8/4 and 4x4/2 layers)."""
SPLIT_MAX_TAPS = 4
SPLIT_MIN_ROWS = 2048
"""Layers with more taps take `split` from this many product rows (batch x output positions) and
`concat` below it or at a dynamic batch (an exported acting graph): Nature CNN's 3x3/1 layer
(49 positions) crossed over between batch 32 and 48."""
GATHER_MAX_CHANNELS = 8
"""`auto` takes `gather` when space-to-depth leaves at most this many channels per tap (MinAtar's
3x3/1 layer on 4 channels): slicing and concatenating such narrow pieces costs more than one
`Gather` reading the input as it is laid out."""


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"{name} must be a positive int or a pair of them, got {value!r}")
    return pair


def choose_method(in_channels: int, kernel_size: tuple[int, int], stride: tuple[int, int],
                  rows: int | None = None) -> str:
    """`auto`'s choice for a layer (see `METHODS`) whose product has `rows` rows (batch x output
    positions; None: not known, a dynamic batch)."""
    (kh, kw), (sh, sw) = kernel_size, stride
    if kh % sh or kw % sw:
        return "gather"
    taps = (kh // sh) * (kw // sw)
    width = in_channels * sh * sw
    if width <= GATHER_MAX_CHANNELS:
        return "gather"
    if taps <= SPLIT_MAX_TAPS and taps * width >= SPLIT_MIN_WIDTH:
        return "split"
    return "split" if rows is not None and rows >= SPLIT_MIN_ROWS else "concat"


def gather_indices(channels: int, size: tuple[int, int], kernel_size: tuple[int, int],
                   stride: tuple[int, int], in_format: str) -> np.ndarray:
    """int32 [OH * OW * K]: for each output position (row-major) the flat indices of its window
    in one flattened input image; K in the order of `nn.Conv2d`'s weight, (c, i, j) for NCHW
    input, (i, j, c) for NHWC input."""
    (h, w), (kh, kw), (sh, sw) = size, kernel_size, stride
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    oy, ox = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    rows = oy.reshape(-1, 1) * sh
    cols = ox.reshape(-1, 1) * sw
    if in_format == "NCHW":
        c, i, j = (a.reshape(1, -1) for a in np.meshgrid(np.arange(channels), np.arange(kh), np.arange(kw),
                                                        indexing="ij"))
        flat = c * h * w + (rows + i) * w + cols + j
    else:
        i, j, c = (a.reshape(1, -1) for a in np.meshgrid(np.arange(kh), np.arange(kw), np.arange(channels),
                                                        indexing="ij"))
        flat = ((rows + i) * w + cols + j) * channels + c
    return flat.reshape(-1).astype(np.int32)


class RowBias(nn.Cell):
    """x [M, N] + bias [N], with the bias gradient as ones[1, M] @ dout: one GEMM, where
    `BiasAddGrad` and `ReduceSum` over the M rows of a tall matrix were slow."""

    def __init__(self):
        super().__init__()
        self.matmul = ops.MatMul()

    def construct(self, x, bias):
        return ops.bias_add(x, bias)

    def bprop(self, x, bias, out, dout):
        ones = ops.ones((1, dout.shape[0]), dout.dtype)
        return dout, self.matmul(ones, dout).reshape(-1)


class Conv2dFast(nn.Conv2d):
    """A "valid" 2-D convolution with bias as matrix products: `nn.Conv2d(in_channels,
    out_channels, kernel_size, stride, pad_mode="valid", has_bias=True)`'s parameters (`weight`
    [out, in, kh, kw] and `bias` [out], the same names, initialisers and defaults), so
    checkpoints move between the two.

    `in_format` / `out_format` are the layouts of the input and the output: `NCHW` as
    `nn.Conv2d`, or `NHWC`, which `ConvStack` keeps between layers. Where the stride divides the
    kernel, the input is rearranged by space-to-depth (blocks of stride x stride pixels become
    channels: one `Reshape` and one `Transpose`), which turns the layer into a stride-1
    convolution with kh/sh x kw/sw taps; each tap is one `Slice` of it. `method` (`METHODS`) says
    how the taps meet the weight; the attribute holds the choice `auto` made, or stays `auto` where
    that depends on the batch (decided when each graph compiles).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, weight_init=None, bias_init=None, *,
                 method: str = "auto", in_format: str = "NCHW", out_format: str = "NCHW",
                 batch_invariant: bool = False):
        kernel_size, stride = _pair(kernel_size, "kernel_size"), _pair(stride, "stride")
        super().__init__(in_channels, out_channels, kernel_size, stride, pad_mode="valid", has_bias=True,
                         weight_init=weight_init, bias_init=bias_init)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        for name, fmt in (("in_format", in_format), ("out_format", out_format)):
            if fmt not in FORMATS:
                raise ValueError(f"{name} must be one of {FORMATS}, got {fmt!r}")
        if method == "auto" and (batch_invariant or choose_method(in_channels, kernel_size, stride) == choose_method(
                in_channels, kernel_size, stride, SPLIT_MIN_ROWS)):
            method = choose_method(in_channels, kernel_size, stride)  # one method at every batch size
        (kh, kw), (sh, sw) = kernel_size, stride
        if method in ("split", "concat") and (kh % sh or kw % sw):
            raise ValueError(f"method {method!r} needs the stride {stride} to divide the kernel {kernel_size} "
                             "(space-to-depth); use method='gather'")
        self.method, self.in_format, self.out_format = method, in_format, out_format
        self.taps = [(a, b) for a in range(kh // sh) for b in range(kw // sw)] if method != "gather" else []
        self.batch_invariant = batch_invariant
        self.matmul = ops.MatMul()
        self.matmul_nt = ops.MatMul(transpose_b=True)
        self.row_matmul = RowWiseMatMul()
        self.row_bias = RowBias()
        self.add_n = ops.AddN()

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(OH, OW) of an input of `height` x `width`."""
        self._check(self.in_channels, height, width)
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        return (height - kh) // sh + 1, (width - kw) // sw + 1

    def _check(self, channels: int, height: int, width: int) -> None:
        layout = "[B, C, H, W]" if self.in_format == "NCHW" else "[B, H, W, C]"
        if channels != self.in_channels:
            raise ValueError(f"Conv2dFast({self.in_channels}->{self.out_channels}, kernel {self.kernel_size}) got "
                             f"{channels} input channels (input {self.in_format} {layout} with C={channels}, "
                             f"H={height}, W={width}); expected {self.in_channels}")
        kh, kw = self.kernel_size
        if height < kh or width < kw:
            raise ValueError(f"Conv2dFast input {height}x{width} (H x W, {self.in_format}) is smaller than the "
                             f"kernel {kh}x{kw}")

    def construct(self, x):
        if self.in_format == "NCHW":
            channels, height, width = x.shape[1], x.shape[2], x.shape[3]
        else:
            height, width, channels = x.shape[1], x.shape[2], x.shape[3]
        self._check(channels, height, width)
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        oh, ow = (height - kh) // sh + 1, (width - kw) // sw + 1
        method = self.method
        if method == "auto":  # `split` or `concat` by the batch, when the graph is compiled
            batch = F.shape(x)[0]
            rows = batch * oh * ow if F.isconstant(batch) else 0
            method = "split" if rows >= SPLIT_MIN_ROWS else "concat"
        if method == "gather":
            y = self._gather(x, channels, height, width)
        else:
            y = self._taps(self._space_to_depth(x, oh, ow), oh, ow, method)
        y = self.row_bias(y, self.bias).reshape(-1, oh, ow, self.out_channels)
        if self.out_format == "NCHW":
            y = ops.transpose(y, (0, 3, 1, 2))
        return y

    def _space_to_depth(self, x, oh, ow):
        """[B, Hs, Ws, C*sh*sw] (stride-1 input of the tap convolution) from `x`, cropped to the
        rows and columns the output uses; channels in `_tap_weights`' order."""
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        used_h, used_w = (oh - 1) * sh + kh, (ow - 1) * sw + kw
        hs, ws, c = used_h // sh, used_w // sw, self.in_channels
        batch = x.shape[0]
        if self.in_format == "NCHW":
            if x.shape[2] != used_h or x.shape[3] != used_w:
                x = ops.slice(x, (0, 0, 0, 0), (batch, c, used_h, used_w))
            if sh == 1 and sw == 1:
                return ops.transpose(x, (0, 2, 3, 1))
            x = ops.transpose(x.reshape(-1, c, hs, sh, ws, sw), (0, 2, 4, 1, 3, 5))
        else:
            if x.shape[1] != used_h or x.shape[2] != used_w:
                x = ops.slice(x, (0, 0, 0, 0), (batch, used_h, used_w, c))
            if sh == 1 and sw == 1:
                return x
            x = ops.transpose(x.reshape(-1, hs, sh, ws, sw, c), (0, 1, 3, 2, 4, 5))
        return x.reshape(-1, hs, ws, c * sh * sw)

    def _tap_weights(self):
        """[T, C*sh*sw, O]: the weight of each tap (a, b) of the space-to-depth input, rows in its
        channel order ((c, i, j) from NCHW input, (i, j, c) from NHWC)."""
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        w = self.weight.reshape(self.out_channels, self.in_channels, kh // sh, sh, kw // sw, sw)
        order = (2, 4, 1, 3, 5, 0) if self.in_format == "NCHW" else (2, 4, 3, 5, 1, 0)
        return ops.transpose(w, order).reshape(len(self.taps), -1, self.out_channels)

    def _product(self, x, w):
        """x [M, K] @ w [K, N] (rows along the columns with `batch_invariant`)."""
        return self.row_matmul(x, w.T) if self.batch_invariant else self.matmul(x, w)

    def _taps(self, xs, oh, ow, method):
        """[B*OH*OW, O] before the bias, from the space-to-depth input `xs`."""
        batch, width = xs.shape[0], xs.shape[3]
        weights = self._tap_weights()
        windows = [ops.slice(xs, (0, a, b, 0), (batch, oh, ow, width)) for a, b in self.taps]
        if len(windows) == 1:
            return self._product(windows[0].reshape(-1, width), weights.reshape(width, -1))
        if method == "concat":
            columns = ops.concat(windows, 3).reshape(-1, len(windows) * width)
            return self._product(columns, weights.reshape(len(windows) * width, -1))
        parts = []
        for t, window in enumerate(windows):
            tap_weight = ops.slice(weights, (t, 0, 0), (1, width, self.out_channels)).reshape(width, -1)
            parts.append(self._product(window.reshape(-1, width), tap_weight))
        return self.add_n(parts)

    def _gather(self, x, channels, height, width):
        """[B*OH*OW, O] before the bias: im2col by one `Gather`, then one product. The indices are a
        constant of the compiled graph (the shape is known when it is compiled; the batch may be
        dynamic)."""
        kh, kw = self.kernel_size
        indices = Tensor(gather_indices(channels, (height, width), self.kernel_size, self.stride, self.in_format))
        columns = ops.gather(x.reshape(x.shape[0], -1), indices, 1).reshape(-1, channels * kh * kw)
        w = self.weight if self.in_format == "NCHW" else ops.transpose(self.weight, (0, 2, 3, 1))
        w = w.reshape(self.out_channels, -1)
        return self.row_matmul(columns, w) if self.batch_invariant else self.matmul_nt(columns, w)


def resolve_form(form: str) -> str:
    """`native` or `matmul` for `form` (`FORMS`): `auto` is `matmul` on the CPU (its `Conv2D` is
    oneDNN's reference kernel), `native` on Ascend and GPU."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if form != "auto":
        return form
    return "matmul" if ms.get_context("device_target") == "CPU" else "native"


def conv_layer(in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
               stride: int | Sequence[int] = 1, weight_init=None, bias_init=None, *, form: str = "auto",
               **fast_options) -> nn.Cell:
    """A "valid" convolution with bias on NCHW input: `Conv2dFast` (`form` `matmul`, with
    `fast_options`) or `nn.Conv2d(pad_mode="valid", has_bias=True)` (`native`); the same
    parameters either way. `auto` (`resolve_form`) chooses by the device target."""
    if resolve_form(form) == "native":
        return nn.Conv2d(in_channels, out_channels, kernel_size, stride, pad_mode="valid", has_bias=True,
                         weight_init=weight_init, bias_init=bias_init)
    return Conv2dFast(in_channels, out_channels, kernel_size, stride, weight_init, bias_init, **fast_options)


class InputMajorDense(nn.Cell):
    """x [B, in] @ weight [in, out] + bias: a dense layer whose weight is stored input-major, so
    the product needs no transpose flag (`nn.Dense` stores [out, in] and multiplies with
    `transpose_b`, ~2x slower at batch 8 on [8, 3136] x [3136, 512]: see
    docs/PERFORMANCE.md#convolutions). Initialised as `nn.Dense` (its defaults, or `weight_init` /
    `bias_init` drawn for the [out, in] weight and transposed)."""

    def __init__(self, in_dim: int, out_dim: int, weight_init=None, bias_init=None, batch_invariant: bool = False):
        super().__init__()
        weight = initializer(HeUniform(math.sqrt(5)) if weight_init is None else weight_init, [out_dim, in_dim],
                             ms.float32).init_data().asnumpy()
        bias_init = Uniform(1 / math.sqrt(in_dim)) if bias_init is None else bias_init
        self.weight = Parameter(Tensor(np.ascontiguousarray(weight.T)), name="weight")
        self.bias = Parameter(initializer(bias_init, [out_dim], ms.float32), name="bias")
        self.matmul = ops.MatMul()
        self.row_bias = RowBias()
        self.batch_invariant = batch_invariant
        self.row_matmul = RowWiseMatMul()

    def construct(self, x):
        y = self.row_matmul(x, self.weight.T) if self.batch_invariant else self.matmul(x, self.weight)
        return self.row_bias(y, self.bias)


class ConvStack(nn.Cell):
    """[B, C, H, W] (or [B, H, W, C] with `in_format` NHWC; `in_shape` is (C, H, W) either way) ->
    convolutions, each followed by ReLU -> flattened in (C, H, W) order as
    `nn.Flatten` after `nn.Conv2d` does, whichever form -> with `dense`, an `InputMajorDense` of
    that width and ReLU (Nature CNN's features) -> [B, out_dim].

    `layers` are (out_channels, kernel_size, stride) triples. With the `matmul` form the first
    layer reads `in_format` and every layer writes NHWC (the next reads it as it is); one `Transpose`
    before the flatten restores (C, H, W) order. Both forms have the same parameters.
    """

    def __init__(self, in_shape: Sequence[int], layers: Sequence[tuple[int, int, int]], form: str = "auto",
                 weight_init=None, bias_init=None, method: str = "auto", dense: int | None = None,
                 in_format: str = "NCHW", batch_invariant: bool = False):
        super().__init__()
        self.form = resolve_form(form)
        if batch_invariant and self.form == "native":
            raise ValueError("parity: strict with a conv encoder needs its CPU form (net.conv_form: matmul): "
                             "nn.Conv2d's rows depend on the batch")
        if in_format not in FORMATS:
            raise ValueError(f"in_format must be one of {FORMATS}, got {in_format!r}")
        # The native layer reads NCHW only: NHWC input is transposed first on that form.
        self.transpose_in = self.form == "native" and in_format == "NHWC"
        channels, height, width = in_shape
        convs = []
        for i, (out_channels, kernel_size, stride) in enumerate(layers):
            if self.form == "native":
                conv = conv_layer(channels, out_channels, kernel_size, stride, weight_init, bias_init, form="native")
                kh, kw = _pair(kernel_size, "kernel_size")
                sh, sw = _pair(stride, "stride")
                if height < kh or width < kw:
                    raise ValueError(f"ConvStack layer {i}: input {height}x{width} is smaller than the kernel {kh}x{kw}")
                height, width = (height - kh) // sh + 1, (width - kw) // sw + 1
            else:
                conv = Conv2dFast(channels, out_channels, kernel_size, stride, weight_init, bias_init,
                                  method=method if isinstance(method, str) else method[i],
                                  in_format=in_format if i == 0 else "NHWC", out_format="NHWC",
                                  batch_invariant=batch_invariant)
                height, width = conv.output_size(height, width)
            convs.append(conv)
            channels = out_channels
        self.convs = nn.CellList(convs)
        self.conv_shape = (channels, height, width)
        self.out_dim = channels * height * width
        self.dense = None
        if dense is not None:
            self.dense = InputMajorDense(self.out_dim, dense, weight_init, bias_init, batch_invariant)
            self.out_dim = dense

    def construct(self, x):
        if self.transpose_in:
            x = ops.transpose(x, (0, 3, 1, 2))
        for conv in self.convs:
            x = ops.relu(conv(x))
        if self.form == "matmul":
            x = ops.transpose(x, (0, 3, 1, 2))
        x = x.reshape(x.shape[0], -1)
        if self.dense is not None:
            x = ops.relu(self.dense(x))
        return x

"""Graph pieces written with the kernels MindSpore 2.10's CPU runtime runs fast.

- Slices as one `Slice` kernel (`ops.slice`), not `StridedSlice`, which Python slicing in a graph
  (`x[:, a:b]`, `x[:, i]`, `x[a:b]`) and `ops.split` compile to: see docs/PERFORMANCE.md#slices.
- Log softmax in element-wise kernels and reductions (this module's `LogSoftmax` Cell), not the
  `LogSoftmax` kernel `ops.log_softmax` compiles to: see docs/PERFORMANCE.md#log-softmax.
"""

from __future__ import annotations

from mindspore import nn, ops


def columns(x, start: int, stop: int):
    """`x[:, start:stop]` of a [B, C] tensor (B may be dynamic) as one `Slice` kernel.

    The size is B itself, not -1 ("to the end"): MindSpore's `SliceGrad` refuses a negative size."""
    return ops.slice(x, (0, start), (x.shape[0], stop - start))


def column(x, index: int):
    """`x[:, index]` of a [B, C] tensor: [B], one `Slice` kernel."""
    return ops.slice(x, (0, index), (x.shape[0], 1)).reshape(-1)


def rows(x, start: int, stop: int):
    """`x[start:stop]` along the first axis as one `Slice` kernel (`stop` within the axis)."""
    return ops.slice(x, (start,) + (0,) * (x.ndim - 1), (stop - start,) + x.shape[1:])


class LogSoftmax(nn.Cell):
    """log softmax over the last axis: logits - max - log1p(sum(exp(logits - max)) - 1), with its
    gradient written out (dx = dy - softmax * sum(dy): four kernels, against about ten that
    automatic differentiation makes of the forward formula).

    `Log1p`, not `Log`: MindSpore's CPU `Log` (and `Softplus`) kernel returns different last bits
    for the same input while its parallel launch searches for a thread split (about the first ten
    calls of a graph) whenever the size is not a multiple of 8; `Log1p` and `Exp` were bitwise
    stable, and the exported graph must compute what the learner computes bit for bit. Its error
    against float64 is below `ops.log_softmax`'s: docs/PERFORMANCE.md#log-softmax.
    """

    def construct(self, logits):
        shifted = logits - logits.max(-1, keepdims=True)
        return shifted - ops.log1p(ops.exp(shifted).sum(-1, keepdims=True) - 1.0)

    def bprop(self, logits, out, dout):
        return (dout - ops.exp(out) * dout.sum(-1, keepdims=True),)

"""Dense layers of the network module (`rlstack.network`): the MLP every head is built from, and
the `parity: strict` Dense whose output rows are bitwise independent of the batch."""

from __future__ import annotations

import math

from mindspore import nn, ops
from mindspore.common.initializer import Orthogonal, Zero

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU}


BLOCK_ROWS = 16
"""`parity: strict` runs every graph call on a whole number of blocks of this many rows: the
acting wrappers pad a batch with zero rows on the host (`rlstack.acting.Acting.run`; the
manifest records `batch_rows`) and the learner's minibatches are multiples of it (checked in
the config). Element-wise kernels (tanh, exp, log, softplus) round the last partial SIMD vector
of a tensor differently from the full ones; a tensor of whole 16-row blocks never has one on
AVX2 (8 floats) or AVX-512 (16 floats) kernels (docs/PERFORMANCE.md#strict-parity)."""


class RowWiseMatMul(nn.Cell):
    """x [B, K] @ w.T for w [N, K], computed as (w @ x.T).T: the batch runs along the columns.

    MindSpore's CPU MatMul splits the B rows of [B, K] x [K, N] into tiles whose boundaries depend
    on B, so a row's sums depend on the batch; with the batch as the column dimension of
    [N, K] x [K, B] every column is the same for every B that is a multiple of 16, at the plain
    product's cost (the alternatives tried: docs/PERFORMANCE.md#strict-parity).
    w @ x.T is one MatMul with `transpose_b` (bitwise the same invariance; a Transpose kernel of x
    per layer less), and the weight gradient dout.T @ x one with `transpose_a`. The backward pass is
    the ordinary matrix product (gradients need not be batch-invariant)."""

    def __init__(self):
        super().__init__()
        self.matmul_nt = ops.MatMul(transpose_b=True)
        self.matmul_tn = ops.MatMul(transpose_a=True)

    def construct(self, x, w):
        return self.matmul_nt(w, x).T

    def bprop(self, x, w, out, dout):
        return ops.matmul(dout, w), self.matmul_tn(dout, x)


class BatchInvariantDense(nn.Dense):
    """`parity: strict` Dense: the same parameters as `nn.Dense`, the product taken with the batch
    along the columns (`RowWiseMatMul`) so every output row is bitwise independent of the batch
    it is in (given whole `BLOCK_ROWS` blocks)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.row_matmul = RowWiseMatMul()

    def construct(self, x):
        return self.row_matmul(x, self.weight) + self.bias


def mlp_layers(in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str,
               ortho: bool, out_gain: float, batch_invariant: bool = False) -> list[nn.Cell]:
    """Dense layers with `activation` between them; orthogonal init as in SB3/CleanRL, or without
    `ortho` MindSpore's `nn.Dense` default, which is PyTorch's `nn.Linear` default (weights
    HeUniform(sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases the same range): what SB3 uses
    with `ortho_init=False`, as the conv encoders do.

    `batch_invariant` builds the `parity: strict` variant (same parameters, same names).
    """
    dense = BatchInvariantDense if batch_invariant else nn.Dense
    layers: list[nn.Cell] = []
    sizes = [in_dim, *hidden]
    bias = Zero() if ortho else None
    for fan_in, fan_out in zip(sizes, sizes[1:], strict=False):
        init = Orthogonal(gain=math.sqrt(2.0)) if ortho else None
        layers += [dense(fan_in, fan_out, weight_init=init, bias_init=bias), _ACTIVATIONS[activation]()]
    init = Orthogonal(gain=out_gain) if ortho else None
    layers.append(dense(sizes[-1], out_dim, weight_init=init, bias_init=bias))
    return layers


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str,
        ortho: bool, out_gain: float, batch_invariant: bool = False) -> nn.SequentialCell:
    """`mlp_layers` as one Cell."""
    return nn.SequentialCell(mlp_layers(in_dim, hidden, out_dim, activation, ortho, out_gain, batch_invariant))

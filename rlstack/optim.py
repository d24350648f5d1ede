"""Gradient clipping for the update graphs, written in few kernels
(docs/DESIGN.md#the-100-kernel-line)."""

from __future__ import annotations

from collections.abc import Sequence

from mindspore import Tensor, ops

from rlstack.kernels import rows


def flatten(tensors: Sequence[Tensor]) -> Tensor:
    """The tensors' elements in one vector (one Concat kernel: the reshapes launch nothing)."""
    return ops.concat([t.reshape(-1) for t in tensors])


def unflatten(flat: Tensor, shapes: Sequence[tuple[int, ...]]) -> tuple:
    """`flatten`'s inverse: one `Slice` kernel per shape (`rlstack.kernels`)."""
    parts, start = [], 0
    for shape in shapes:
        size = 1
        for dim in shape:
            size *= dim
        parts.append(rows(flat, start, start + size).reshape(shape))
        start += size
    return tuple(parts)


def clip_coef(flats: Sequence[Tensor], max_norm: float) -> Tensor:
    """min(1, max_norm / (global L2 norm + 1e-6)) of the gradients held in the `flats` vectors,
    as torch's `clip_grad_norm_` (which Stable-Baselines3 uses)."""
    squared = (flats[0] * flats[0]).sum()
    for flat in flats[1:]:
        squared = squared + (flat * flat).sum()
    return ops.minimum(max_norm / (ops.sqrt(squared) + 1e-6), 1.0)


def clip_by_global_norm(grads: tuple, max_norm: float) -> tuple:
    """`grads` scaled by `clip_coef` of all of them.

    The norm is taken over the gradients concatenated once (three kernels), then one scale
    kernel per tensor: `ops.clip_by_global_norm` launches about four times as many on the CPU,
    and every kernel over the runtime's 100-kernel single-thread limit slows the whole step.
    """
    coef = clip_coef((flatten(grads),), max_norm)
    return tuple(g * coef for g in grads)

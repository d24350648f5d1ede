"""Gradient clipping for the update graphs, written in few kernels (DESIGN: the 100-kernel line)."""

from __future__ import annotations

from mindspore import ops


def clip_by_global_norm(grads: tuple, max_norm: float) -> tuple:
    """`grads` scaled by min(1, max_norm / (global L2 norm + 1e-6)), as torch's `clip_grad_norm_`
    (which Stable-Baselines3 uses).

    Two kernels per tensor for the norm, four for the coefficient, one per tensor for the scale:
    `ops.clip_by_global_norm` launches about twice as many on the CPU (measured: a DQN gradient
    step of 114 kernels with it, 104 with this), and every kernel over the runtime's
    100-kernel single-thread limit slows the whole step.
    """
    squared = ops.addn([(g * g).sum() for g in grads])
    coef = ops.minimum(max_norm / (ops.sqrt(squared) + 1e-6), 1.0)
    return tuple(g * coef for g in grads)

"""Hyperparameter schedules written as RL Baselines3 Zoo does: `3e-4` (constant) or `lin_3e-4`."""

from __future__ import annotations

from collections.abc import Callable


def parse_schedule(value: str | float, key: str = "value") -> Callable[[float], float]:
    """Return f(progress_remaining) -> value, progress_remaining going from 1 to 0.

    `lin_X` decays linearly from X to 0 (Zoo's `linear_schedule`); a plain number is constant.
    """
    text = str(value).strip()
    try:
        if text.startswith("lin_"):
            start = float(text[4:])
            return lambda progress_remaining: progress_remaining * start
        constant = float(text)
    except ValueError:
        raise ValueError(f"'{key}' is {value!r}: expected a number (3e-4) or a linear schedule (lin_3e-4)") from None
    return lambda progress_remaining: constant

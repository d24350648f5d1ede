"""The lean graph call: a compiled graph without side effects run with the least per-call work;
every exported-graph call goes through it (`rlstack.acting.Acting.run`), and PPO's gradient graphs."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def _graph_executor() -> Any:
    """MindSpore's graph executor (an internal API of MindSpore 2.10), or None where it is absent."""
    try:
        from mindspore.graph.api import _cell_graph_executor
    except ImportError:
        return None
    return getattr(_cell_graph_executor, "_graph_executor", None)


def _same(a: Any, b: Any) -> bool:
    """Outputs (a tensor, or nested tuples of tensors) equal bit for bit."""
    if isinstance(a, tuple | list) or isinstance(b, tuple | list):
        return (isinstance(a, tuple | list) and isinstance(b, tuple | list) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b, strict=True)))
    return np.array_equal(a.asnumpy(), b.asnumpy())


class LeanCall:
    """`LeanCall(cell)(*tensors)` returns what `cell(*tensors)` returns, with less Python per call.

    `Cell.__call__` (and `nn.GraphCell`'s) rebuilds the graph's compile-cache key from the
    arguments on every call: measured 435 us for a 2x64 forward against 140 us when the compiled
    phase is run directly (DESIGN: the call). The first call of each input signature (shapes and
    dtypes) goes through the public call, which compiles it; later calls run that compiled phase
    through MindSpore's graph executor. The first direct run of each signature is compared
    bitwise with the public call's outputs on the same inputs; if the internal API is missing,
    fails or differs, every later call takes the public path. Only for graphs without side
    effects: the check runs the graph twice.
    """

    def __init__(self, cell: Any):
        self.cell = cell
        self._run = _graph_executor()
        self.direct = self._run is not None
        self._phases: dict[tuple, str] = {}

    def __call__(self, *args: Any) -> Any:
        if not self.direct:
            return self.cell(*args)
        key = tuple((a.shape, a.dtype) for a in args)
        phase = self._phases.get(key)
        if phase is not None:
            return self._run(args, phase)
        out = self.cell(*args)  # compiles this signature
        phase = getattr(self.cell, "compile_phase", None)
        try:
            same = phase is not None and _same(out, self._run(args, phase))
        except Exception as err:  # an internal API: any failure means the public path
            log.warning("lean graph call unavailable (%s); using Cell.__call__", err)
            same = False
        if same:
            self._phases[key] = phase
        else:
            self.direct = False
        return out

"""The lean graph call: a compiled graph run with the least per-call work; every exported-graph
call goes through it (`rlstack.acting.Acting.run`), and the algorithms' update graphs. Also
`ParameterCopy`, the weight refresh of a graph that follows a live network in the same process,
`ParameterWrite`, the host's write of scheduled hyperparameters, `host_tensors`, the host arrays a
graph reads, and `to_numpy`, the read of a graph's output."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

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


SMALL_OUTPUT = 256
"""Elements up to which `to_numpy` reads a graph output through `Tensor.tolist`."""

_NUMPY_TYPES: dict[Any, Any] = {}


def host_tensors(*arrays: np.ndarray) -> tuple[Tensor, ...]:
    """Graph inputs over host arrays without a copy (each made C-contiguous first if it is not):
    the graph reads them in place, where `Tensor(array)` copies (~25 us each,
    docs/PERFORMANCE.md#mujoco). The arrays must stay unchanged until the call returns."""
    return tuple(Tensor.from_numpy(np.ascontiguousarray(a)) for a in arrays)


def to_numpy(x: Tensor) -> np.ndarray:
    """A graph output as a numpy array, the cheaper way for its size.

    `Tensor.tolist` reads a small output faster than `asnumpy`, which costs the same at any size:
    see docs/PERFORMANCE.md#reading-outputs (`python -m rlstack.bench runtime` times both). Acting
    outputs and per-step metrics are small. Both give the same values bit for bit (float32 ->
    float -> float32 is exact). Larger outputs keep `asnumpy` (a view of the output's memory, no
    copy).
    """
    if x.size > SMALL_OUTPUT:
        return x.asnumpy()
    dtype = _NUMPY_TYPES.get(x.dtype)
    if dtype is None:  # once per dtype: the first output of a dtype is read whole
        array = x.asnumpy()
        _NUMPY_TYPES[x.dtype] = array.dtype
        return array
    return np.array(x.tolist(), dtype)


ASSIGN_CHUNK = 64
"""Parameters written back per assign graph (one kernel each: under the 100-kernel line)."""


class _Assign(nn.Cell):
    """Writes values into parameters from inside a compiled graph, where the graphs that update
    those parameters read them (restoring the state a side-effect check ran from)."""

    def __init__(self, params: Sequence[Parameter]):
        super().__init__()
        self.params = list(params)

    def construct(self, *values):
        for i in range(len(self.params)):  # (graph syntax: no zip(strict=))
            ops.assign(self.params[i], values[i])
        return values[0]


def _chunks(items: Sequence[Any]) -> list[list[Any]]:
    """`items` in consecutive runs of `ASSIGN_CHUNK`: one run per assign graph."""
    items = list(items)
    return [items[i:i + ASSIGN_CHUNK] for i in range(0, len(items), ASSIGN_CHUNK)]


def _assign_graphs(params: Sequence[Parameter]) -> list[_Assign]:
    """Assign graphs writing `params`, `ASSIGN_CHUNK` parameters each, in order."""
    return [_Assign(chunk) for chunk in _chunks(params)]


def written_by(cell: Any) -> list[Parameter]:
    """The `state` of a graph with side effects: every parameter it holds (one it only reads,
    such as a learning rate the host sets, is snapshot and compared too, at no harm)."""
    return list(cell.get_parameters())


class LeanCall:
    """`LeanCall(cell)(*tensors)` returns what `cell(*tensors)` returns, with less Python per call.

    `Cell.__call__` (and `nn.GraphCell`'s) rebuilds the graph's compile-cache key from the
    arguments on every call, which costs more than running the compiled phase directly
    (docs/DESIGN.md#the-call, docs/PERFORMANCE.md#the-call). The first call of each input
    signature (shapes and dtypes) goes through the public call, which compiles it; later calls run
    that compiled phase through MindSpore's graph executor. The first direct run of each signature
    is compared bitwise with the public call's outputs on the same inputs; if the internal API is
    missing, fails or differs, every later call takes the public path.

    A graph with side effects (an optimizer step) names the parameters it writes in `state`. The
    check then runs it from the same state twice: the public call, the state it left, that
    state's predecessor written back by an assign graph, the direct run; outputs and every
    parameter written must agree bitwise. A failed check leaves the public call's state.
    """

    def __init__(self, cell: Any, state: Sequence[Parameter] = ()):
        self.cell = cell
        self.state = list(state)
        self._run = _graph_executor()
        self.direct = self._run is not None
        self._phases: dict[tuple, str] = {}
        self._assign: list[_Assign] = []

    def __call__(self, *args: Any) -> Any:
        if not self.direct:
            return self.cell(*args)
        key = tuple((a.shape, a.dtype) for a in args)
        phase = self._phases.get(key)
        if phase is not None:
            return self._run(args, phase)
        before = self._snapshot()
        out = self.cell(*args)  # compiles this signature
        after = self._snapshot()
        phase = getattr(self.cell, "compile_phase", None)
        try:
            self._write(before)
            same = (phase is not None and _same(out, self._run(args, phase))
                    and all(np.array_equal(a, b) for a, b in zip(after, self._snapshot(), strict=True)))
        except Exception as err:  # an internal API: any failure means the public path
            log.warning("lean graph call unavailable (%s); using Cell.__call__", err)
            same = False
        if same:
            self._phases[key] = phase
        else:
            self._write(after)
            self.direct = False
        return out

    def _snapshot(self) -> list[np.ndarray]:
        return [p.asnumpy().copy() for p in self.state]

    def _write(self, values: list[np.ndarray]) -> None:
        if not self._assign:
            # An assign graph of exactly the state (`ParameterCopy`, `ParameterWrite`) restores it
            # itself: a second assign graph of the same parameters would be one more compile.
            own = isinstance(self.cell, _Assign) and len(self.cell.params) == len(self.state) and all(
                a is b for a, b in zip(self.cell.params, self.state, strict=True))
            self._assign = [self.cell] if own else _assign_graphs(self.state)
        for assign, chunk in zip(self._assign, _chunks(values), strict=True):
            assign(*(Tensor(v) for v in chunk))


class ParameterWrite:
    """`write(*values)` sets `params` (numbers or arrays, in order) from inside a compiled assign
    graph run through `LeanCall`, where `Parameter.set_data` would replace their memory.

    After a `set_data`, the next run of every graph that reads the parameter pays for it; after an
    assign graph wrote it, none does (docs/PERFORMANCE.md#parameter-writes). Schedules that change
    every update (`lin_X`) write through this."""

    def __init__(self, params: Sequence[Parameter]):
        if not 0 < len(params) <= ASSIGN_CHUNK:
            raise ValueError(f"1 to {ASSIGN_CHUNK} parameters per write, got {len(params)}")
        self.params = list(params)
        self._types = [p.asnumpy().dtype for p in self.params]
        self._call = LeanCall(_Assign(self.params), state=self.params)

    def __call__(self, *values: Any) -> None:
        if len(values) != len(self.params):
            raise ValueError(f"{len(self.params)} parameters but {len(values)} values")
        # (from_numpy: an array of the parameter's dtype is fed without a copy)
        self._call(*(Tensor.from_numpy(np.asarray(v, t)) for v, t in zip(values, self._types, strict=True)))


class ParameterCopy:
    """`copy()` writes the current values of `sources` into `targets` (parameters of the same
    shapes, e.g. a loaded acting graph's and the live network's) with `ParameterWrite`s of
    `ASSIGN_CHUNK` targets each: the sources are fed as graph inputs (their `asnumpy`),
    without the private copies and `set_data` of `Acting.load_weights`, which refresh slower
    (docs/PERFORMANCE.md#parameter-copy)."""

    def __init__(self, targets: Sequence[Parameter], sources: Sequence[Parameter]):
        if len(targets) != len(sources):
            raise ValueError(f"{len(targets)} targets but {len(sources)} sources")
        self._writes = [ParameterWrite(chunk) for chunk in _chunks(targets)]
        self._sources = _chunks(sources)  # the sources each write's assign graph reads, in its order

    def __call__(self) -> None:
        for write, sources in zip(self._writes, self._sources, strict=True):
            # (arrays, not the Parameters themselves: a graph may not hold two parameters of one name)
            write(*(p.asnumpy() for p in sources))

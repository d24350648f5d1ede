"""MindSpore process setup: graph mode, device target, graph-kernel fusion (docs/DESIGN.md,
contract 5) and the denormal mode of the process's threads."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import io
import logging
import platform
import struct
from dataclasses import dataclass

import mindspore as ms
import numpy as np

from rlstack.errors import RlstackError

_DEVICE_TARGETS = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}


class DeviceError(RlstackError, RuntimeError):
    """The configured device or fusion setting cannot be used on this machine."""


@dataclass(frozen=True)
class Runtime:
    device: str
    """`cpu`, `gpu` or `ascend`."""
    fusion: bool
    """Whether graph-kernel fusion is enabled (resolved from `auto`)."""
    denormals_flushed: bool = True
    """Whether this process's threads flush denormal floats as MindSpore's CPU kernel threads do
    (`flush_denormals`); False where that could not be set, so a resume from optimizer state that
    holds denormals may differ in the last bits."""


def device_available(device: str) -> bool:
    """True when this MindSpore install can run on `device` (probing never raises)."""
    target = _DEVICE_TARGETS[device]
    if target == "CPU":
        return True
    # MindSpore prints plugin-loading noise while probing; keep the console clean.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return bool(ms.hal.is_available(target))
        except Exception:  # a failed probe means "not usable", whatever the reason
            return False


def resolve_fusion(device: str, fusion: str) -> bool:
    """`auto` means on for Ascend/GPU and off on CPU; `on` on CPU is an error, not a compiler crash."""
    if fusion == "off":
        return False
    if device == "cpu":
        if fusion == "on":
            raise DeviceError("graph-kernel fusion needs the Ascend or GPU backend; "
                              "device is 'cpu' (use fusion: auto or off)")
        return False
    return True


def configure(device: str = "cpu", fusion: str = "auto") -> Runtime:
    """Put MindSpore in graph mode on `device`; call once per process before building networks."""
    if device not in _DEVICE_TARGETS:
        raise DeviceError(f"device '{device}' is unknown; valid: {', '.join(_DEVICE_TARGETS)}")
    use_fusion = resolve_fusion(device, fusion)
    if not device_available(device):
        raise DeviceError(f"device '{device}' is not usable: this MindSpore {ms.__version__} install "
                          f"has no working {_DEVICE_TARGETS[device]} backend "
                          "(run `python -m rlstack.doctor` for details, or set device: cpu)")
    # PyNative costs far more per call (docs/PERFORMANCE.md#pynative): always compiled graphs.
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ms.set_device(_DEVICE_TARGETS[device])
    except RuntimeError:
        # A data-parallel worker (rlstack/distributed.py) configures before
        # `mindspore.communication.init()`, which then fixes the device with a per-rank id; setting
        # it again raises "can not be modified" even for the same target.
        if ms.get_current_device().device_target != _DEVICE_TARGETS[device]:
            raise
    if use_fusion:
        ms.set_context(enable_graph_kernel=True)
    flushed = flush_denormals()
    _quiet_known_deprecations()
    _freeze_imports()
    return Runtime(device=device, fusion=use_fusion, denormals_flushed=flushed)


_MXCSR_OFFSET = 28
"""Where glibc's x86-64 `fenv_t` (32 bytes) holds the SSE control register MXCSR."""
_FTZ_DAZ = 0x8040
"""MXCSR's flush-to-zero (results) and denormals-are-zero (inputs) bits."""


def flush_denormals(flush: bool = True) -> bool:
    """Flush denormal floats to zero in the calling thread and the threads it starts from now on
    (`flush=False`: IEEE denormals again, for code that needs them, e.g. Hypothesis's floats).

    On x86-64 MindSpore's CPU runtime sets flush-to-zero and denormals-are-zero in its own kernel
    threads, while a small graph in single-thread mode runs its kernels in the thread that calls it,
    and the first calls of a graph run on the kernel threads. Without the same mode here, a value
    that turns denormal (Adam's `beta1_power` after ~830 steps, a moment of a quiet weight) is kept
    or flushed depending on which thread runs the kernel: a resumed run, whose first calls of each
    graph meet such state, then diverges from the run not stopped (docs/DESIGN.md#denormals). Set
    through glibc's `fegetenv`/`fesetenv` and checked with a numpy product; returns False (and
    changes nothing) where that is not possible. On other CPUs MindSpore sets no such mode and
    neither does this: True.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    libm_name = ctypes.util.find_library("m")
    try:
        libm = ctypes.CDLL(libm_name)
    except OSError:
        return False
    np.finfo(np.float16), np.finfo(np.float32), np.finfo(np.float64)  # cached before the mode: computed under it, numpy warns
    env, saved = (ctypes.c_uint8 * 32)(), (ctypes.c_uint8 * 32)()
    if libm.fegetenv(env) != 0 or libm.fegetenv(saved) != 0:
        return False
    (mxcsr,) = struct.unpack_from("<I", env, _MXCSR_OFFSET)
    struct.pack_into("<I", env, _MXCSR_OFFSET, mxcsr | _FTZ_DAZ if flush else mxcsr & ~_FTZ_DAZ)
    if libm.fesetenv(env) != 0:
        return False
    smallest = np.array([1], np.uint32).view(np.float32)  # a denormal input
    if ((smallest * np.float32(1.0))[0] == 0) == flush and (np.float32(1e-30) * np.float32(1e-10) == 0) == flush:
        return True
    libm.fesetenv(saved)  # not glibc's layout after all: leave the thread as it was
    return False


_frozen = False


def _freeze_imports() -> None:
    """Move the objects alive now (the imported modules', MindSpore's among them) out of the
    cyclic garbage collector's reach, once per process. MindSpore runs `gc.collect()` before
    every graph compilation and Python's own full collections run during training and serving;
    each traversed all of them (docs/PERFORMANCE.md#gc-freeze). Later objects (networks, trainers)
    stay collectable."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


_HARMLESS = ("'FusedSparseAdam' is deprecated",)
"""MindSpore warnings every run would print that say nothing about the user's run: `nn.Adam`
builds a sparse variant (FusedSparseAdam) it never uses on dense gradients, and warns about it."""


class _DropHarmless(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in _HARMLESS)


def _quiet_known_deprecations() -> None:
    """Drop `_HARMLESS` from MindSpore's logger; every other MindSpore warning still shows. The
    logger is reached through an internal function: when it is missing, nothing is filtered."""
    try:
        logger = ms.log._get_logger()
    except Exception:  # an internal API of MindSpore 2.10
        return
    if not any(isinstance(f, _DropHarmless) for f in logger.filters):
        logger.addFilter(_DropHarmless())

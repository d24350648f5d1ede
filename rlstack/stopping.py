"""Graceful stop: SIGINT / SIGTERM ask the learner to stop after the current update."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While active (a context manager), the first SIGINT or SIGTERM is recorded in `received`
    (and `notify` is told); a second one restores the previous handlers and aborts at once with
    KeyboardInterrupt. Only in the main thread (Python's rule); elsewhere it does nothing.

    MindSpore's runtime installs its own SIGINT handler when it runs a graph and turns a Ctrl-C
    that arrives meanwhile into SIGTERM, so the learner calls `arm()` again after every update
    and a Ctrl-C may be reported (and exit) as SIGTERM; the stop is graceful either way.

    `agree` (data-parallel learners, `rlstack/distributed.py`): a signal is only `pending` until
    the next `arm()`, which every rank calls once per update; `received` is then what `agree`
    returns for all ranks together, so every rank stops after the same update (a rank that stopped
    alone would leave the others waiting in the gradient all-reduce).
    """

    def __init__(self, notify: Callable[[str], None], agree: Callable[[int | None], int | None] | None = None):
        self.notify = notify
        self.agree = agree
        self.received: int | None = None
        self.pending: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
            self.arm()
        return self

    def arm(self) -> None:
        if self.agree is not None:
            self.received = self.agree(self.pending)
        for sig in self._previous:
            signal.signal(sig, self._on_signal)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    @property
    def name(self) -> str | None:
        return signal.Signals(self.received).name if self.received is not None else None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.pending is not None:
            self.__exit__()
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: aborted")
        self.pending = signum
        if self.agree is None:
            self.received = signum
        self.notify(f"{signal.Signals(signum).name}: stopping after the current update "
                    "(a checkpoint and an export follow; send it again to abort at once)")

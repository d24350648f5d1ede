"""The base of every error rlstack raises on purpose (a refused config, artifact, checkpoint,
device or environment): a CLI catches `RlstackError`, prints its message and exits 2, where any
other exception is a bug and keeps its traceback."""

from __future__ import annotations


class RlstackError(Exception):
    """An error whose message says what is wrong and how to go on; no traceback needed."""


class IllegalMoveError(RlstackError, ValueError):
    """A move that a game's rules do not allow (occupied cell, full column, finished game, out of range)."""

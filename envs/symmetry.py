"""A board's symmetries as permutations of a game's flat observation and of its moves, for training
on every position in a random symmetry (`train.augment`, algorithms/alphazero.py).

The flat observation is the board's planes in PettingZoo's layout ([rows, cols, channels], raveled)
and then the legal-move mask; a move is a cell (row-major), or a column (games with gravity), and
moves after those (e.g. Othello's pass) stay where they are under every symmetry.
"""

from __future__ import annotations

import numpy as np


def grid_symmetries(rows: int, cols: int, channels: int, *, columns: bool = False, square: bool = True,
                    extra_moves: int = 0, half_turn: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The permutations [K, rows*cols*channels + n_moves] of the flat observation and [K, n_moves]
    of the moves, the identity first: the transformed position's entry j is the original's entry
    `perm[j]`. The mirror image always; with `square` and no `columns` also the vertical flips, and
    on a square board the transposes (the 8 symmetries of the square). `columns`: a move is a
    column (gravity rules out all but the mirror image). `half_turn`: the half turn alone, under
    which channel c shows what the original's channel `half_turn[c]` showed (Hex: a group's north
    and south edges swap, and its east and west)."""
    grid = np.arange(rows * cols).reshape(rows, cols)
    maps = [grid, grid[:, ::-1]]
    if half_turn is not None:
        maps = [grid, grid[::-1, ::-1]]
    elif square and not columns:
        maps += [grid[::-1], grid[::-1, ::-1]]
        if rows == cols:
            maps += [m.T for m in maps]
    cells = np.stack([m.ravel() for m in maps])  # [K, n_cells]
    moves = cells[:, :cols] if columns else cells  # a column is its top cell's column
    if extra_moves:
        moves = np.concatenate([moves, np.broadcast_to(moves.shape[1] + np.arange(extra_moves),
                                                       (len(moves), extra_moves))], 1)
    same = np.arange(channels)
    channel_of = np.stack([same, np.asarray(half_turn)] if half_turn is not None else [same] * len(maps))
    planes = (channels * cells[:, :, None] + channel_of[:, None, :]).reshape(len(cells), -1)
    obs = np.concatenate([planes, channels * rows * cols + moves], 1)
    obs.flags.writeable = moves.flags.writeable = False
    return obs, moves

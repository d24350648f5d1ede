"""A built-in minimax player for the two-player games (evaluation opponents and tests).

Negamax to a configurable depth, with one scoring and two searches that agree move for move.
Terminal scores are exact: a win is `WIN - ply` (sooner is better), a loss its negation, a draw 0.
At the depth limit a non-terminal position is scored by a symmetric, zero-sum heuristic (so
negamax stays sound): over every line of `connect` cells, a line holding only the mover's pieces
scores +weight[count], only the opponent's -weight[count], mixed lines 0; plus a small bonus for
pieces in the centre column (Connect Four). Its magnitude stays far below `WIN - max_ply`, so a
proven win or loss always outranks any heuristic value.

- `act` (many games per call, as evaluation matches ask) searches the positions it has not met
  before all at once, each once, in numpy: full width, every legal move at every ply, as one
  array of boards per ply. A board is its lines (how many of each side's pieces every line
  holds, one small code per line), so a move's win and heuristic change are read from the lines
  through its cell, and the last ply's boards are never built: their heuristic is the parent's
  plus that change.
- When the batch's leaves (about legal_moves ** depth per position) exceed `leaf_budget`, and for
  `choose` / `best_moves` / `value`, it is negamax with alpha-beta pruning on Python-int
  bitboards (bit = row-major cell index), one position at a time. Both fill one cache of each
  position's best moves.

Alpha-beta with the root's window gives every best move its exact value, so both searches give
the same set of best moves, listed in the same (centre-first) order; among them the player picks
uniformly with its seeded generator, so the same seed plays the same games either way, and a
perfect player still varies its games. With `depth >= n_cells` the search reaches the end of
every line, i.e. perfect play; on tic-tac-toe the cached alpha-beta does that in a few thousand
nodes per move.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rlstack.envs.games import GameSpec, game_spec

WIN = 1_000_000
WEIGHTS = {1: 1, 2: 4, 3: 16}
"""Heuristic weight of a line holding only one side's pieces, by piece count (connect - 1 at most)."""
CENTRE_BONUS = 3
NO_MOVE = -WIN - 1
"""`move_values` of an illegal move: below every real value (the worst, a loss at ply 2, is -(WIN - 2))."""
LEAF_BUDGET = 3_000_000
"""`act` searches a batch in numpy when its leaves (sum over positions of legal_moves ** depth)
are at most this many, else with the per-position alpha-beta. Connect Four depth 5 on 200 games
fits (2.9M). The budget bounds a call's time and memory; within it the batched search beats
alpha-beta on Connect Four (docs/PERFORMANCE.md#minimax)."""
_CACHE_LIMIT = 200_000
_COMPLETES = 1 << 20  # far above any sum of heuristic gains over the lines through one cell


class Minimax:
    """Negamax player of `depth` plies for a GameSpec; `choose` one position, `act` a batch.

    `leaf_budget`: the most leaves `act` searches in numpy in one call (`LEAF_BUDGET`); 0 makes
    it search one position at a time with alpha-beta.
    """

    def __init__(self, game: str | GameSpec, depth: int, seed: int | None = None,
                 leaf_budget: int = LEAF_BUDGET):
        self.spec = game_spec(game)
        if depth < 1:
            raise ValueError(f"minimax depth must be >= 1, got {depth}")
        self.depth = depth
        self.leaf_budget = leaf_budget
        self.name = f"minimax_d{depth}"
        self.rng = np.random.default_rng(seed)
        spec = self.spec
        self.windows = [int(sum(1 << int(c) for c in np.flatnonzero(w))) for w in spec.windows()]
        # Lines through each cell: after a move only these can have become complete.
        self.windows_of = [[w for w in self.windows if w >> cell & 1] for cell in range(spec.n_cells)]
        if spec.gravity:
            # Columns centre-first: the classic move ordering that makes alpha-beta prune well.
            self.order = sorted(range(spec.cols), key=lambda c: (abs(c - (spec.cols - 1) / 2), c))
            self.column_cells = [[r * spec.cols + c for r in reversed(range(spec.rows))] for c in range(spec.cols)]
            centre = spec.cols // 2
            self.centre_mask = sum(1 << (r * spec.cols + centre) for r in range(spec.rows)) if spec.cols % 2 else 0
        else:
            rc, cc = (spec.rows - 1) / 2, (spec.cols - 1) / 2
            self.order = sorted(range(spec.n_cells),
                                key=lambda x: (abs(x // spec.cols - rc) + abs(x % spec.cols - cc), x))
            self.centre_mask = 0
        self._cache: dict[tuple[int, int], list[int]] = {}
        self.nodes = 0
        self.lines = _LineTables(spec)

    # ----- public ----------------------------------------------------------------------------

    def best_moves(self, me: int, opp: int) -> list[int]:
        """All actions with the best minimax value for the player to move (bitboards `me`, `opp`)."""
        key = (me, opp)
        if key not in self._cache:
            self._remember(key, self._root(me, opp))
        return self._cache[key]

    def value(self, me: int, opp: int) -> int:
        """Minimax value of the position for the player to move (to `depth` plies)."""
        return self._negamax(me, opp, self.depth, -WIN - 1, WIN + 1, 0)

    def choose(self, planes: np.ndarray, rng: np.random.Generator | None = None) -> int:
        """One move for the player to move in mover-perspective planes [rows, cols, 2]."""
        me, opp = planes_to_bits(planes)
        if (me | opp) == (1 << self.spec.n_cells) - 1 or not self._moves(me, opp):
            raise ValueError(f"{self.spec.name}: no legal move in this position")
        moves = self.best_moves(me, opp)
        return int((rng or self.rng).choice(moves))

    def act(self, obs: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Players' interface: flat observations [n, D] (planes then mask) -> actions [n] int64.

        The same moves as `choose` on each position in turn (same best moves, same draws from the
        generator); positions not in the cache are searched together (see the module docstring).
        """
        spec = self.spec
        obs = np.asarray(obs, np.float32)
        stones = obs[:, :2 * spec.n_cells].reshape(len(obs), spec.n_cells, 2) > 0.5
        me, opp = stones[..., 0], stones[..., 1]
        if (me | opp).all(1).any():
            raise ValueError(f"{spec.name}: no legal move in this position")
        keys = list(zip(_to_ints(me), _to_ints(opp), strict=True))
        moves = {key: self._cache[key] for key in keys if key in self._cache}
        first: dict[tuple[int, int], int] = {}  # each new position once
        for i, key in enumerate(keys):
            if key not in moves:
                first.setdefault(key, i)
        rows = np.fromiter(first.values(), np.int64, len(first))
        # A position with a completed line (a finished game) is left to alpha-beta, which answers
        # it as it always has.
        rows = rows[~(self.lines.has_line(me[rows]) | self.lines.has_line(opp[rows]))]
        if len(rows) and self._leaves(me[rows], opp[rows]) <= self.leaf_budget:
            best = self.best_move_mask(me[rows], opp[rows])
            for i, row in zip(rows.tolist(), best, strict=True):
                moves[keys[i]] = [a for a in self.order if row[a]]  # search order, as `_root` lists them
                self._remember(keys[i], moves[keys[i]])
        for key in first:
            if key not in moves:
                moves[key] = self.best_moves(*key)
        return np.array([(rng or self.rng).choice(moves[key]) for key in keys], np.int64)

    def move_values(self, me: np.ndarray, opp: np.ndarray) -> np.ndarray:
        """Negamax value of every move, to `depth` plies, for many positions at once (numpy).

        `me`, `opp`: bool [n, n_cells], the mover's and the opponent's pieces of games in progress
        (a legal move and no completed line). Returns [n, n_actions] int64, from the mover's side
        and with plies counted from this position (a win now is `WIN - 1`), so the best of a row
        is `value` of its position; `NO_MOVE` for an illegal move.
        """
        me, opp = np.asarray(me, bool), np.asarray(opp, bool)
        if (me | opp).all(1).any() or self.lines.has_line(me).any() or self.lines.has_line(opp).any():
            raise ValueError(f"{self.spec.name}: move_values needs games in progress (a legal move, no finished line)")
        return self._full_width(me, opp)

    def best_move_mask(self, me: np.ndarray, opp: np.ndarray) -> np.ndarray:
        """[n, n_actions] bool: the moves of best `move_values`, the same set as `best_moves`."""
        values = self.move_values(me, opp)
        return values == values.max(1, keepdims=True)

    # ----- search ------------------------------------------------------------------------------

    def _remember(self, key: tuple[int, int], moves: list[int]) -> None:
        if len(self._cache) > _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = moves

    def _leaves(self, me: np.ndarray, opp: np.ndarray) -> float:
        """Leaves of a full-width search of these positions, roughly: legal ** plies, summed.

        It overcounts deep tic-tac-toe searches (cells fill up), which is where alpha-beta, its
        exact end scores cutting most of the tree, is the faster search
        (docs/PERFORMANCE.md#minimax).
        """
        spec = self.spec
        occupied = me | opp
        empty = spec.n_cells - occupied.sum(1)
        legal = (~occupied).reshape(len(me), spec.rows, spec.cols).any(1).sum(1) if spec.gravity else empty
        return float((legal.astype(np.float64) ** np.minimum(self.depth, empty)).sum())

    def _moves(self, me: int, opp: int) -> list[tuple[int, int]]:
        """Legal (action, cell) pairs in search order."""
        occupied = me | opp
        if self.spec.gravity:
            moves = []
            for c in self.order:
                for cell in self.column_cells[c]:
                    if not occupied >> cell & 1:
                        moves.append((c, cell))
                        break
            return moves
        return [(x, x) for x in self.order if not occupied >> x & 1]

    def _wins(self, bits: int, cell: int) -> bool:
        return any(bits & w == w for w in self.windows_of[cell])

    def _root(self, me: int, opp: int) -> list[int]:
        best, best_moves = -WIN - 1, []
        for action, cell in self._moves(me, opp):
            mine = me | (1 << cell)
            if self._wins(mine, cell):
                score = WIN - 1
            else:
                # Window (best - 1, +inf): a move that fails low is worse than the best so far;
                # one that ties or beats it gets its exact value, so all best moves are found.
                score = -self._negamax(opp, mine, self.depth - 1, -WIN - 1, -(best - 1), 1)
            if score > best:
                best, best_moves = score, [action]
            elif score == best:
                best_moves.append(action)
        return best_moves

    def _negamax(self, me: int, opp: int, depth: int, alpha: int, beta: int, ply: int) -> int:
        """Value for the player to move; the previous move did not end the game."""
        self.nodes += 1
        moves = self._moves(me, opp)
        if not moves:
            return 0  # board full: draw
        if depth <= 0:
            return self.heuristic(me, opp)
        best = -WIN - 1
        for _, cell in moves:
            mine = me | (1 << cell)
            if self._wins(mine, cell):
                return WIN - (ply + 1)  # nothing beats winning now
            score = -self._negamax(opp, mine, depth - 1, -beta, -alpha, ply + 1)
            if score > best:
                best = score
                if score > alpha:
                    alpha = score
                    if alpha >= beta:
                        break
        return best

    def _full_width(self, me: np.ndarray, opp: np.ndarray) -> np.ndarray:
        """`move_values` without the checks: negamax over every legal move at every ply.

        Ply by ply the boards of all games are one array [N, ...]; the nodes of the next ply are
        the (board, move) pairs to expand, which remember their parent for the way back up. The
        decisions follow `_negamax` exactly: a full board is a draw, then (above the depth limit)
        a move that completes a line ends the search there, at `WIN - (ply + 1)`.
        """
        spec, lines, depth = self.spec, self.lines, self.depth
        code = lines.codes(me, opp)  # [N, n_lines + 1] uint8, the mover's view
        h = lines.heuristic(code, me, opp)  # [N] int64, the mover's view
        empty = spec.n_cells - (me | opp).sum(1)  # [N]
        filled = (me | opp).reshape(len(me), spec.rows, spec.cols).sum(1) if spec.gravity else me | opp
        plies: list[_Ply] = []
        for ply in range(depth):
            legal, cell = self._legal_cells(filled)  # [N, A] bool, [N, A] int64
            wins, gain = lines.moves(code, cell)  # [N, A] bool, [N, A] int64
            wins &= legal
            if ply == 0:
                stop, stop_value = np.zeros(len(code), bool), None  # every root move gets a value
            else:
                full = empty == 0
                stop = full | wins.any(1)
                stop_value = np.where(full, 0, WIN - (ply + 1))
            expand = legal & ~wins & ~stop[:, None]
            if ply == depth - 1:
                # The children are leaves: minus their heuristic is the parent's plus the move's
                # gain (zero-sum), and a child with a full board is a draw.
                leaf_score = np.where((empty == 1)[:, None], 0, h[:, None] + gain)
                plies.append(_Ply(wins, expand, stop, stop_value, None, leaf_score))
                break
            parent, action = np.nonzero(expand)
            child_cell = cell[parent, action]
            code = lines.swap.take(code[parent] + lines.stone_codes[child_cell])  # the next mover's view
            h = -(h[parent] + gain[parent, action])
            empty = empty[parent] - 1
            filled = filled[parent]
            if spec.gravity:
                filled[np.arange(len(parent)), action] += 1
            else:
                filled[np.arange(len(parent)), child_cell] = True
            plies.append(_Ply(wins, expand, stop, stop_value, (parent, action), None))

        child_value = np.zeros(0, np.int64)  # values of the nodes one ply down, in expand order
        for ply in reversed(range(len(plies))):
            p = plies[ply]
            if p.leaf_score is not None:
                score = np.where(p.expand, p.leaf_score, NO_MOVE)
            else:
                score = np.full(p.expand.shape, NO_MOVE, np.int64)
                score[p.children] = -child_value
            if ply == 0:
                return np.where(p.wins, WIN - 1, score)
            child_value = np.where(p.stop, p.stop_value, score.max(1))
        raise AssertionError("unreachable: the loop returns at ply 0")

    def _legal_cells(self, filled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Legal moves [N, A] and the cell each fills [N, A] (0 where illegal), from pieces per
        column [N, cols] (gravity) or occupied cells [N, n_cells]."""
        spec = self.spec
        if spec.gravity:
            legal = filled < spec.rows
            cell = (spec.rows - 1 - filled) * spec.cols + np.arange(spec.cols)
            return legal, np.where(legal, cell, 0)
        return ~filled, np.broadcast_to(np.arange(spec.n_cells), filled.shape)

    def heuristic(self, me: int, opp: int) -> int:
        """Symmetric line count: h(me, opp) == -h(opp, me)."""
        score = 0
        for w in self.windows:
            a, b = me & w, opp & w
            if a and not b:
                score += WEIGHTS.get(a.bit_count(), 0)
            elif b and not a:
                score -= WEIGHTS.get(b.bit_count(), 0)
        if self.centre_mask:
            score += CENTRE_BONUS * ((me & self.centre_mask).bit_count() - (opp & self.centre_mask).bit_count())
        return score


def planes_to_bits(planes: np.ndarray) -> tuple[int, int]:
    """Mover-perspective planes [rows, cols, 2] -> (mover bits, opponent bits), bit = row-major cell."""
    planes = np.asarray(planes) > 0.5
    mine = np.flatnonzero(planes[..., 0].reshape(-1))
    theirs = np.flatnonzero(planes[..., 1].reshape(-1))
    return sum(1 << int(c) for c in mine), sum(1 << int(c) for c in theirs)


def perfect_player(game: str | GameSpec, seed: int | None = None) -> Minimax:
    """Full-depth minimax: perfect play (practical for tic-tac-toe)."""
    spec = game_spec(game)
    return Minimax(spec, depth=spec.n_cells, seed=seed)


class _Ply(NamedTuple):
    """One ply of the full-width search, kept for the way back up ([N] nodes, [N, A] moves)."""

    wins: np.ndarray
    """[N, A] bool: the move completes a line."""
    expand: np.ndarray
    """[N, A] bool: the move is searched on (a child node, or a leaf at the last ply)."""
    stop: np.ndarray
    """[N] bool: the node's value is decided without its moves (full board, or a win now)."""
    stop_value: np.ndarray | None
    """[N] int64: that value where `stop` (None at the root, which never stops)."""
    children: tuple[np.ndarray, np.ndarray] | None
    """(node, move) of each node of the next ply; None at the last ply."""
    leaf_score: np.ndarray | None
    """[N, A] int64 at the last ply: each move's score, minus the child's value."""


def _to_ints(stones: np.ndarray) -> list[int]:
    """bool [n, n_cells] -> n Python-int bitboards (bit = row-major cell), as `planes_to_bits`."""
    packed = np.packbits(stones, axis=1, bitorder="little")
    return [int.from_bytes(row.tobytes(), "little") for row in packed]


class _LineTables:
    """A board as its lines, for the batched search: per line one code `mine * (k + 1) + theirs`
    (the two sides' piece counts, k = connect), plus a padding line that never changes.

    Lookup tables by code give a line's heuristic score, the score gained by adding one of the
    mover's pieces, and whether that piece completes the line.
    """

    def __init__(self, spec: GameSpec):
        k, k1 = spec.connect, spec.connect + 1
        if k1 * k1 > 256:
            raise ValueError(f"{spec.name}: the batched search codes a line in a byte, so connect <= 15 (got {k})")
        self.connect = k
        self.windows_t = np.ascontiguousarray(spec.windows().T)  # [n_cells, n_lines] float32
        n_lines = self.windows_t.shape[1]
        self.pad = k * k1 + k  # counts (k, k): in no real line of a game in progress
        weight = np.array([WEIGHTS.get(c, 0) for c in range(k1)], np.int64)
        mine, theirs = np.divmod(np.arange(k1 * k1), k1)
        self.line_score = np.where(theirs == 0, weight[mine], 0) - np.where(mine == 0, weight[theirs], 0)
        # A mover's piece added to a line: what it gains, plus _COMPLETES if it makes k in a row,
        # so one lookup and one sum over the lines through a cell give both.
        after = np.minimum(mine + 1, k) * k1 + theirs
        gain = np.where(mine < k, self.line_score[after] - self.line_score, 0)
        self.move_score = np.where(mine == k - 1, _COMPLETES, gain).astype(np.int32)
        self.move_score[self.pad] = 0
        self.swap = (theirs * k1 + mine).astype(np.uint8)  # the same line seen by the other side
        self.stone_codes = np.zeros((spec.n_cells, n_lines + 1), np.uint8)  # + one mover's piece
        self.stone_codes[:, :n_lines] = k1 * self.windows_t
        through = [np.flatnonzero(w) for w in self.windows_t]
        self.lines_of = np.full((spec.n_cells, max(map(len, through))), n_lines, np.int64)
        for cell, idx in enumerate(through):
            self.lines_of[cell, :len(idx)] = idx
        self.centre = np.zeros(spec.n_cells, np.int64)
        if spec.gravity and spec.cols % 2:
            self.centre[spec.cols // 2::spec.cols] = CENTRE_BONUS

    def counts(self, stones: np.ndarray) -> np.ndarray:
        """bool [n, n_cells] -> pieces in every line [n, n_lines] int64."""
        return np.rint(stones.astype(np.float32) @ self.windows_t).astype(np.int64)

    def has_line(self, stones: np.ndarray) -> np.ndarray:
        """bool [n, n_cells] -> [n] bool: these pieces complete a line."""
        return (self.counts(stones) >= self.connect).any(1)

    def codes(self, me: np.ndarray, opp: np.ndarray) -> np.ndarray:
        """Line codes [n, n_lines + 1] uint8 of positions (the mover's view), padding line last."""
        code = self.counts(me) * (self.connect + 1) + self.counts(opp)
        return np.concatenate([code, np.full((len(code), 1), self.pad)], 1).astype(np.uint8)

    def heuristic(self, code: np.ndarray, me: np.ndarray, opp: np.ndarray) -> np.ndarray:
        """`Minimax.heuristic` of positions [n] int64, from their line codes and pieces."""
        return self.line_score[code[:, :-1]].sum(1) + (me.astype(np.int64) - opp) @ self.centre

    def moves(self, code: np.ndarray, cell: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the mover's piece in `cell` [N, A] of each position: does it complete a line
        [N, A] bool, and how much does it add to the mover's heuristic [N, A] int64 (meaningless
        where it completes a line)."""
        n, width = code.shape
        # Flat `take`s: faster than indexing code[rows, lines] with two index arrays
        # (docs/PERFORMANCE.md#minimax).
        flat, base = code.reshape(-1), (np.arange(n) * width)[:, None]
        total = np.empty(cell.shape, np.int64)
        for a in range(cell.shape[1]):  # one move at a time: [N, lines through a cell] at most
            touched = flat.take(self.lines_of[cell[:, a]] + base)  # [N, K] codes
            total[:, a] = self.move_score.take(touched).sum(1) + self.centre[cell[:, a]]
        return total >= _COMPLETES // 2, total

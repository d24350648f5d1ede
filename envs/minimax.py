"""A built-in minimax player for the two-player games (evaluation opponents and tests).

Negamax with alpha-beta pruning on Python-int bitboards (bit = row-major cell index), to a
configurable depth. Terminal scores are exact: a win is `WIN - ply` (sooner is better), a loss
its negation, a draw 0. At the depth limit a non-terminal position is scored by a symmetric,
zero-sum heuristic (so negamax stays sound): over every line of `connect` cells, a line holding
only the mover's pieces scores +weight[count], only the opponent's -weight[count], mixed lines 0;
plus a small bonus for pieces in the centre column (Connect Four). Its magnitude stays far below
`WIN - max_ply`, so a proven win or loss always outranks any heuristic value.

With `depth >= n_cells` the search reaches the end of every line, i.e. perfect play; on
tic-tac-toe that is cheap (a few thousand nodes per move, cached). Among equally good moves the
player picks uniformly with its seeded generator, so a perfect player still varies its games.
"""

from __future__ import annotations

import numpy as np

from rlstack.envs.games import GameSpec, game_spec

WIN = 1_000_000
WEIGHTS = {1: 1, 2: 4, 3: 16}
"""Heuristic weight of a line holding only one side's pieces, by piece count (connect - 1 at most)."""
CENTRE_BONUS = 3
_CACHE_LIMIT = 200_000


class Minimax:
    """Alpha-beta player of `depth` plies for a GameSpec; `choose` one position, `act` a batch."""

    def __init__(self, game: str | GameSpec, depth: int, seed: int | None = None):
        self.spec = game_spec(game)
        if depth < 1:
            raise ValueError(f"minimax depth must be >= 1, got {depth}")
        self.depth = depth
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

    # ----- public ----------------------------------------------------------------------------

    def best_moves(self, me: int, opp: int) -> list[int]:
        """All actions with the best minimax value for the player to move (bitboards `me`, `opp`)."""
        key = (me, opp)
        if key not in self._cache:
            if len(self._cache) > _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = self._root(me, opp)
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
        """Players' interface: flat observations [n, D] (planes then mask) -> actions [n] int64."""
        obs = np.asarray(obs, np.float32)
        size = self.spec.n_cells * 2
        planes = obs[:, :size].reshape(len(obs), self.spec.rows, self.spec.cols, 2)
        return np.array([self.choose(p, rng) for p in planes], np.int64)

    # ----- search ------------------------------------------------------------------------------

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


"""Two-player board games for the env stage: tic-tac-toe and Connect Four rules, batched boards,
and a one-game two-player env whose observation follows PettingZoo's classic convention.

Both games are "k in a row" on a rows x cols grid; Connect Four adds gravity (an action is a
column and the piece falls to the lowest empty row; row 0 is the top, as in PettingZoo).

- `Boards` holds N games side by side in numpy arrays: the self-play env, the evaluation
  matches and the minimax opponent all step many games per call.
- `TicTacToe()` / `ConnectFour()` are single games with a PettingZoo-like two-player API
  (`current_player`, `observe()`, `step(action)`, `reward(player)`, `render()`).

Observation of the player to move: `{"observation": int8 [rows, cols, 2], "action_mask": int8 [n]}`
with plane 0 the mover's pieces and plane 1 the opponent's. Rewards: win +1, loss -1, draw 0.
An illegal move raises `IllegalMoveError` naming the move and the legal ones; it is never played.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from rlstack.envs.symmetry import grid_symmetries
from rlstack.errors import IllegalMoveError  # noqa: F401 (raised here; imported from here too)
from rlstack.spaces import MASK_KEY, OBS_KEY, MaskedBox


@dataclass(frozen=True)
class GameSpec:
    """A k-in-a-row game on a rows x cols board."""

    name: str
    rows: int
    cols: int
    connect: int
    gravity: bool
    """True: an action is a column and the piece falls (Connect Four); False: an action is a cell."""

    @property
    def n_cells(self) -> int:
        return self.rows * self.cols

    @property
    def n_actions(self) -> int:
        return self.cols if self.gravity else self.n_cells

    @property
    def move_word(self) -> str:
        return "column" if self.gravity else "cell"

    def windows(self) -> np.ndarray:
        """Every line of `connect` cells as a 0/1 matrix [n_windows, n_cells] (float32, for matmul)."""
        return _windows(self)

    def observation_space(self) -> gym.spaces.Dict:
        """PettingZoo classic: int8 planes [rows, cols, 2] and an int8 action mask [n_actions]."""
        return gym.spaces.Dict({
            OBS_KEY: gym.spaces.Box(0, 1, (self.rows, self.cols, 2), np.int8),
            MASK_KEY: gym.spaces.Box(0, 1, (self.n_actions,), np.int8),
        })

    def flat_space(self) -> MaskedBox:
        """The float32 vector `[planes.ravel(), mask]` the network and exported graph take."""
        return MaskedBox(self.observation_space())

    def positions(self, n: int) -> Boards:
        """N games side by side at their opening position."""
        return Boards(self, n)

    def symmetries(self) -> tuple[np.ndarray, np.ndarray]:
        """The board's symmetries as permutations of the flat observation [K, 2 n_cells + n] and
        of the moves [K, n], the identity first: the transformed position's entry j is the
        original's entry `perm[j]`. Connect Four has its mirror image (gravity rules out the
        rest), tic-tac-toe the 8 rotations and reflections of the square."""
        return _symmetries(self)


class Positions(Protocol):
    """N positions of a game side by side: what the search (rlstack/search.py), the self-play envs
    and the evaluation matches use. `Boards` is the built-in games'; `StatePositions`
    (rlstack/envs/state_games.py) holds one state object per game (OpenSpiel's, or your own).

    Arrays [n]: `over`, `winner` (-1: none yet, or a draw once over; else 0 or 1), `to_move`
    (0 or 1; the players alternate), `n_moves`. Optional: `threats(idx)` (moves that win at once,
    for the player to move and for the opponent), which the search uses where a game has it.
    """

    spec: Game
    n: int
    over: np.ndarray
    winner: np.ndarray
    to_move: np.ndarray
    n_moves: np.ndarray

    def take(self, idx: Any) -> Positions: ...

    def reset(self, idx: Any = None) -> None: ...

    def legal_mask(self, idx: Any = None) -> np.ndarray: ...

    def play(self, actions: Any, idx: Any = None) -> None: ...

    def flat_obs(self, idx: Any = None, player: Any = None) -> np.ndarray: ...

    def result_for(self, player: Any, idx: Any = None) -> np.ndarray: ...

    def render(self, game: int = 0) -> str: ...


class Game(Protocol):
    """A two-player game's rules as search and self-play see them (`GameSpec`, `StateGame`)."""

    name: str
    n_actions: int
    move_word: str

    def observation_space(self) -> gym.spaces.Dict: ...

    def flat_space(self) -> MaskedBox: ...

    def positions(self, n: int) -> Positions: ...

    def symmetries(self) -> tuple[np.ndarray, np.ndarray] | None: ...


TICTACTOE = GameSpec("tictactoe", rows=3, cols=3, connect=3, gravity=False)
CONNECT_FOUR = GameSpec("connect4", rows=6, cols=7, connect=4, gravity=True)
GAMES = {"tictactoe": TICTACTOE, "connect4": CONNECT_FOUR}
_ALIASES = {"tic_tac_toe": "tictactoe", "tic-tac-toe": "tictactoe", "ttt": "tictactoe",
            "connect_four": "connect4", "connect-four": "connect4", "connectfour": "connect4"}


def game_spec(name: Any) -> Game:
    """A game from its name: `tictactoe` or `connect4` (a few spellings accepted: their GameSpec),
    `openspiel:<name>(<params>)` (an OpenSpiel game), `pettingzoo:<module>` (a PettingZoo classic
    AEC env, e.g. `pettingzoo:classic.connect_four_v3`), `module:attribute` (your own: a `Game`, or
    a callable returning one); a `Game` object is returned as it is."""
    if hasattr(name, "positions"):
        return name
    text = str(name)
    if text.startswith("openspiel:"):
        from rlstack.envs.state_games import openspiel_game

        return openspiel_game(text.removeprefix("openspiel:"))
    if text.startswith("pettingzoo:"):
        from rlstack.envs.state_games import pettingzoo_game

        return pettingzoo_game(text.removeprefix("pettingzoo:"))
    if ":" in text:
        from rlstack.envs.state_games import imported_game

        return imported_game(text)
    key = _ALIASES.get(text.lower(), text.lower())
    if key not in GAMES:
        raise ValueError(f"unknown game '{name}'; expected one of: {', '.join(GAMES)}, openspiel:<name>(<params>), "
                         "pettingzoo:<module> or module:attribute")
    return GAMES[key]


@functools.cache
def _windows(spec: GameSpec) -> np.ndarray:
    k, lines = spec.connect, []
    for r in range(spec.rows):
        for c in range(spec.cols):
            for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):  # horizontal, vertical, both diagonals
                end_r, end_c = r + dr * (k - 1), c + dc * (k - 1)
                if 0 <= end_r < spec.rows and 0 <= end_c < spec.cols:
                    line = np.zeros(spec.n_cells, np.float32)
                    line[[(r + dr * i) * spec.cols + c + dc * i for i in range(k)]] = 1.0
                    lines.append(line)
    windows = np.stack(lines)
    windows.flags.writeable = False
    return windows


@functools.cache
def _symmetries(spec: GameSpec) -> tuple[np.ndarray, np.ndarray]:
    return grid_symmetries(spec.rows, spec.cols, 2, columns=spec.gravity)


class Boards:
    """N games side by side. Player 0 moves first; cells are row-major with row 0 at the top.

    `stones[i, p]` [n_cells] bool are player p's pieces in game i; `to_move[i]` is 0 or 1;
    `winner[i]` is -1 (none yet, or a draw once `over[i]`), 0 or 1.
    """

    def __init__(self, spec: GameSpec, n: int):
        self.spec, self.n = spec, n
        self.stones = np.zeros((n, 2, spec.n_cells), bool)
        self.heights = np.zeros((n, spec.cols), np.int64)  # pieces per column (gravity games)
        self.to_move = np.zeros(n, np.int64)
        self.winner = np.full(n, -1, np.int64)
        self.over = np.zeros(n, bool)
        self.n_moves = np.zeros(n, np.int64)

    def _idx(self, idx: np.ndarray | None) -> np.ndarray:
        return np.arange(self.n) if idx is None else np.asarray(idx, np.int64).reshape(-1)

    def take(self, idx: np.ndarray) -> Boards:
        """A new Boards holding copies of games `idx` (an index may repeat: a game branched)."""
        i = self._idx(idx)
        out = Boards(self.spec, len(i))
        for name in ("stones", "heights", "to_move", "winner", "over", "n_moves"):
            getattr(out, name)[:] = getattr(self, name)[i]
        return out

    def reset(self, idx: np.ndarray | None = None) -> None:
        i = self._idx(idx)
        self.stones[i] = False
        self.heights[i] = 0
        self.to_move[i] = 0
        self.winner[i] = -1
        self.over[i] = False
        self.n_moves[i] = 0

    def legal_mask(self, idx: np.ndarray | None = None) -> np.ndarray:
        """[n, n_actions] bool; all False in finished games."""
        i = self._idx(idx)
        if self.spec.gravity:
            legal = self.heights[i] < self.spec.rows
        else:
            legal = ~(self.stones[i, 0] | self.stones[i, 1])
        return legal & ~self.over[i, None]

    def cell_of(self, actions: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        """The cell each action fills (gravity: the lowest empty row of the column)."""
        actions = np.asarray(actions, np.int64)
        if not self.spec.gravity:
            return actions
        i = self._idx(idx)
        rows = self.spec.rows - 1 - self.heights[i, actions]
        return rows * self.spec.cols + actions

    def play(self, actions: np.ndarray, idx: np.ndarray | None = None) -> None:
        """Play one move in each game of `idx` for the player to move there.

        Raises IllegalMoveError (nothing is played in any game) if one move is not legal.
        """
        i = self._idx(idx)
        actions = np.asarray(actions).reshape(-1)
        if len(actions) != len(i):
            raise ValueError(f"{len(actions)} actions for {len(i)} games")
        if not np.issubdtype(actions.dtype, np.integer):
            if not np.all(np.mod(actions, 1) == 0):
                raise IllegalMoveError(f"moves must be integers, got {actions.tolist()}")
        actions = actions.astype(np.int64)
        in_range = (actions >= 0) & (actions < self.spec.n_actions)
        legal = np.zeros(len(i), bool)
        mask = self.legal_mask(i)
        legal[in_range] = mask[np.flatnonzero(in_range), actions[in_range]]
        if not legal.all():
            bad = int(np.flatnonzero(~legal)[0])
            raise IllegalMoveError(self.describe_illegal(int(i[bad]), int(actions[bad])))
        cells = self.cell_of(actions, i)
        mover = self.to_move[i]
        self.stones[i, mover, cells] = True
        if self.spec.gravity:
            self.heights[i, actions] += 1
        self.n_moves[i] += 1
        won = (self.stones[i, mover].astype(np.float32) @ self.spec.windows().T >= self.spec.connect).any(1)
        self.winner[i[won]] = mover[won]
        self.over[i] = won | (self.n_moves[i] == self.spec.n_cells)
        self.to_move[i] = 1 - mover

    def threats(self, idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """([n, n_actions] bool, same): the legal moves that win at once for the player to move (a
        line of `connect` cells with `connect - 1` of its pieces, none of the other's, and its last
        cell free and reachable now), and those that would win for the opponent if it were to
        move. All False in finished games."""
        i = self._idx(idx)
        windows = self.spec.windows()
        mover = self.to_move[i]
        counts = [self.stones[i, p].astype(np.float32) @ windows.T for p in (mover, 1 - mover)]  # [n, n_windows]
        empty = ~(self.stones[i, 0] | self.stones[i, 1])
        legal = self.legal_mask(i)
        cells = np.broadcast_to(np.arange(self.spec.n_actions), legal.shape)
        if self.spec.gravity:  # the lowest empty row of each column (a full column is not legal)
            cells = (self.spec.rows - 1 - self.heights[i]) * self.spec.cols + cells
        cells = np.where(legal, cells, 0)
        wins = []
        for own, other in (counts, counts[::-1]):
            open_line = (own == self.spec.connect - 1) & (other == 0)
            completes = (open_line.astype(np.float32) @ windows > 0) & empty  # [n, n_cells]
            wins.append(legal & np.take_along_axis(completes, cells, 1))
        return wins[0], wins[1]

    def describe_illegal(self, game: int, action: int) -> str:
        spec = self.spec
        if self.over[game]:
            return f"{spec.name}: the game is over; no move can be played (got {spec.move_word} {action})"
        legal = np.flatnonzero(self.legal_mask([game])[0]).tolist()
        if not 0 <= action < spec.n_actions:
            why = f"out of range 0..{spec.n_actions - 1}"
        else:
            why = "full" if spec.gravity else "occupied"
        return f"{spec.name}: illegal move {spec.move_word} {action} ({why}); legal {spec.move_word}s: {legal}"

    def planes(self, idx: np.ndarray | None = None, player: np.ndarray | None = None) -> np.ndarray:
        """[n, rows, cols, 2] int8 from the mover's perspective (or `player`'s, 0/1 per game):
        plane 0 that player's pieces, plane 1 the opponent's."""
        i = self._idx(idx)
        mover = self.to_move[i] if player is None else np.broadcast_to(np.asarray(player, np.int64), i.shape)
        mine = self.stones[i, mover]
        theirs = self.stones[i, 1 - mover]
        planes = np.stack([mine, theirs], -1).astype(np.int8)
        return planes.reshape(len(i), self.spec.rows, self.spec.cols, 2)

    def flat_obs(self, idx: np.ndarray | None = None, player: np.ndarray | None = None) -> np.ndarray:
        """[n, rows*cols*2 + n_actions] float32: the graph's input (`MaskedBox` layout), from the
        mover's perspective or `player`'s; the mask is the legal moves (all 0 once a game is over)."""
        i = self._idx(idx)
        planes = self.planes(i, player).reshape(len(i), 2 * self.spec.n_cells).astype(np.float32)
        return np.concatenate([planes, self.legal_mask(i).astype(np.float32)], 1)

    def result_for(self, player: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
        """+1 win / -1 loss / 0 draw or unfinished, for `player` (0 or 1) in each game [n] float32."""
        i = self._idx(idx)
        w = self.winner[i]
        return np.where(w < 0, 0.0, np.where(w == np.asarray(player), 1.0, -1.0)).astype(np.float32)

    def render(self, game: int = 0, symbols: tuple[str, str] = ("X", "O")) -> str:
        """The board as text: X for player 0, O for player 1, with move numbers."""
        spec = self.spec
        lines = []
        for r in range(spec.rows):
            cells = []
            for c in range(spec.cols):
                cell = r * spec.cols + c
                if self.stones[game, 0, cell]:
                    cells.append(symbols[0])
                elif self.stones[game, 1, cell]:
                    cells.append(symbols[1])
                else:
                    cells.append("." if spec.gravity else str(cell))
            lines.append(" ".join(cells))
        if spec.gravity:
            lines.append(" ".join(str(c) for c in range(spec.cols)))
        return "\n".join(lines)


def play_random(positions: Positions, plies: int, rng: np.random.Generator) -> Positions:
    """`plies` uniformly random legal moves in every game of `positions` still going (in place, a
    game that ends stops); returns `positions`."""
    for _ in range(plies):
        live = np.flatnonzero(~positions.over)
        if not len(live):
            break
        mask = positions.legal_mask(live)
        positions.play(np.where(mask, rng.random(mask.shape), -1.0).argmax(1), live)
    return positions


def boards_from_planes(spec: GameSpec, planes: np.ndarray) -> Boards:
    """Rebuild games from mover-perspective planes [n, rows, cols, 2] (e.g. an observation).

    The mover is whoever has made no more moves than the other (player 0 moves first).
    """
    planes = np.asarray(planes).reshape(-1, spec.rows, spec.cols, 2) > 0.5
    n = len(planes)
    boards = Boards(spec, n)
    mine = planes[..., 0].reshape(n, -1)
    theirs = planes[..., 1].reshape(n, -1)
    mover = (theirs.sum(1) > mine.sum(1)).astype(np.int64)
    boards.to_move[:] = mover
    rows = np.arange(n)
    boards.stones[rows, mover] = mine
    boards.stones[rows, 1 - mover] = theirs
    occupied = (mine | theirs).reshape(n, spec.rows, spec.cols)
    boards.heights[:] = occupied.sum(1)
    boards.n_moves[:] = occupied.reshape(n, -1).sum(1)
    for p in (0, 1):
        won = (boards.stones[:, p].astype(np.float32) @ spec.windows().T >= spec.connect).any(1)
        boards.winner[won] = p
    boards.over[:] = (boards.winner >= 0) | (boards.n_moves == spec.n_cells)
    return boards


class TwoPlayerGame:
    """One game with a PettingZoo-like two-player API; players are 0 (moves first) and 1."""

    spec: GameSpec
    agents = ("player_0", "player_1")

    def __init__(self, spec: GameSpec | None = None):
        if spec is not None:
            self.spec = spec
        self.observation_space = self.spec.observation_space()
        self.action_space = gym.spaces.Discrete(self.spec.n_actions)
        self.boards = Boards(self.spec, 1)

    def reset(self) -> None:
        self.boards.reset()

    @property
    def current_player(self) -> int:
        return int(self.boards.to_move[0])

    @property
    def done(self) -> bool:
        return bool(self.boards.over[0])

    @property
    def winner(self) -> int | None:
        """0 or 1 once someone has won; None while playing or after a draw."""
        w = int(self.boards.winner[0])
        return None if w < 0 else w

    def legal_actions(self) -> list[int]:
        return np.flatnonzero(self.boards.legal_mask()[0]).tolist()

    def observe(self) -> dict[str, np.ndarray]:
        """The player to move's view: planes [rows, cols, 2] and action mask [n], both int8."""
        return {OBS_KEY: self.boards.planes()[0], MASK_KEY: self.boards.legal_mask()[0].astype(np.int8)}

    def flat_obs(self) -> np.ndarray:
        """`observe()` as the float32 vector the exported graph takes."""
        return self.boards.flat_obs()[0]

    def step(self, action: int) -> None:
        """Play `action` for the current player; IllegalMoveError if the rules forbid it."""
        self.boards.play(np.array([action]))

    def reward(self, player: int) -> float:
        """+1 if `player` won, -1 if they lost, 0 for a draw or an unfinished game."""
        if player not in (0, 1):
            raise ValueError(f"player must be 0 or 1, got {player}")
        return float(self.boards.result_for(np.array([player]))[0])

    def render(self) -> str:
        return self.boards.render(0)


class TicTacToe(TwoPlayerGame):
    """3x3, three in a row; an action is a cell 0..8 (row-major)."""

    spec = TICTACTOE


class ConnectFour(TwoPlayerGame):
    """6 rows x 7 columns, four in a row; an action is a column 0..6."""

    spec = CONNECT_FOUR


ENV_IDS = {"rlstack/TicTacToe-v0": "tictactoe", "rlstack/ConnectFour-v0": "connect4"}
"""Gymnasium ids of the single-agent self-play view of each game (see rlstack/envs/selfplay.py)."""
GAME_ENV_ID = "rlstack/Game-v0"
"""The self-play view of any game, named by `env.kwargs.game` (a `game_spec` name)."""


def env_game(env_id: str, kwargs: dict[str, Any] | None = None) -> str | None:
    """The game an env id (and its kwargs) plays, or None if it is not a self-play game env."""
    if env_id == GAME_ENV_ID:
        return (kwargs or {}).get("game")
    return ENV_IDS.get(env_id)


def register_games() -> None:
    """Register the self-play envs with gymnasium (idempotent; entry points load lazily).

    `gym.make(id)` gives one game against `opponent` (default: uniform random); `gym.make_vec(id, n)`
    gives the batched vector env whose opponent moves are one graph call per step per version.
    """
    for env_id, game in [*ENV_IDS.items(), (GAME_ENV_ID, None)]:
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="rlstack.envs.selfplay:SelfPlayEnv",
                         vector_entry_point="rlstack.envs.selfplay:SelfPlayVectorEnv",
                         kwargs={} if game is None else {"game": game})

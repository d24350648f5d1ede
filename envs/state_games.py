"""Any two-player, zero-sum, perfect-information game with alternating moves, for search and
self-play: OpenSpiel's games (`openspiel:<name>(<params>)`), PettingZoo's classic AEC envs
(`pettingzoo:classic.connect_four_v3`: copied for search attribute by attribute) and your own.

A game is given as a factory of one-game states with OpenSpiel's `State` API (the seven methods
of `TurnState`); pyspiel's states have them, and a game of your own needs only those. `StateGame`
turns it into the interface the search, the self-play envs and the evaluation use (`Game`,
`Positions` in rlstack/envs/games.py): N positions side by side, the observation of the player to
move as the flat masked vector the network takes.

Observation: the game's own observation tensor for a player (`observation_tensor(player)`, from
that player's view where the game defines one so), in PettingZoo's classic layout: a 3-D tensor
that the game gives channels first ([C, H, W], OpenSpiel's layout) becomes [H, W, C]; then the
legal-move mask, as every game's flat observation (rlstack/spaces.py).

What rlstack's search needs and checks: two players who alternate (a game in which a player moves
twice in a row, e.g. a multi-jump as separate moves, is refused when it happens, naming the game
and the move), no chance moves, and each finished game's returns (+1 / -1 / 0 for OpenSpiel's
board games). Othello's pass is a move of its own in OpenSpiel, so its players alternate.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from rlstack.envs.symmetry import grid_symmetries
from rlstack.errors import IllegalMoveError, RlstackError
from rlstack.spaces import MASK_KEY, OBS_KEY, MaskedBox


class GameError(RlstackError, ValueError):
    """A game that rlstack's search and self-play cannot play, or a broken rule of the interface."""


class TurnState(Protocol):
    """One game's state: the part of OpenSpiel's `pyspiel.State` API rlstack uses."""

    def current_player(self) -> int: ...

    def legal_actions(self) -> Sequence[int]: ...

    def apply_action(self, action: int) -> None: ...

    def is_terminal(self) -> bool: ...

    def returns(self) -> Sequence[float]:
        """Each player's result once the game is over (e.g. +1 win, -1 loss, 0 draw)."""
        ...

    def clone(self) -> TurnState: ...

    def observation_tensor(self, player: int) -> Sequence[float]:
        """The position as `player` observes it, flat, in the game's `obs_shape`."""
        ...


class StateGame:
    """A game from a factory of initial states (`Game` of rlstack/envs/games.py).

    `name`: how logs and errors name it; `n_actions`: the number of distinct moves (a move is an
    integer 0..n_actions-1); `obs_shape`: the shape of `observation_tensor`'s values (3-D: [C, H, W],
    or [H, W, C] with `channels_first=False`);
    `symmetries`: permutations of the flat observation and of the moves under which the rules are
    the same (`rlstack.envs.symmetry.grid_symmetries`), for training on every symmetry of a position.
    """

    move_word = "move"

    def __init__(self, name: str, new_state: Callable[[], TurnState], n_actions: int, obs_shape: Sequence[int],
                 openspiel: Any = None, symmetries: tuple[np.ndarray, np.ndarray] | None = None,
                 channels_first: bool = True):
        self.name, self.new_state, self.n_actions = name, new_state, int(n_actions)
        self.openspiel = openspiel
        """The `pyspiel.Game` of an OpenSpiel game (its `MCTSBot` opponent), else None."""
        self._symmetries = symmetries
        self.tensor_shape = tuple(int(d) for d in obs_shape)
        shape = self.tensor_shape
        # a 3-D tensor given channels first (OpenSpiel's layout) is moved channels last
        self.transpose = len(shape) == 3 and channels_first
        self.obs_shape = (shape[1], shape[2], shape[0]) if self.transpose else shape
        self.obs_size = int(np.prod(shape))
        self.initial = new_state()
        if self.initial.current_player() != 0:
            raise GameError(f"{name}: the first player to move must be player 0, got {self.initial.current_player()}")

    def __repr__(self) -> str:
        return f"StateGame({self.name})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateGame) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def observation_space(self) -> gym.spaces.Dict:
        """The game's observation of the player to move (float32, PettingZoo's layout) and an int8 mask."""
        return gym.spaces.Dict({
            OBS_KEY: gym.spaces.Box(-np.inf, np.inf, self.obs_shape, np.float32),
            MASK_KEY: gym.spaces.Box(0, 1, (self.n_actions,), np.int8),
        })

    def flat_space(self) -> MaskedBox:
        return MaskedBox(self.observation_space())

    def symmetries(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The board's symmetries given at construction (`rlstack.envs.symmetry.grid_symmetries`), or
        None: none declared (training samples positions as played)."""
        return self._symmetries

    def positions(self, n: int) -> StatePositions:
        return StatePositions(self, n)

    def observe(self, state: TurnState, player: int) -> np.ndarray:
        """`state` as `player` observes it, flat, in PettingZoo's layout (float32 [obs_size])."""
        tensor = np.asarray(state.observation_tensor(player), np.float32)
        if tensor.size != self.obs_size:
            raise GameError(f"{self.name}: observation_tensor has {tensor.size} values, obs_shape "
                            f"{self.tensor_shape} needs {self.obs_size}")
        if self.transpose:
            tensor = tensor.reshape(self.tensor_shape).transpose(1, 2, 0)
        return tensor.reshape(-1)


class StatePositions:
    """N positions of a `StateGame` side by side (`Positions` of rlstack/envs/games.py): one state
    object per game, with the arrays the search reads (`over`, `winner`, `to_move`, `n_moves`)."""

    def __init__(self, spec: StateGame, n: int, states: list[TurnState] | None = None):
        self.spec, self.n = spec, n
        self.states = [spec.initial.clone() for _ in range(n)] if states is None else states
        self.to_move = np.zeros(n, np.int64)
        self.winner = np.full(n, -1, np.int64)
        self.over = np.zeros(n, bool)
        self.n_moves = np.zeros(n, np.int64)
        self.results = np.zeros((n, 2), np.float32)

    def _idx(self, idx: Any) -> np.ndarray:
        return np.arange(self.n) if idx is None else np.asarray(idx, np.int64).reshape(-1)

    def take(self, idx: Any) -> StatePositions:
        """Copies of games `idx` (an index may repeat: a game branched)."""
        i = self._idx(idx)
        out = StatePositions(self.spec, len(i), [self.states[k].clone() for k in i])
        for name in ("to_move", "winner", "over", "n_moves", "results"):
            getattr(out, name)[:] = getattr(self, name)[i]
        return out

    def reset(self, idx: Any = None) -> None:
        for k in self._idx(idx):
            self.states[k] = self.spec.initial.clone()
            self.to_move[k], self.winner[k], self.over[k], self.n_moves[k] = 0, -1, False, 0
            self.results[k] = 0.0

    def legal_mask(self, idx: Any = None) -> np.ndarray:
        """[n, n_actions] bool; all False in finished games."""
        i = self._idx(idx)
        mask = np.zeros((len(i), self.spec.n_actions), bool)
        for row, k in enumerate(i):
            if not self.over[k]:
                mask[row, list(self.states[k].legal_actions())] = True
        return mask

    def play(self, actions: Any, idx: Any = None) -> None:
        """One move in each game of `idx`; IllegalMoveError (nothing played in any game) if one is not legal."""
        i = self._idx(idx)
        actions = np.asarray(actions).reshape(-1)
        if len(actions) != len(i):
            raise ValueError(f"{len(actions)} actions for {len(i)} games")
        if not np.issubdtype(actions.dtype, np.integer) and not np.all(np.mod(actions, 1) == 0):
            raise IllegalMoveError(f"moves must be integers, got {actions.tolist()}")
        actions = actions.astype(np.int64)
        legal = self.legal_mask(i)
        for row, (k, a) in enumerate(zip(i, actions, strict=True)):
            if not (0 <= a < self.spec.n_actions and legal[row, a]):
                raise IllegalMoveError(self.describe_illegal(int(k), int(a)))
        for k, a in zip(i, actions, strict=True):
            state, mover = self.states[k], int(self.to_move[k])
            state.apply_action(int(a))
            self.n_moves[k] += 1
            if state.is_terminal():
                self.over[k] = True
                self.results[k] = np.asarray(state.returns(), np.float32)[:2]
                r = self.results[k]
                self.winner[k] = -1 if r[0] == r[1] else int(r[1] > r[0])
                self.to_move[k] = 1 - mover
            elif state.current_player() != 1 - mover:
                raise GameError(f"{self.spec.name}: player {mover} moved ({a}) and player "
                                f"{state.current_player()} is to move; rlstack's search needs players who "
                                "alternate and no chance moves")
            else:
                self.to_move[k] = 1 - mover

    def describe_illegal(self, game: int, action: int) -> str:
        name = self.spec.name
        if self.over[game]:
            return f"{name}: the game is over; no move can be played (got move {action})"
        legal = sorted(int(a) for a in self.states[game].legal_actions())
        if not 0 <= action < self.spec.n_actions:
            return f"{name}: illegal move {action} (out of range 0..{self.spec.n_actions - 1}); legal moves: {legal}"
        return f"{name}: illegal move {action}; legal moves: {legal}"

    def flat_obs(self, idx: Any = None, player: Any = None) -> np.ndarray:
        """[n, obs_size + n_actions] float32 from the mover's view (or `player`'s, 0/1 per game);
        the mask is the legal moves (all 0 once a game is over)."""
        i = self._idx(idx)
        who = self.to_move[i] if player is None else np.broadcast_to(np.asarray(player, np.int64), i.shape)
        out = np.empty((len(i), self.spec.obs_size + self.spec.n_actions), np.float32)
        for row, (k, p) in enumerate(zip(i, who, strict=True)):
            out[row, :self.spec.obs_size] = self.spec.observe(self.states[k], int(p))
        out[:, self.spec.obs_size:] = self.legal_mask(i)
        return out

    def result_for(self, player: Any, idx: Any = None) -> np.ndarray:
        """`player`'s return in each game (0 while unfinished) [n] float32."""
        i = self._idx(idx)
        who = np.broadcast_to(np.asarray(player, np.int64), i.shape)
        return self.results[i, who].astype(np.float32)

    def render(self, game: int = 0) -> str:
        return str(self.states[game])


def _check_openspiel(game: Any, name: str) -> None:
    import pyspiel

    kind, problems = game.get_type(), []
    if game.num_players() != 2:
        problems.append(f"{game.num_players()} players")
    if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        problems.append("simultaneous moves")
    if kind.chance_mode != pyspiel.GameType.ChanceMode.DETERMINISTIC:
        problems.append("chance moves")
    if kind.information != pyspiel.GameType.Information.PERFECT_INFORMATION:
        problems.append("hidden information")
    if kind.utility not in (pyspiel.GameType.Utility.ZERO_SUM, pyspiel.GameType.Utility.CONSTANT_SUM):
        problems.append(f"{kind.utility.name.lower()} utility")
    if not kind.provides_observation_tensor:
        problems.append("no observation tensor")
    if problems:
        raise GameError(f"openspiel:{name} has {', '.join(problems)}; rlstack's search and self-play play "
                        "two-player, zero-sum, sequential, deterministic perfect-information games")


SYMMETRIC = {"tic_tac_toe": {}, "othello": {"extra_moves": 1}, "connect_four": {"columns": True},
             "hex": {"half_turn": (0, 2, 1, 3, 4, 5, 7, 6, 8)}}
"""OpenSpiel's games whose observation planes are one value per cell and channel and whose moves are
cells (a pass after them) or columns: their board symmetries (`grid_symmetries` keywords). Hex's
only one is the half turn; its planes (a cell's state + 4) say which edges a stone's group touches,
so white's west and east planes (1, 2) swap, and black's south and north (6, 7). Breakthrough's
moves are a cell and a direction: no cell permutation is a symmetry of those."""


def openspiel_game(name: str) -> StateGame:
    """OpenSpiel's game `name` (e.g. `othello`, `hex(board_size=7)`) as a `StateGame`."""
    try:
        import pyspiel
    except ImportError:
        raise GameError("openspiel games need the open-spiel package: pip install 'rlstack[openspiel]'") from None
    try:
        game = pyspiel.load_game(name)
    except pyspiel.SpielError as err:
        raise GameError(f"openspiel:{name}: {err}") from None
    _check_openspiel(game, name)
    shape = game.observation_tensor_shape()
    symmetries = None
    short = game.get_type().short_name
    if short in SYMMETRIC and len(shape) == 3:
        channels, rows, cols = shape
        symmetries = grid_symmetries(rows, cols, channels, **SYMMETRIC[short])
    return StateGame(f"openspiel:{name}", game.new_initial_state, game.num_distinct_actions(), shape,
                     openspiel=game, symmetries=symmetries)


class MCTSPlayer:
    """OpenSpiel's `MCTSBot` as a player (`act_positions`): UCT (c = 2) with one random rollout per
    leaf and solved terminal subtrees, as OpenSpiel's AlphaZero evaluates against it."""

    def __init__(self, game: StateGame, simulations: int, seed: int | None = None):
        from open_spiel.python.algorithms import mcts

        if game.openspiel is None:
            raise GameError(f"{game.name}: the MCTS opponent plays OpenSpiel's games only")
        if simulations < 1:
            raise ValueError(f"MCTS needs at least 1 simulation, got {simulations}")
        self.rng = np.random.default_rng(seed)
        legacy = np.random.RandomState(self.rng.bit_generator)  # MCTSBot's API; the state is the Generator's
        self.bot = mcts.MCTSBot(game.openspiel, uct_c=2.0, max_simulations=simulations, solve=True,
                                evaluator=mcts.RandomRolloutEvaluator(n_rollouts=1, random_state=legacy),
                                random_state=legacy)
        self.name = f"mcts{simulations}"

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise ValueError(f"{self.name} plays from positions (act_positions), not observations")

    def act_positions(self, positions: StatePositions, rng: np.random.Generator) -> np.ndarray:
        return np.array([self.bot.step(state) for state in positions.states], np.int64)


class PettingZooState:
    """A PettingZoo classic AEC env as one game's state (`TurnState`): the players are its
    `possible_agents` in order, a move is `step`, a copy is a deep copy of the env (`_copy_env`; about
    0.2 ms for Connect Four, where an OpenSpiel state clones in 1.4 us: a search is slower on it),
    the returns are its rewards summed, the observation is `observe(agent)["observation"]` and the
    legal moves its `action_mask`."""

    def __init__(self, env: Any, returns: list[float] | None = None):
        self.env = env
        self.agents = list(env.possible_agents)
        self._returns = [0.0] * len(self.agents) if returns is None else returns

    def current_player(self) -> int:
        return -4 if self.is_terminal() else self.agents.index(self.env.agent_selection)

    def legal_actions(self) -> list[int]:
        mask = self.env.observe(self.env.agent_selection)["action_mask"]
        return np.flatnonzero(np.asarray(mask)).tolist()

    def apply_action(self, action: int) -> None:
        self.env.step(int(action))
        for i, agent in enumerate(self.agents):
            self._returns[i] += float(self.env.rewards.get(agent, 0.0))

    def is_terminal(self) -> bool:
        env = self.env
        return any(env.terminations.get(a, False) or env.truncations.get(a, False) for a in self.agents)

    def returns(self) -> list[float]:
        return list(self._returns)

    def clone(self) -> PettingZooState:
        return PettingZooState(_copy_env(self.env), list(self._returns))

    def observation_tensor(self, player: int) -> np.ndarray:
        return np.asarray(self.env.observe(self.agents[player])["observation"], np.float32).reshape(-1)

    def __str__(self) -> str:
        board = np.asarray(self.env.observe(self.agents[0])["observation"])
        if board.ndim != 3:
            return str(board)
        marks = np.full(board.shape[:2], ".", object)
        for plane, mark in zip(range(min(2, board.shape[2])), "XO", strict=False):
            marks[board[..., plane] > 0] = mark
        return "\n".join(" ".join(row) for row in marks)


def _copy_env(env: Any, memo: dict | None = None) -> Any:
    """A deep copy of a PettingZoo env and its wrappers, attribute by attribute: PettingZoo's envs are
    `EzPickle`, so `copy.deepcopy` (through pickling) would build a fresh env from the constructor's
    arguments and lose the game in progress."""
    memo = {} if memo is None else memo
    new = object.__new__(type(env))
    for key, value in vars(env).items():
        inner = key == "env" and hasattr(value, "agent_selection")
        setattr(new, key, _copy_env(value, memo) if inner else copy.deepcopy(value, memo))
    return new


def pettingzoo_game(module: str) -> StateGame:
    """PettingZoo's AEC env module `module` (`classic.connect_four_v3`, or a full module path) as a
    `StateGame`; its `env()` is built and reset once, and every position copies it."""
    path = module if module.startswith("pettingzoo.") else f"pettingzoo.{module}"
    try:
        env = importlib.import_module(path).env()
    except (ImportError, AttributeError) as err:
        raise GameError(f"pettingzoo:{module}: {err}") from None
    env.reset(seed=0)
    agents = list(env.possible_agents)
    if len(agents) != 2:
        raise GameError(f"pettingzoo:{module} has {len(agents)} agents; search and self-play play two-player games")
    first = env.agent_selection
    if first != agents[0]:
        raise GameError(f"pettingzoo:{module}: the first to move is {first}, not possible_agents[0]")
    space = env.observation_space(first)
    if not hasattr(space, "spaces") or "action_mask" not in space.spaces:
        raise GameError(f"pettingzoo:{module}: its observations have no action_mask; a search needs the legal moves")
    initial = PettingZooState(env)
    return StateGame(f"pettingzoo:{module}", initial.clone, int(env.action_space(first).n),
                     space["observation"].shape, channels_first=False)


def imported_game(path: str) -> Any:
    """`package.module:attribute` -> the game it names: a `Game` object, or a callable returning one."""
    module, _, attr = path.partition(":")
    try:
        value = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise GameError(f"game '{path}': {err}") from None
    return value() if callable(value) and not hasattr(value, "positions") else value


class PerfectPlayer:
    """Perfect play for small games by solving them (negamax over the whole game tree, each
    position solved once): one of the optimal moves, chosen at random. Tic-tac-toe's 5,478
    positions solve in about a second; a large game never finishes."""

    def __init__(self, game: StateGame, seed: int | None = None):
        self.game, self.name = game, "perfect"
        self.rng = np.random.default_rng(seed)
        self._values: dict[tuple[int, bytes], float] = {}

    def _key(self, state: TurnState) -> tuple[int, bytes]:
        return state.current_player(), np.asarray(state.observation_tensor(0), np.float32).tobytes()

    def value(self, state: TurnState) -> float:
        """The result of `state` for its player to move under perfect play."""
        if state.is_terminal():
            raise ValueError("a finished game has no player to move")
        key = self._key(state)
        if key not in self._values:
            self._values[key] = max(self._after(state, a) for a in state.legal_actions())
        return self._values[key]

    def _after(self, state: TurnState, action: int) -> float:
        mover, child = state.current_player(), state.clone()
        child.apply_action(action)
        return float(child.returns()[mover]) if child.is_terminal() else -self.value(child)

    def best_moves(self, state: TurnState) -> list[int]:
        values = {a: self._after(state, a) for a in state.legal_actions()}
        best = max(values.values())
        return [a for a, v in values.items() if v == best]

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise ValueError("the perfect player plays from positions (act_positions), not observations")

    def act_positions(self, positions: StatePositions, rng: np.random.Generator) -> np.ndarray:
        return np.array([self.rng.choice(self.best_moves(s)) for s in positions.states], np.int64)


BUILTIN_RULES = {"openspiel:tic_tac_toe": "tictactoe", "openspiel:connect_four": "connect4"}
"""OpenSpiel's games whose moves and rules are a built-in game's (tests/envs/test_state_games.py):
the project's minimax plays them too (`OnBuiltinBoards`)."""


class OnBuiltinBoards:
    """A built-in game's player (minimax) on an OpenSpiel game with the same rules: each position
    is rebuilt on the built-in boards from the OpenSpiel state's move history."""

    def __init__(self, player: Any, builtin: Any):
        self.player, self.builtin, self.name = player, builtin, player.name

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise ValueError(f"{self.name} on OpenSpiel's boards plays from positions (act_positions)")

    def act_positions(self, positions: StatePositions, rng: np.random.Generator) -> np.ndarray:
        boards = self.builtin.positions(positions.n)
        histories = [state.history() for state in positions.states]
        for ply in range(max(map(len, histories), default=0)):  # one batched move per ply
            games = [k for k, history in enumerate(histories) if len(history) > ply]
            boards.play([histories[k][ply] for k in games], games)
        return self.player.act(boards.flat_obs(), rng)

"""Players: anything that picks moves for a batch of positions of a two-player game, and the one
factory that builds them by name (`make_player`).

Players take flat observations [n, D] float32 (planes, then the legal-move mask) and a numpy
Generator and return actions [n]: `RandomPlayer`, `Minimax` (rlstack/envs/minimax.py),
`PolicyPlayer` (a policy graph: an exported version, or the agent being trained), OpenSpiel's
`MCTSPlayer` and the solver's `PerfectPlayer` (rlstack/envs/state_games.py), and the search
(`rlstack.search.SearchPlayer`, which moves from positions). The self-play env's opponents
(rlstack/envs/selfplay.py), the evaluation (rlstack/selfplay_eval.py), `rlstack.play` and the
benchmarks all take theirs from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rlstack.envs.games import Game, GameSpec, Positions, game_spec
from rlstack.envs.minimax import Minimax

if TYPE_CHECKING:
    from rlstack.acting import Acting


class Player(Protocol):
    """Anything that picks moves for a batch of positions. A player that needs the positions
    themselves, not their observations (a search), has `act_positions(positions, rng)` besides;
    `moves` calls whichever it has."""

    name: str

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Flat observations [n, D] float32 (planes, then the legal-move mask) -> actions [n]."""
        ...


def moves(player: Player, positions: Positions, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`player`'s moves [len(idx)] in games `idx` of `positions`."""
    if hasattr(player, "act_positions"):
        chosen = player.act_positions(positions.take(idx), rng)
    else:
        chosen = player.act(positions.flat_obs(idx), rng)
    return np.asarray(chosen).reshape(-1)


class RandomPlayer:
    """Uniform over the legal moves."""

    def __init__(self, spec: Game, name: str = "random"):
        self.spec = spec
        self.name = name

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mask = np.asarray(obs)[:, -self.spec.n_actions:] > 0.5
        if not mask.any(1).all():
            raise ValueError("RandomPlayer was asked to move in a finished game (no legal move)")
        # Gumbel-max over the legal moves: one vectorised draw for the whole batch.
        scores = np.where(mask, rng.random(mask.shape), -1.0)
        return scores.argmax(1)


MIN_GRAPH_ROWS = 128
"""Batches for a compiled graph are padded to a power of two >= this many rows (see `graph_rows`)."""


def graph_rows(n: int, minimum: int = MIN_GRAPH_ROWS) -> int:
    """The batch size n observations are run at: the next power of two >= max(n, minimum).

    A graph is compiled once per input shape, and a compile costs far more than the extra rows of
    a call (docs/PERFORMANCE.md#compiled-batch-sizes); opponents answer a varying number of games
    each step, so a few fixed shapes keep it to one compile per version instead of one per batch
    size. (A dynamic-shape graph via `set_inputs` compiles once but is slower per call.)
    """
    return max(minimum, 1 << max(n - 1, 0).bit_length())


class PolicyPlayer:
    """A policy graph as a player (one graph call per `act`): an exported version, or the agent
    being trained (its in-process acting graph, which follows the learner's weights)."""

    def __init__(self, acting: Acting, sample: bool = True, name: str | None = None):
        self.acting = acting
        self.sample = sample
        self.name = name or acting.version

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n, rows = len(obs), graph_rows(len(obs))
        noise = self.acting.noise(rows, rng if self.sample else None)[:n]  # drawn for whole batches
        return self.acting.run(obs, noise, rows=rows).action.astype(np.int64)


def load_player(path: str | Path, spec: Game, sample: bool = True) -> PolicyPlayer:
    """A run dir, `policy/` dir or version dir -> its policy as a player (checked against `spec`)."""
    from rlstack.acting import load_policy  # MindSpore loads only when a policy is needed

    return PolicyPlayer(load_policy(path, obs_shape=spec.flat_space().shape), sample)


def make_player(spec: Game, what: str, seed: int | None = None, sample: bool = True) -> Player:
    """A player by name: `random`; `minimax` / `minimax:D` (depth D, default 2: the built-in games,
    and OpenSpiel's with their rules); `mcts` / `mcts:N` (OpenSpiel's MCTSBot of N simulations,
    default 100: OpenSpiel's games); `perfect` (the game solved: small games); or a policy path."""
    kind, _, number = what.partition(":")
    if what == "random":
        return RandomPlayer(spec)
    if kind in ("minimax", "mcts"):
        default = 2 if kind == "minimax" else 100
        if number and not number.isdigit():
            raise ValueError(f"opponent '{what}': expected {kind}:N with an integer N, e.g. {kind}:{default}")
        build = _minimax if kind == "minimax" else _mcts
        return build(spec, int(number or default), seed)
    if what == "perfect":
        if isinstance(spec, GameSpec):
            return Minimax(spec, spec.n_cells, seed)
        from rlstack.envs.state_games import PerfectPlayer

        return PerfectPlayer(spec, seed=seed)
    if Path(what).exists():
        return load_player(what, spec, sample)
    raise ValueError(f"opponent '{what}' is not 'random', 'minimax[:DEPTH]', 'mcts[:SIMULATIONS]', 'perfect' or "
                     "an existing policy path (run dir, policy/ dir or version dir)")


def _minimax(spec: Game, depth: int, seed: int | None) -> Player:
    from rlstack.envs.state_games import BUILTIN_RULES, OnBuiltinBoards

    if isinstance(spec, GameSpec):
        return Minimax(spec, depth, seed)
    if spec.name in BUILTIN_RULES:
        builtin = game_spec(BUILTIN_RULES[spec.name])
        return OnBuiltinBoards(Minimax(builtin, depth, seed), builtin)
    raise ValueError(f"opponent 'minimax': minimax plays the built-in k-in-a-row games (and OpenSpiel's "
                     f"{' and '.join(BUILTIN_RULES)}), not {spec.name}")


def _mcts(spec: Game, simulations: int, seed: int | None) -> Player:
    from rlstack.envs.state_games import MCTSPlayer

    if getattr(spec, "openspiel", None) is None:
        raise ValueError(f"opponent 'mcts': OpenSpiel's MCTS plays OpenSpiel's games (openspiel:<name>), "
                         f"not {spec.name}")
    return MCTSPlayer(spec, simulations, seed=seed)


def minimax_plays(spec: Game) -> bool:
    """Whether the project's minimax plays `spec` (the built-in games, and OpenSpiel's with their rules)."""
    from rlstack.envs.state_games import BUILTIN_RULES

    return isinstance(spec, GameSpec) or spec.name in BUILTIN_RULES

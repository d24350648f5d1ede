"""Monte Carlo tree search for two-player games, batched over many games, its leaves evaluated
by the exported acting graph: the search learner's self-play (`algorithms/alphazero.py`), search
at play time (`SearchPlayer`: `rlstack.play --search N`, `selfplay.eval_search`).

AlphaZero's PUCT search (Silver et al. 2018): every simulation descends each game's tree by
argmax Q + c_puct P sqrt(N) / (1 + N_a), expands one leaf, evaluates it and backs the value up.
All games descend side by side; the tree arithmetic is numpy over the games, and the leaves of
every game are evaluated by **one graph call per simulation** (`policy_value`). Any game with the
`Positions` interface (rlstack/envs/games.py) can be searched: the built-in boards, OpenSpiel's
games and your own (rlstack/envs/state_games.py).

What differs from the paper, and why:
- The prior over moves and V(s) come from the network's priors entry point, exported beside the
  acting graph (`rlstack.network.PriorsGraph`: the same parameters and kernels up to the
  log-softmax), one row per leaf. A graph exported without it is run once per move with Gumbel
  noise that forces that move (`FORCE` on its column): leaves x moves rows of the acting graph.
- A leaf where the player to move can complete a line at once (games whose positions have
  `threats`: the built-in k-in-a-row games) is valued +1 (exact) instead of by the value head: a win in one is never missed and a loss in one is seen one ply earlier,
  which with few simulations is what makes the search block it.
- Visit counts are the policy target (the original's choice): with tic-tac-toe and Connect Four
  a few dozen simulations per move cover the branching factor (<= 9), and a target of visits
  is a proper distribution over the legal moves by construction (illegal moves get none).
  Gumbel AlphaZero's improved policy would allow fewer simulations but needs the sequential
  halving schedule per game; not needed at these branching factors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rlstack.envs.games import Game, GameSpec, Positions, boards_from_planes

FORCE = 1e10
"""Noise on one move's logit that makes the graph's Gumbel-max pick it (legal logits are O(10),
an illegal one -1e9 (`rlstack.heads.CategoricalHead.logits`), so move k wins the argmax and `logp` is its log
prior: 0 probability for an illegal move)."""

Evaluator = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""Flat observations [M, D] -> (prior [M, n_actions] over the legal moves, value [M] in [-1, 1]
for the player to move)."""


def policy_value(acting: Any, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prior over every move and V(s) of positions `obs` [M, D], from one graph call: the priors
    entry point's M rows (`Acting.priors`), or for a graph exported without it M x n_actions rows
    of the acting graph, each forcing one move."""
    from rlstack.envs.players import graph_rows  # (the compiled batch sizes the opponents use)

    obs = np.asarray(obs, np.float32)
    m, n = len(obs), int(acting.noise_dim)
    if getattr(acting, "has_priors", False):
        logp, value = acting.priors(obs, rows=graph_rows(m))
    else:
        forcing = np.tile(np.eye(n, dtype=np.float32) * FORCE, (m, 1))
        result = acting.run(np.repeat(obs, n, axis=0), forcing, rows=graph_rows(m * n))
        if not np.array_equal(result.action.reshape(m, n), np.broadcast_to(np.arange(n), (m, n))):
            raise ValueError("search needs a categorical policy graph (Gumbel-max acting); this graph did not "
                             "play the moves its noise forced")
        logp, value = result.logp.reshape(m, n), result.value.reshape(m, n)[:, 0]
    prior = np.exp(logp.astype(np.float64))
    legal = obs[:, -n:] > 0.5
    prior = np.where(legal, prior, 0.0)
    total = prior.sum(1, keepdims=True)
    uniform = legal / np.maximum(legal.sum(1, keepdims=True), 1)
    prior = np.where(total > 0, prior / np.where(total > 0, total, 1.0), uniform)
    return prior, value.astype(np.float64)


def acting_evaluator(acting: Any) -> Evaluator:
    return lambda obs: policy_value(acting, obs)


@dataclass(frozen=True)
class SearchSettings:
    simulations: int = 32
    """Simulations per move (each one graph call for all games searched together)."""
    c_puct: float = 1.5
    """Exploration constant of the PUCT rule."""
    dirichlet_alpha: float = 0.3
    """Root noise Dir(alpha) mixed into the prior (self-play only)."""
    dirichlet_fraction: float = 0.0
    """Weight of the root noise (0: none, as at play time; AlphaZero's self-play used 0.25)."""

    def __post_init__(self) -> None:
        if self.simulations < 1:
            raise ValueError(f"search needs at least 1 simulation, got {self.simulations}")
        if self.c_puct <= 0:
            raise ValueError(f"c_puct must be > 0, got {self.c_puct}")
        if not 0.0 <= self.dirichlet_fraction <= 1.0 or self.dirichlet_alpha <= 0:
            raise ValueError("dirichlet_fraction must be in [0, 1] and dirichlet_alpha > 0")


class SearchResult(NamedTuple):
    visits: np.ndarray  # [G, n_actions] root visit counts (0 on illegal moves)
    policy: np.ndarray  # [G, n_actions] float32 visits / their sum: the search's move distribution
    value: np.ndarray  # [G] float32 the root's mean backed-up value for the player to move
    calls: int  # graph calls made (root expansion plus one per simulation with a leaf to evaluate)


def search(boards: Positions, evaluate: Evaluator, settings: SearchSettings,
           rng: np.random.Generator | None = None) -> SearchResult:
    """Run `settings.simulations` simulations from every game of `boards` (none may be over).

    Trees live in arrays [G, nodes, n_actions]: node 0 is the root, each simulation adds at most
    one node per game. Values are stored per edge from the view of the player moving there.
    """
    if boards.over.any():
        raise ValueError("search was asked for a finished game")
    spec, g, sims = boards.spec, boards.n, settings.simulations
    a = spec.n_actions
    nodes = sims + 1
    child = np.full((g, nodes, a), -1, np.int64)
    prior = np.zeros((g, nodes, a))
    count = np.zeros((g, nodes, a))
    total = np.zeros((g, nodes, a))
    legal = np.zeros((g, nodes, a), bool)
    used = np.ones(g, np.int64)  # nodes allocated per game
    games = np.arange(g)

    root_obs = boards.flat_obs()
    root_prior, root_value = evaluate(root_obs)
    legal[:, 0] = boards.legal_mask()
    if settings.dirichlet_fraction > 0:
        rng = rng or np.random.default_rng()
        noise = rng.dirichlet(np.full(a, settings.dirichlet_alpha), size=g) * legal[:, 0]
        noise /= noise.sum(1, keepdims=True)
        root_prior = (1 - settings.dirichlet_fraction) * root_prior + settings.dirichlet_fraction * noise
    prior[:, 0] = root_prior
    calls = 1

    for _ in range(sims):
        leaf = boards.take(games)
        node = np.zeros(g, np.int64)
        path_node, path_action = [], []  # per depth: [G] (-1 once a game's descent ended)
        depth = np.zeros(g, np.int64)
        active = np.ones(g, bool)
        while active.any():
            idx = np.flatnonzero(active)
            n_here = node[idx]
            visits = count[idx, n_here]
            q = np.divide(total[idx, n_here], visits, out=np.zeros_like(visits), where=visits > 0)
            u = settings.c_puct * prior[idx, n_here] * np.sqrt(visits.sum(1, keepdims=True) + 1) / (1 + visits)
            score = np.where(legal[idx, n_here], q + u, -np.inf)
            move = score.argmax(1)
            step_node = np.full(g, -1, np.int64)
            step_action = np.full(g, -1, np.int64)
            step_node[idx], step_action[idx] = n_here, move
            path_node.append(step_node)
            path_action.append(step_action)
            depth[idx] += 1
            leaf.play(move, idx)
            nxt = child[idx, n_here, move]
            stop = leaf.over[idx] | (nxt < 0)
            active[idx[stop]] = False
            node[idx[~stop]] = nxt[~stop]

        # Leaf values for the player to move there: a finished game's result for them; where the
        # game has `threats`, a win in one is +1 and, without one, facing two or more winning
        # moves of the opponent is -1 (a block stops one, the opponent plays another); otherwise
        # the value head.
        value = np.zeros(g)
        ended = np.flatnonzero(leaf.over)
        value[ended] = leaf.result_for(leaf.to_move[ended], ended)
        fresh = np.flatnonzero(~leaf.over)
        if len(fresh):
            leaf_prior, leaf_value = evaluate(leaf.flat_obs(fresh))
            calls += 1
            if hasattr(leaf, "threats"):
                mine, theirs = leaf.threats(fresh)
                wins, lost = mine.any(1), theirs.sum(1) >= 2
                leaf_value = np.where(wins, 1.0, np.where(lost, -1.0, leaf_value))
            value[fresh] = leaf_value
            last = depth[fresh] - 1
            parent, edge = np.stack(path_node)[last, fresh], np.stack(path_action)[last, fresh]
            new = used[fresh]
            used[fresh] += 1
            child[fresh, parent, edge] = new
            prior[fresh, new] = leaf_prior
            legal[fresh, new] = leaf.legal_mask(fresh)

        # Backup: the edge taken at depth d belongs to the player who moved there, who is the
        # leaf's player to move when (depth - d) is even, its opponent otherwise.
        for d, (step_node, step_action) in enumerate(zip(path_node, path_action, strict=True)):
            on = np.flatnonzero(step_node >= 0)
            sign = np.where((depth[on] - d) % 2 == 0, 1.0, -1.0)
            count[on, step_node[on], step_action[on]] += 1
            total[on, step_node[on], step_action[on]] += sign * value[on]

    visits = count[:, 0]
    policy = (visits / visits.sum(1, keepdims=True)).astype(np.float32)
    root = (root_value + total[:, 0].sum(1)) / (1 + visits.sum(1))
    return SearchResult(visits, policy, root.astype(np.float32), calls)


def choose(result: SearchResult, rng: np.random.Generator, sample: np.ndarray | bool = False) -> np.ndarray:
    """Moves [G]: sampled in proportion to the visits where `sample` (AlphaZero's temperature 1
    for the opening moves), else the most visited (ties broken at random)."""
    visits = result.visits
    best = visits == visits.max(1, keepdims=True)
    greedy = np.where(best, rng.random(visits.shape), -1.0).argmax(1)
    sample = np.broadcast_to(np.asarray(sample, bool), greedy.shape)
    if not sample.any():
        return greedy
    drawn = (result.policy.cumsum(1) > rng.random((len(visits), 1))).argmax(1)
    return np.where(sample, drawn, greedy)


class SearchPlayer:
    """A policy graph with search as a player (`rlstack.envs.players.Player`): the most visited
    move after `simulations` simulations from each position (`act_positions`; `act` rebuilds the
    built-in games' positions from their flat observations)."""

    def __init__(self, acting: Any, spec: Game, simulations: int, c_puct: float = 1.5,
                 name: str | None = None):
        self.acting, self.spec = acting, spec
        self.settings = SearchSettings(simulations=simulations, c_puct=c_puct)
        self.name = name or f"{acting.version or 'current'}+search{simulations}"
        self.calls = 0

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if not isinstance(self.spec, GameSpec):
            raise ValueError(f"{self.spec.name}: a search plays from positions (act_positions), not observations")
        obs = np.asarray(obs, np.float32)
        return self.act_positions(boards_from_planes(self.spec, obs[:, :2 * self.spec.n_cells]), rng)

    def act_positions(self, positions: Positions, rng: np.random.Generator) -> np.ndarray:
        result = search(positions, acting_evaluator(self.acting), self.settings)
        self.calls += result.calls
        return choose(result, rng)


class GameRecord(NamedTuple):
    """Positions of finished self-play games, in order, game after game ([P] rows)."""

    obs: np.ndarray  # [P, D] float32 flat observation of the player to move
    action: np.ndarray  # [P] int32 the move played
    policy: np.ndarray  # [P, n_actions] float32 the search's visit distribution (the policy target)
    value: np.ndarray  # [P] float32 the search's root value
    reward: np.ndarray  # [P] float32 the game's result for its last mover on its last move, else 0
    terminated: np.ndarray  # [P] bool the game's last move
    first_player_results: np.ndarray  # [games] +1 / 0 / -1 for the player who moved first
    lengths: np.ndarray  # [games] moves per game


class SelfPlayGames:
    """`games` self-play games side by side, every move chosen by search with the current graph;
    `play(n)` plays until at least `n` games finished and returns their positions (a finished
    game restarts at once)."""

    def __init__(self, spec: Game, evaluate: Evaluator, settings: SearchSettings, games: int,
                 temperature_moves: int, rng: np.random.Generator):
        if games < 1:
            raise ValueError(f"self-play needs at least one game, got {games}")
        self.spec, self.evaluate, self.settings, self.rng = spec, evaluate, settings, rng
        self.temperature_moves = temperature_moves
        self.boards = spec.positions(games)
        self.history: list[list[tuple]] = [[] for _ in range(games)]
        self.calls = 0
        """Graph calls made by the searches."""
        self.finished = 0
        self.positions = 0
        self.search_seconds = 0.0
        self.game_seconds = 0.0

    def play(self, n: int) -> GameRecord:
        done: list[tuple[list[tuple], float, float]] = []
        while len(done) < n:
            start = time.perf_counter()
            result = search(self.boards, self.evaluate, self.settings, self.rng)
            self.search_seconds += time.perf_counter() - start
            self.calls += result.calls
            start = time.perf_counter()
            boards = self.boards
            moves = choose(result, self.rng, boards.n_moves < self.temperature_moves)
            obs, mover = boards.flat_obs(), boards.to_move.copy()
            for i in range(boards.n):
                self.history[i].append((obs[i], moves[i], result.policy[i], result.value[i]))
            boards.play(moves)
            for i in np.flatnonzero(boards.over):
                done.append((self.history[i], float(boards.result_for(0, [i])[0]),
                             float(boards.result_for(mover[i], [i])[0])))
                self.history[i] = []
            boards.reset(np.flatnonzero(boards.over))
            self.game_seconds += time.perf_counter() - start
        self.finished += len(done)
        self.positions += sum(len(game[0]) for game in done)
        return _record(self.spec, done)

    def stats(self) -> dict[str, float]:
        """Games and positions finished, graph calls, and their rates over the search's seconds."""
        seconds = self.search_seconds + self.game_seconds
        return {"games": self.finished, "positions": self.positions, "graph_calls": self.calls,
                "search_seconds": round(self.search_seconds, 1), "game_seconds": round(self.game_seconds, 1),
                "games_per_second": self.finished / max(seconds, 1e-9),
                "graph_calls_per_second": self.calls / max(self.search_seconds, 1e-9)}


def _record(spec: Game, games: list[tuple[list[tuple], float, float]]) -> GameRecord:
    """Games as (moves, first player's result, last mover's result) -> their positions."""
    obs, action, policy, value, reward, terminated, results, lengths = ([] for _ in range(8))
    for moves, first, last_mover in games:
        k = len(moves)
        for t, (o, m, p, v) in enumerate(moves):
            obs.append(o)
            action.append(m)
            policy.append(p)
            value.append(v)
            last = t == k - 1
            terminated.append(last)
            reward.append(last_mover if last else 0.0)
        results.append(first)
        lengths.append(k)
    return GameRecord(np.asarray(obs, np.float32), np.asarray(action, np.int32), np.asarray(policy, np.float32),
                      np.asarray(value, np.float32), np.asarray(reward, np.float32), np.asarray(terminated, bool),
                      np.asarray(results, np.float64),
                      np.asarray(lengths, np.int64))


def outcome_targets(reward: np.ndarray, terminated: np.ndarray) -> np.ndarray:
    """Each position's game result for its player to move [P] float32, from positions of whole
    games in order (`reward`: the result for the last mover on each game's last move, `terminated`
    there): the last mover's result, negated at every ply back (the players alternate)."""
    reward, terminated = np.asarray(reward, np.float32), np.asarray(terminated, bool)
    ends = np.flatnonzero(terminated)
    if len(ends) == 0 or ends[-1] != len(reward) - 1:
        raise ValueError("outcome targets need whole games (the last position must end a game)")
    end = ends[np.searchsorted(ends, np.arange(len(reward)))]
    return np.where((end - np.arange(len(reward))) % 2 == 0, reward[end], -reward[end]).astype(np.float32)

"""Self-play evaluation and its trainer hook: matches, W/D/L, the Elo table, the opponent pool's upkeep.

`play_match` runs many games side by side (one call per player per ply, seats alternating).
`SelfPlayHook` is attached by the trainer when the env is a self-play game (`attach_selfplay`): it
gives the vector env its `OpponentPool` of exported versions, refreshes the pool after every
update, and every `selfplay.eval_every` updates (and at the end) evaluates the agent being
trained (its in-process acting graph):

- W/D/L against the uniform random player and against the reference opponent: minimax of
  `selfplay.minimax_depth` on the built-in games, OpenSpiel's `MCTSBot` of
  `selfplay.mcts_simulations` on OpenSpiel's (the agent plays its argmax move; the opponents
  break ties at random, so games differ);
- on tic-tac-toe with perfect minimax, W/D/L over *every* line of perfect play (`every_perfect_line`)
  and over every line of every legal reply (`every_reply_line`): exact where sampled games are
  not (an agent that lost 0 of 200 sampled games was seen to lose 1 of 200 in the next
  evaluation);
- an Elo table (Bradley-Terry fit, 400-point logistic scale, random player anchored at 0) of
  random, the reference opponent, the last `selfplay.elo_snapshots` exported versions and the current agent, from
  a round robin in which every player samples its moves. Results of pairs that cannot change
  (random, the reference, saved snapshots) are cached, only the current agent's games are replayed.

Scalars go to TensorBoard under `eval/…`, every evaluation to `<run>/selfplay/eval.json`, and the
last one plus the history to `summary.json` under `selfplay/…`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlstack.config import Config, ConfigError
from rlstack.envs.games import Boards, Game, GameSpec
from rlstack.envs.minimax import Minimax, planes_to_bits
from rlstack.envs.players import (
    Player,
    PolicyPlayer,
    RandomPlayer,
    load_player,
    make_player,
    minimax_plays,
    moves,
)
from rlstack.envs.selfplay import OpponentPool, PoolSettings, SelfPlayVectorEnv
from rlstack.fsutil import atomic_write_text
from rlstack.search import SearchPlayer

if TYPE_CHECKING:
    from rlstack.acting import Acting
    from rlstack.logger import RunLogger

CURRENT = "current"
EXHAUSTIVE_MAX_CELLS = 9
"""Games up to this many cells (tic-tac-toe) are also evaluated against every line of perfect play."""
POOL_STATE_FILE = "selfplay_pool.json"


@dataclass(frozen=True)
class MatchResult:
    """Games of player A against player B, counted from A's side."""

    wins: int
    draws: int
    losses: int

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def score(self) -> float:
        """(wins + draws / 2) / games."""
        return (self.wins + 0.5 * self.draws) / max(self.games, 1)

    def as_dict(self) -> dict[str, float]:
        g = max(self.games, 1)
        return {"wins": self.wins, "draws": self.draws, "losses": self.losses, "games": self.games,
                "win_rate": self.wins / g, "draw_rate": self.draws / g, "loss_rate": self.losses / g,
                "score": self.score}


def play_match(spec: Game, a: Player, b: Player, games: int, rng: np.random.Generator) -> MatchResult:
    """`games` games of A against B side by side; A moves first in the even-numbered games."""
    if games < 1:
        raise ValueError(f"a match needs at least one game, got {games}")
    boards = spec.positions(games)
    seat_a = np.arange(games) % 2
    while not boards.over.all():
        for player, seat in ((a, seat_a), (b, 1 - seat_a)):
            idx = np.flatnonzero(~boards.over & (boards.to_move == seat))
            if len(idx):
                boards.play(moves(player, boards, idx, rng), idx)
    result = boards.result_for(seat_a)
    return MatchResult(int((result > 0).sum()), int((result == 0).sum()), int((result < 0).sum()))


def every_perfect_line(spec: GameSpec, agent: Player, perfect: Minimax,
                       rng: np.random.Generator | None = None) -> MatchResult:
    """The deterministic `agent` against *every* line of perfect play, in both seats: at the
    perfect player's turn every one of its optimal moves is followed, at the agent's turn its one
    move (one batched call per ply). Counts are of lines (leaves), from the agent's side, so
    `losses == 0` means no perfect player, however it breaks ties, can beat the agent.
    Only for small games (tic-tac-toe: a few hundred lines): the tree grows with every tie."""
    return every_line(spec, agent, lambda boards: [perfect.best_moves(*planes_to_bits(p)) for p in boards.planes()],
                      rng)


def every_reply_line(spec: GameSpec, agent: Player, rng: np.random.Generator | None = None) -> MatchResult:
    """The deterministic `agent` against *every* legal reply at every opponent turn, in both seats
    (tic-tac-toe: at most 8*6*4*2 + 9*7*5*3 = 1,329 lines). `losses == 0` means no opponent at all
    (random, perfect or any other) can beat the agent; `losses` counts the lines where some
    opponent can."""
    return every_line(spec, agent, lambda boards: [np.flatnonzero(m) for m in boards.legal_mask()], rng)


def every_line(spec: GameSpec, agent: Player, replies: Callable[[Boards], list], rng: np.random.Generator | None = None
               ) -> MatchResult:
    """The deterministic `agent` in both seats against an opponent that follows every move of
    `replies(boards)` (one list of moves per live game): counts of lines (leaves), from the
    agent's side. The agent is asked once per ply for all live lines."""
    rng = rng or np.random.default_rng(0)
    wins = draws = losses = 0
    for seat in (0, 1):
        boards = Boards(spec, 1)
        while True:
            over = np.flatnonzero(boards.over)
            result = boards.result_for(seat, over)
            wins, draws, losses = (wins + int((result > 0).sum()), draws + int((result == 0).sum()),
                                   losses + int((result < 0).sum()))
            boards = boards.take(np.flatnonzero(~boards.over))
            if not boards.n:
                break
            if boards.to_move[0] == seat:  # every live game is at the same ply
                boards.play(np.asarray(agent.act(boards.flat_obs(), rng)).reshape(-1))
                continue
            moves = replies(boards)
            boards = boards.take(np.repeat(np.arange(boards.n), [len(m) for m in moves]))
            boards.play(np.concatenate([np.asarray(m, np.int64) for m in moves]))
    return MatchResult(wins, draws, losses)


def elo_ratings(names: list[str], results: dict[tuple[str, str], MatchResult], anchor: str,
                prior_draws: float = 1.0, iterations: int = 500) -> dict[str, float]:
    """Bradley-Terry ratings on the Elo scale (400 * log10 of strength), `anchor` at 0.

    `prior_draws` virtual draws per played pair keep a perfect score finite (a standard
    regulariser). Fitted by the minorisation-maximisation updates of Hunter (2004).
    """
    index = {n: i for i, n in enumerate(names)}
    k = len(names)
    games = np.zeros((k, k))
    score = np.zeros((k, k))
    for (a, b), r in results.items():
        i, j = index[a], index[b]
        n = r.games + prior_draws
        s = r.wins + 0.5 * r.draws + 0.5 * prior_draws
        games[i, j] += n
        games[j, i] += n
        score[i, j] += s
        score[j, i] += n - s
    strength = np.ones(k)
    wins = score.sum(1)
    for _ in range(iterations):
        denom = (games / (strength[:, None] + strength[None, :])).sum(1)
        new = np.where(denom > 0, wins / np.maximum(denom, 1e-12), strength)
        new = new / np.exp(np.mean(np.log(np.maximum(new, 1e-300))))
        if np.allclose(new, strength, rtol=1e-10, atol=0):
            strength = new
            break
        strength = new
    elo = 400.0 * np.log10(np.maximum(strength, 1e-300))
    elo -= elo[index[anchor]]
    return {n: float(elo[index[n]]) for n in names}


class SelfPlayHook:
    """Keeps the opponent pool current and evaluates the agent every `selfplay.eval_every` updates."""

    def __init__(self, config: Config, envs: SelfPlayVectorEnv, out_dir: Path, policy_dir: Path, log: RunLogger,
                 agent: Callable[[], Acting], keep_best: Callable[[float, tuple[float, ...]], bool] | None = None):
        """`agent()` is the acting graph of the agent being trained; `keep_best(score, rank)`
        (`train.keep_best`) is told every evaluation and says whether it was the best so far."""
        cfg = config.selfplay
        self.cfg = cfg
        self.spec: Game = envs.game
        self.out = out_dir / "selfplay"
        self.policy_dir, self.log, self.agent, self.keep_best = policy_dir, log, agent, keep_best
        for key in ("eval_games", "minimax_depth", "mcts_simulations", "elo_games"):
            if getattr(cfg, key) < 1:
                raise ConfigError(f"'selfplay.{key}' must be >= 1, got {getattr(cfg, key)}")
        if cfg.eval_search < 0:
            raise ConfigError(f"'selfplay.eval_search' must be >= 0 simulations, got {cfg.eval_search}")
        if config.env.kwargs.get("opponent") is not None:
            # env.kwargs.opponent (random, minimax:D, perfect, a policy path) fixes the opponent:
            # no self-play pool, the evaluations still run.
            self.pool = envs.pool
        else:
            try:
                settings = PoolSettings(mode=cfg.opponents, size=cfg.pool_size, gate_score=cfg.gate_score,
                                        gate_min_games=cfg.gate_min_games, sample=cfg.opponent_sample,
                                        epsilon=cfg.opponent_epsilon, sparring=tuple(cfg.sparring),
                                        sparring_prob=cfg.sparring_prob)
                self.pool = OpponentPool(self.spec, policy_dir, settings)
            except ValueError as err:
                raise ConfigError(f"selfplay: {err}") from None
            envs.set_pool(self.pool)
        self.rng = np.random.default_rng(config.seed + 20_000)
        self.random = RandomPlayer(self.spec)
        self.reference = reference_opponent(self.spec, config)
        # Perfect minimax on a small board: also play every line of perfect play (exact).
        self.exhaustive = (isinstance(self.reference, Minimax) and self.reference.depth >= self.spec.n_cells
                           and self.spec.n_cells <= EXHAUSTIVE_MAX_CELLS)
        self._pairs: dict[tuple[str, str], MatchResult] = {}
        self._snapshots: dict[str, Player] = {}
        self.history: list[dict[str, Any]] = []
        self.last_eval_update = -1
        self.pool.refresh()
        if not config.train.export_every and self.pool.fixed is None:
            log.message("selfplay: train.export_every is 0, so no version is exported during "
                                "training and the opponent stays the uniform random player")

    # checkpoint extra: the gated pool's members and counters survive a resume
    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"pool": self.pool.state(), "history": self.history,
                                    "rng": self.rng.bit_generator.state,
                                    "minimax_rng": _rng_state(self.reference),
                                    "pairs": [[a, b, r.wins, r.draws, r.losses] for (a, b), r in self._pairs.items()]}))

    def load(self, path: Path) -> None:
        state = json.loads(path.read_text())
        self.pool.load_state(state.get("pool", {}))
        self.history = list(state.get("history", []))
        if "rng" in state:  # the evaluation games go on as in a run that was not stopped
            self.rng.bit_generator.state = state["rng"]
            if state["minimax_rng"] is not None:
                self.reference.rng.bit_generator.state = state["minimax_rng"]
            self._pairs = {(a, b): MatchResult(w, d, loss) for a, b, w, d, loss in state["pairs"]}
        self.pool.refresh()

    def __call__(self, counters: Any) -> None:
        """After every update (`counters`: the trainer's steps and updates): refresh the pool,
        log it, evaluate every `eval_every` updates."""
        added = self.pool.refresh()
        if added:
            self.log.message(f"selfplay: pool {self.pool.names} (joined: {', '.join(added)})")
        metrics = {"selfplay/pool_size": float(len(self.pool.members))}
        if self.pool.score is not None:
            metrics["selfplay/score_vs_pool"] = self.pool.score
        self.log.scalars(metrics, counters.steps)
        every = self.cfg.eval_every
        if every and counters.updates % every == 0:
            self.evaluate(counters)

    def evaluate(self, c: Any) -> dict[str, Any]:
        """W/D/L vs random and minimax, the Elo table; logged and appended to the history."""
        cfg, rng = self.cfg, self.rng
        agent = PolicyPlayer(self.agent(), sample=False, name=CURRENT)
        record: dict[str, Any] = {"steps": c.steps, "updates": c.updates}
        for opponent in (self.random, self.reference):
            result = play_match(self.spec, agent, opponent, cfg.eval_games, rng)
            record[f"vs_{opponent.name}"] = result.as_dict()
        if self.exhaustive:
            record["vs_every_perfect_line"] = every_perfect_line(self.spec, agent, self.reference, rng).as_dict()
            record["vs_every_line"] = every_reply_line(self.spec, agent, rng).as_dict()
        if cfg.eval_search:
            record["search"] = self._matches(SearchPlayer(agent.acting, self.spec, cfg.eval_search, name=CURRENT))
        elo, vs_snapshots = self._elo()
        record["elo"] = elo
        record["vs_snapshots"] = vs_snapshots
        record["pool"] = self.pool.names
        self.history.append(record)
        self.last_eval_update = c.updates
        scalars: dict[str, float] = {}
        for key in (f"vs_{self.random.name}", f"vs_{self.reference.name}"):
            for stat in ("win_rate", "draw_rate", "loss_rate"):
                scalars[f"eval/{key}/{stat}"] = record[key][stat]
        for name, result in vs_snapshots.items():
            scalars[f"eval/vs_snapshot/{name}/score"] = result["score"]
        for name, rating in elo.items():
            scalars[f"eval/elo/{name}"] = rating
        r, m = record[f"vs_{self.random.name}"], record[f"vs_{self.reference.name}"]
        lines, every = record.get("vs_every_perfect_line"), record.get("vs_every_line")
        text = ""
        if lines is not None:
            for stat in ("draw_rate", "loss_rate"):
                scalars[f"eval/vs_every_perfect_line/{stat}"] = lines[stat]
                scalars[f"eval/vs_every_line/{stat}"] = every[stat]
            text = (f", every perfect line W/D/L {lines['wins']}/{lines['draws']}/{lines['losses']}"
                    f", every line {every['wins']}/{every['draws']}/{every['losses']}")
        searched = record.get("search")
        if searched is not None:
            matches = {key: r for key, r in searched.items() if key != "simulations"}
            for key, result in matches.items():
                for stat in ("win_rate", "draw_rate", "loss_rate"):
                    scalars[f"eval/search/{key}/{stat}"] = result[stat]
            text += f"; with search of {searched['simulations']} simulations " + ", ".join(
                f"{key.removeprefix('vs_')} {r['wins']}/{r['draws']}/{r['losses']}" for key, r in matches.items())
        self.log.scalars(scalars, c.steps)
        # Fewest losing lines against any opponent, then against perfect play (where the game is
        # small enough to play every line); then the minimax games' wins minus losses, the fewest
        # losses against random, the most wins against random (`_rank`). With `eval_search` the
        # searching agent's losses come first (it is how the agent plays), then the policy's own
        # losses, then the wins of each.
        losses, wins = _rank(record, m, r)
        score = (m["wins"] - m["losses"]) / m["games"]
        if searched is not None:
            sm = searched[f"vs_{self.reference.name}"]
            search_losses, search_wins = _rank(searched, sm, searched[f"vs_{self.random.name}"])
            losses, wins = search_losses + losses, search_wins + wins
            score = (sm["wins"] - sm["losses"]) / sm["games"]
        rank = losses + wins
        if self.keep_best is not None and self.keep_best(score, rank):
            text += " (best so far)"
        self.log.message(
            f"selfplay eval @ {c.steps:,} steps: vs random W/D/L {r['wins']}/{r['draws']}/{r['losses']}, "
            f"vs {self.reference.name} {m['wins']}/{m['draws']}/{m['losses']}{text}, Elo current {elo[CURRENT]:.0f}")
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "eval.json", json.dumps(self.history, indent=2))
        return record

    def _matches(self, agent: SearchPlayer) -> dict[str, Any]:
        """The searching agent's W/D/L against random, minimax and (tic-tac-toe) every perfect line."""
        cfg, rng = self.cfg, self.rng
        out: dict[str, Any] = {f"vs_{o.name}": play_match(self.spec, agent, o, cfg.eval_games, rng).as_dict()
                               for o in (self.random, self.reference)}
        if self.exhaustive:
            out["vs_every_perfect_line"] = every_perfect_line(self.spec, agent, self.reference, rng).as_dict()
            out["vs_every_line"] = every_reply_line(self.spec, agent, rng).as_dict()
        out["simulations"] = cfg.eval_search
        return out

    def _elo(self) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        from rlstack.artifact import list_versions

        cfg, rng = self.cfg, self.rng
        versions = list_versions(self.policy_dir, scheduled=True)[-cfg.elo_snapshots:]
        for v in versions:
            if v.name not in self._snapshots:
                self._snapshots[v.name] = load_player(v, self.spec, sample=True)
        players: dict[str, Player] = {self.random.name: self.random, self.reference.name: self.reference}
        players.update({v.name: self._snapshots[v.name] for v in versions})
        players[CURRENT] = PolicyPlayer(self.agent(), sample=True, name=CURRENT)
        names = list(players)
        results: dict[tuple[str, str], MatchResult] = {}
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                key = (a, b)
                if CURRENT in key or key not in self._pairs:
                    result = play_match(self.spec, players[a], players[b], cfg.elo_games, rng)
                    if CURRENT not in key:
                        self._pairs[key] = result
                results[key] = self._pairs.get(key) or result
        vs_snapshots = {b: results[(a, b)] for (a, b) in results if a == CURRENT}
        vs_snapshots.update({a: _flip(results[(a, b)]) for (a, b) in results if b == CURRENT})
        snapshots = {v.name for v in versions}
        vs_snapshots = {k: v.as_dict() for k, v in vs_snapshots.items() if k in snapshots}
        return elo_ratings(names, results, anchor=self.random.name), vs_snapshots

    def finish(self, counters: Any, again: bool = False) -> dict[str, Any]:
        """Final evaluation (unless the last update was just evaluated and `again` is False, as it
        is when the final policy is the best evaluation's) -> `summary.json` entries."""
        if again or self.last_eval_update != counters.updates:
            self.evaluate(counters)
        last = self.history[-1]
        return {
            "selfplay/vs_random": last[f"vs_{self.random.name}"],
            f"selfplay/vs_{self.reference.name}": last[f"vs_{self.reference.name}"],
            "selfplay/vs_every_perfect_line": last.get("vs_every_perfect_line"),
            "selfplay/vs_every_line": last.get("vs_every_line"),
            "selfplay/search": last.get("search"),
            "selfplay/vs_snapshots": last["vs_snapshots"],
            "selfplay/elo": last["elo"],
            "selfplay/pool": self.pool.names,
            "selfplay/pool_record": dict(self.pool.totals),
            "selfplay/pool_played": dict(self.pool.played),
            "selfplay/history": self.history,
        }


def _rank(record: dict, minimax: dict, random: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An evaluation's rank for `train.keep_best` (larger is better), as (losses, wins): where
    every line was played (tic-tac-toe), the fewest losing lines against any reply, then against
    perfect play; then the most minimax wins minus losses (against perfect play: the fewest
    losses), the fewest losses against random; then the most wins against random."""
    every, perfect = record.get("vs_every_line"), record.get("vs_every_perfect_line")  # both or neither
    lines = (-every["losses"], -perfect["losses"]) if every is not None else ()
    return (*lines, minimax["wins"] - minimax["losses"], -random["losses"]), (random["wins"],)


def _rng_state(player: Player) -> dict | None:
    """A player's RNG state (minimax's, MCTS's), or None for one without (the random players draw
    from the match's generator)."""
    rng = getattr(player, "rng", None)
    return None if rng is None else rng.bit_generator.state


def _flip(result: MatchResult) -> MatchResult:
    return MatchResult(result.losses, result.draws, result.wins)


def reference_opponent(spec: Game, config: Config) -> Player:
    """`selfplay.reference`: minimax of `selfplay.minimax_depth` (the built-in games, and OpenSpiel's
    with their rules), OpenSpiel's MCTS of `selfplay.mcts_simulations` (OpenSpiel's games), the game
    solved (`perfect`); `auto` picks minimax or MCTS as the game allows, else a second uniform
    random player (`uniform`). The players are `envs.players.make_player`'s."""
    kind = config.selfplay.reference
    if kind == "auto":
        kind = ("minimax" if minimax_plays(spec) else "mcts" if getattr(spec, "openspiel", None) is not None
                else "uniform")
    if kind == "uniform":
        return RandomPlayer(spec, name="uniform")
    name = {"minimax": f"minimax:{config.selfplay.minimax_depth}",
            "mcts": f"mcts:{config.selfplay.mcts_simulations}"}.get(kind, kind)
    try:
        return make_player(spec, name, seed=config.seed + 30_000)
    except ValueError as err:
        raise ConfigError(f"selfplay.reference: {kind} does not play {spec.name}: {err}") from None


def attach_selfplay(config: Config, envs: Any, out_dir: Path, policy_dir: Path, log: RunLogger,
                    agent: Callable[[], Acting], keep_best: Callable[[float, tuple[float, ...]], bool] | None
                    ) -> SelfPlayHook | None:
    """The hook for a self-play game env (envs/selfplay.py); None for any other env."""
    if not isinstance(envs, SelfPlayVectorEnv):
        return None
    return SelfPlayHook(config, envs, out_dir, policy_dir, log, agent, keep_best)

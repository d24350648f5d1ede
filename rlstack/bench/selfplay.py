"""`python -m rlstack.bench selfplay`: a self-play run per seed (Connect Four, tic-tac-toe, or the game
of `--config`, e.g. an OpenSpiel game), then the exported agent's W/D/L over N games with seats
alternating against the random player and the game's reference opponents (minimax of each
`--depths` on the built-in games, OpenSpiel's `MCTSBot` of each `--mcts` simulations on OpenSpiel's):
its policy's argmax moves, and with `--search N` also the agent searching N simulations per move on
the same graph (reported apart); then an Elo table of the agents and the opponents (`--elo-games`
games per pair of opponents; random at 0).

Prints JSON per seed: steps/s, wall time, the time split, for a search learner the self-play games
and graph calls per second, and the results. Targets: PPO Connect Four (`ppo_connect4_selfplay`)
>= 95% wins against random and >= 60% against depth-2 minimax; AlphaZero Connect Four
(`alphazero_connect4`) >= 90% wins against depth-4 minimax. Run directories are kept (`--out`,
default fresh `runs/bench_selfplay_*`), so an agent can be played afterwards with
`python -m rlstack.play <out>/seed<N> [--search N]`.

    python -m rlstack.bench selfplay --config alphazero_connect4 --seeds 0,1 --jobs 2 --depths 2,4 --search 64
    python -m rlstack.bench selfplay --config alphazero_othello --seeds 0 --mcts 100,1000 --search 200 --games 100
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = {"connect4": "ppo_connect4_selfplay", "tictactoe": "ppo_tictactoe_selfplay"}
TARGETS = {"ppo_connect4_selfplay": {"random": 0.95, "minimax_d2": 0.60}, "alphazero_connect4": {"minimax_d4": 0.90},
           "alphazero_openspiel_connect4": {"minimax_d4": 0.90}, "alphazero_othello": {"mcts100": 0.90},
           "alphazero_hex7": {"mcts100": 0.90}}
"""Win rates the shipped configs aim for (config name -> opponent -> wins / games)."""


def train(config: str, out: Path, seed: int | None, overrides: list[str]) -> dict[str, Any]:
    """One training run; the benchmark's summary of it."""
    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    extra = [f"seed={seed}"] if seed is not None else []
    cfg = load_config(config, ["train.progress=log", *extra, *overrides])
    summary = Trainer(cfg, out).train()
    split = summary["time_split_seconds"]
    result = {"seed": cfg.seed, "n_envs": cfg.env.n_envs, "total_steps": summary["total_steps"],
              "updates": summary["updates"], "wall_seconds": round(summary["wall_seconds"], 1),
              "steps_per_second": round(summary["steps_per_second"], 1),
              "time_split_seconds": {k: round(v, 1) for k, v in split.items()}, "elo": summary.get("selfplay/elo")}
    games = summary.get("selfplay/games")
    if games is not None:  # a search learner's self-play
        result["selfplay_games"] = games
    return result


def opponents(spec: Any, depths: list[int], mcts: list[int]) -> dict[str, Any]:
    """Random, and the game's reference opponents (`envs.players.make_player`): minimax of each
    depth (the built-in games, and OpenSpiel's with their rules) and OpenSpiel's MCTS of each
    simulation count (OpenSpiel's games)."""
    from rlstack.envs.players import make_player, minimax_plays

    players: dict[str, Any] = {"random": make_player(spec, "random")}
    if minimax_plays(spec):
        players.update({f"minimax_d{d}": make_player(spec, f"minimax:{d}", seed=54321) for d in depths})
    if getattr(spec, "openspiel", None) is not None:
        players.update({f"mcts{n}": make_player(spec, f"mcts:{n}", seed=54321) for n in mcts})
    return players


def evaluate(out: Path, game: str, games: int, depths: list[int], search: int, mcts: list[int] | None = None,
             elo_games: int = 0, policy_matches: bool = True) -> dict[str, Any]:
    """The exported agent (argmax moves unless not `policy_matches`; and searching `search`
    simulations) against random and the reference opponents (`opponents`), `games` games each,
    seats alternating; with `elo_games`, the opponents' pairs too and an Elo table of everyone."""
    import numpy as np

    from rlstack.envs.games import game_spec
    from rlstack.envs.players import load_player
    from rlstack.search import SearchPlayer
    from rlstack.selfplay_eval import MatchResult, elo_ratings, play_match

    spec = game_spec(game)
    policy = load_player(out, spec, sample=False)  # the exported graph
    agents = {"policy": policy} if policy_matches or not search else {}
    if search:
        agents[f"search{search}"] = SearchPlayer(policy.acting, spec, search)
    others = opponents(spec, depths, mcts or [])
    result: dict[str, Any] = {"game": spec.name, "policy_version": policy.name, "eval_games": games}
    pairs: dict[tuple[str, str], MatchResult] = {}
    for label, agent in agents.items():
        rng = np.random.default_rng(12345)
        start = time.perf_counter()
        rows: dict[str, Any] = {}
        for name, opponent in others.items():
            pairs[(label, name)] = play_match(spec, agent, opponent, games, rng)
            rows[name] = pairs[(label, name)].as_dict()
        rows["eval_seconds"] = round(time.perf_counter() - start, 1)
        result[label] = rows
    if elo_games:
        rng = np.random.default_rng(777)
        names = list(others)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                pairs[(a, b)] = play_match(spec, others[a], others[b], elo_games, rng)
        result["elo"] = {name: round(rating) for name, rating in
                         elo_ratings([*agents, *names], pairs, anchor="random").items()}
    return result


def _one(config: str, out: str, seed: int | None, overrides: list[str], game: str | None, games: int,
         depths: list[int], search: int, eval_only: bool, mcts: list[int], elo_games: int,
         policy_matches: bool = True) -> dict[str, Any]:
    from rlstack.config import load_config
    from rlstack.envs.games import env_game
    from rlstack.runtime import configure

    result: dict[str, Any] = {"run_dir": out}
    if eval_only:
        configure("cpu", "auto")
    else:
        result.update(train(config, Path(out), seed, overrides))
    if game is None:  # the config's game
        cfg = load_config(config, overrides)
        game = env_game(cfg.env.id, cfg.env.kwargs)
    result.update(evaluate(Path(out), game, games, depths, search, mcts, elo_games, policy_matches))
    targets = TARGETS.get(Path(config).stem, {})
    if targets:
        result["targets"] = targets
        # (a target whose opponent was not played is not judged: None)
        result["target_met"] = {label: all(result[label][name]["win_rate"] >= rate for name, rate in targets.items())
                                if all(name in result[label] for name in targets) else None
                                for label in result if label == "policy" or label.startswith("search")}
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench selfplay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", choices=sorted(DEFAULT_CONFIG), default=None,
                        help="with no --config: PPO self-play on this game (default connect4)")
    parser.add_argument("--config", default=None, help="config file or shipped name (default: ppo_<game>_selfplay); "
                                                       "the game is the config's")
    parser.add_argument("--out", default=None, help="run directory (default: runs/bench_selfplay_<game>_<time>); "
                                                    "with several seeds, one seed<N> folder each")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the config's)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained side by side (default: 1)")
    parser.add_argument("--games", type=int, default=200, help="evaluation games per opponent")
    parser.add_argument("--depth", type=int, default=None, help="depth of the minimax opponent (one depth)")
    parser.add_argument("--depths", default="2", help="comma-separated minimax depths (default: 2)")
    parser.add_argument("--mcts", default="100", help="comma-separated simulations of OpenSpiel's MCTS opponents "
                                                     "(OpenSpiel games; default: 100)")
    parser.add_argument("--elo-games", type=int, default=20,
                        help="games per pair of opponents for the Elo table (0: no table; default 20)")
    parser.add_argument("--search", type=int, default=0, metavar="N",
                        help="also evaluate the agent searching N simulations per move (default 0: off)")
    parser.add_argument("--no-policy", action="store_true",
                        help="with --search: play only the searching agent, not the policy's own moves "
                             "(each match against MCTS of 1,000 simulations takes minutes)")
    parser.add_argument("--eval-only", action="store_true", help="evaluate the policies already in --out")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.total_steps=200000")
    args = parser.parse_args(argv)
    from rlstack.config import config_path

    config = str(config_path(args.config or DEFAULT_CONFIG[args.game or "connect4"]))
    game = None if args.config else args.game or "connect4"
    mcts = [int(n) for n in args.mcts.split(",") if n]
    depths = [args.depth] if args.depth is not None else [int(d) for d in args.depths.split(",") if d]
    seeds: list[int | None] = [int(s) for s in args.seeds.split(",")] if args.seeds else [None]
    out = Path(args.out or f"runs/bench_selfplay_{Path(config).stem}_{time.strftime('%Y%m%d-%H%M%S')}")
    outs = [out] if len(seeds) == 1 else [out / f"seed{s}" for s in seeds]
    jobs = [(config, str(o), s, args.overrides, game, args.games, depths, args.search, args.eval_only, mcts,
             args.elo_games, not args.no_policy) for o, s in zip(outs, seeds, strict=True)]
    start = time.perf_counter()
    if args.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(min(args.jobs, len(jobs))) as pool:
            results = list(pool.map(_one, *zip(*jobs, strict=True)))
    else:
        results = [_one(*job) for job in jobs]
    report = {"benchmark": "selfplay", "config": config,
              "wall_seconds": round(time.perf_counter() - start, 1), "runs": results}
    print(json.dumps(report, indent=2))
    return 0

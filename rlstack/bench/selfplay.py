"""`python -m rlstack.bench selfplay`: a Connect Four (or tic-tac-toe) self-play run per seed, then the
exported agent's W/D/L against the random player and against minimax of each `--depths` over N
games with seats alternating: its policy's argmax moves, and with `--search N` also the agent
searching N simulations per move on the same graph (reported apart).

Prints JSON per seed: steps/s, wall time, the time split, for a search learner the self-play games
and graph calls per second, and the results. Targets: PPO Connect Four (`ppo_connect4_selfplay`)
>= 95% wins against random and >= 60% against depth-2 minimax; AlphaZero Connect Four
(`alphazero_connect4`) >= 90% wins against depth-4 minimax. Run directories are kept (`--out`,
default fresh `runs/bench_selfplay_*`), so an agent can be played afterwards with
`python -m rlstack.play <out>/seed<N> [--search N]`.

    python -m rlstack.bench selfplay --config alphazero_connect4 --seeds 0,1 --jobs 2 --depths 2,4 --search 64
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = {"connect4": "ppo_connect4_selfplay", "tictactoe": "ppo_tictactoe_selfplay"}
TARGETS = {"ppo_connect4_selfplay": {"random": 0.95, "minimax_d2": 0.60}, "alphazero_connect4": {"minimax_d4": 0.90}}
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


def evaluate(out: Path, game: str, games: int, depths: list[int], search: int) -> dict[str, Any]:
    """The exported agent (argmax moves; and searching `search` simulations) against random and
    minimax of each depth, `games` games each, seats alternating."""
    import numpy as np

    from rlstack.envs.games import game_spec
    from rlstack.envs.minimax import Minimax
    from rlstack.envs.selfplay import RandomPlayer, load_player
    from rlstack.search import SearchPlayer
    from rlstack.selfplay_eval import play_match

    spec = game_spec(game)
    policy = load_player(out, spec, sample=False)  # the exported graph
    agents = {"policy": policy}
    if search:
        agents[f"search{search}"] = SearchPlayer(policy.acting, spec, search)
    result: dict[str, Any] = {"policy_version": policy.name, "eval_games": games}
    for label, agent in agents.items():
        rng = np.random.default_rng(12345)
        start = time.perf_counter()
        rows = {"random": play_match(spec, agent, RandomPlayer(spec), games, rng).as_dict()}
        for depth in depths:
            rows[f"minimax_d{depth}"] = play_match(spec, agent, Minimax(spec, depth, seed=54321), games, rng).as_dict()
        rows["eval_seconds"] = round(time.perf_counter() - start, 1)
        result[label] = rows
    return result


def _one(config: str, out: str, seed: int | None, overrides: list[str], game: str, games: int,
         depths: list[int], search: int, eval_only: bool) -> dict[str, Any]:
    from rlstack.runtime import configure

    result: dict[str, Any] = {"run_dir": out}
    if eval_only:
        configure("cpu", "auto")
    else:
        result.update(train(config, Path(out), seed, overrides))
    result.update(evaluate(Path(out), game, games, depths, search))
    targets = TARGETS.get(Path(config).stem, {})
    if targets:
        result["targets"] = targets
        result["target_met"] = {label: all(result[label][name]["win_rate"] >= rate for name, rate in targets.items()
                                           if name in result[label])
                                for label in result if label == "policy" or label.startswith("search")}
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench selfplay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", choices=sorted(DEFAULT_CONFIG), default="connect4")
    parser.add_argument("--config", default=None, help="config file or shipped name (default: ppo_<game>_selfplay)")
    parser.add_argument("--out", default=None, help="run directory (default: runs/bench_selfplay_<game>_<time>); "
                                                    "with several seeds, one seed<N> folder each")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the config's)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained side by side (default: 1)")
    parser.add_argument("--games", type=int, default=200, help="evaluation games per opponent")
    parser.add_argument("--depth", type=int, default=None, help="depth of the minimax opponent (one depth)")
    parser.add_argument("--depths", default="2", help="comma-separated minimax depths (default: 2)")
    parser.add_argument("--search", type=int, default=0, metavar="N",
                        help="also evaluate the agent searching N simulations per move (default 0: off)")
    parser.add_argument("--eval-only", action="store_true", help="evaluate the policies already in --out")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.total_steps=200000")
    args = parser.parse_args(argv)
    from rlstack.config import config_path

    config = str(config_path(args.config or DEFAULT_CONFIG[args.game]))
    depths = [args.depth] if args.depth is not None else [int(d) for d in args.depths.split(",") if d]
    seeds: list[int | None] = [int(s) for s in args.seeds.split(",")] if args.seeds else [None]
    out = Path(args.out or f"runs/bench_selfplay_{args.game}_{time.strftime('%Y%m%d-%H%M%S')}")
    outs = [out] if len(seeds) == 1 else [out / f"seed{s}" for s in seeds]
    jobs = [(config, str(o), s, args.overrides, args.game, args.games, depths, args.search, args.eval_only)
            for o, s in zip(outs, seeds, strict=True)]
    start = time.perf_counter()
    if args.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(min(args.jobs, len(jobs))) as pool:
            results = list(pool.map(_one, *zip(*jobs, strict=True)))
    else:
        results = [_one(*job) for job in jobs]
    report = {"benchmark": "selfplay", "game": args.game, "config": config,
              "wall_seconds": round(time.perf_counter() - start, 1), "runs": results}
    print(json.dumps(report, indent=2))
    return 0

"""`python -m rlstack.bench selfplay`: a Connect Four (or tic-tac-toe) self-play run, then the exported
agent's W/D/L against the random player and against minimax over N games with seats alternating.

Prints JSON: steps/s, wall time, the time split, and the results against the targets
(Connect Four: >= 95% wins against random and >= 60% against depth-2 minimax over 200 games).
The run directory is kept (`--out`, default a fresh `runs/bench_selfplay_*`), so the agent can be
played afterwards with `python -m rlstack.play <out>`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DEFAULT_CONFIG = {"connect4": "ppo_connect4_selfplay", "tictactoe": "ppo_tictactoe_selfplay"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench selfplay")
    parser.add_argument("--game", choices=sorted(DEFAULT_CONFIG), default="connect4")
    parser.add_argument("--config", default=None, help="config file (default: configs/ppo_<game>_selfplay.yaml)")
    parser.add_argument("--out", default=None, help="run directory (default: runs/bench_selfplay_<game>_<time>)")
    parser.add_argument("--games", type=int, default=200, help="evaluation games per opponent")
    parser.add_argument("--depth", type=int, default=2, help="depth of the minimax opponent")
    parser.add_argument("--eval-only", action="store_true", help="evaluate the policy already in --out")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.total_steps=200000")
    args = parser.parse_args(argv)

    import numpy as np

    from rlstack.config import config_path, load_config
    from rlstack.envs.games import game_spec
    from rlstack.envs.minimax import Minimax
    from rlstack.envs.selfplay import RandomPlayer, load_player
    from rlstack.runtime import configure
    from rlstack.selfplay_eval import play_match
    from rlstack.trainer import Trainer

    spec = game_spec(args.game)
    config = config_path(args.config or DEFAULT_CONFIG[args.game])
    out = Path(args.out or f"runs/bench_selfplay_{args.game}_{time.strftime('%Y%m%d-%H%M%S')}")
    result: dict = {"benchmark": "selfplay", "game": spec.name, "run_dir": str(out)}
    if not args.eval_only:
        cfg = load_config(config, ["train.progress=log", *args.overrides])
        summary = Trainer(cfg, out).train()
        split = summary["time_split_seconds"]
        result.update({
            "n_envs": cfg.env.n_envs, "total_steps": summary["total_steps"], "updates": summary["updates"],
            "wall_seconds": round(summary["wall_seconds"], 1),
            "steps_per_second": round(summary["steps_per_second"], 1),
            "time_split_seconds": {k: round(v, 1) for k, v in split.items()},
            "elo": summary.get("selfplay/elo"),
        })
    else:
        configure("cpu", "auto")
    agent = load_player(out, spec, sample=False)  # the exported graph, argmax moves
    rng = np.random.default_rng(12345)
    t = time.perf_counter()
    vs_random = play_match(spec, agent, RandomPlayer(spec), args.games, rng)
    vs_minimax = play_match(spec, agent, Minimax(spec, args.depth, seed=54321), args.games, rng)
    result.update({
        "policy_version": agent.name,
        "eval_games": args.games,
        "vs_random": vs_random.as_dict(),
        f"vs_minimax_d{args.depth}": vs_minimax.as_dict(),
        "eval_seconds": round(time.perf_counter() - t, 1),
    })
    if spec.name == "connect4" and args.depth == 2:
        result["target_met"] = bool(vs_random.wins >= 0.95 * vs_random.games
                                    and vs_minimax.wins >= 0.60 * vs_minimax.games)
    print(json.dumps(result, indent=2))
    return 0

"""`python -m rlstack.bench search --config alphazero_connect4 [--finished N] [--repeats R]`: the
search's self-play speed with the priors entry point (one row per leaf) against the acting graph's
forced rows (one row per move of each leaf), same config, same process, alternating.

Plays the config's self-play (`train.games` games side by side, `train.simulations` per move) with
its network freshly initialised and exported, until `--finished` games have ended, once per mode and
repeat; prints each mode's graph calls per second and games per second (medians and ranges over
the repeats, after a warm-up round of each) as JSON. The games differ between the modes only as far as the two evaluations differ
in their last bits (tests/rlstack/test_priors.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench search", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="alphazero_connect4", help="a search learner's config (algo alphazero)")
    parser.add_argument("--finished", type=int, default=None, help="games to finish per measurement "
                                                                    "(default: train.games)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per mode, alternating (default 3)")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
    args = parser.parse_args(argv)

    import gymnasium as gym
    import numpy as np

    from rlstack.acting import Acting, load_policy
    from rlstack.artifact import export_policy
    from rlstack.config import load_config
    from rlstack.envs.games import env_game, game_spec
    from rlstack.network import NetSpec, Network, PolicyKind
    from rlstack.search import SelfPlayGames, acting_evaluator

    cfg = load_config(args.config, args.overrides)
    if cfg.algo != "alphazero":
        raise SystemExit(f"--config {args.config} is algo {cfg.algo}; the search benchmark needs algo alphazero")
    spec = game_spec(env_game(cfg.env.id, cfg.env.kwargs))
    space, actions = spec.flat_space(), gym.spaces.Discrete(spec.n_actions)
    net = Network(space, actions, NetSpec.of(cfg.net, policy=PolicyKind.CATEGORICAL, value=True))
    finished = args.finished or cfg.train.games
    samples: dict[str, list[dict[str, float]]] = {"priors": [], "forced_rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        version = export_policy(net, Path(tmp), algorithm="alphazero", obs_space=space, action_space=actions,
                                device="cpu", fusion=False, config_hash="bench")
        policy = load_policy(version)
        modes = {"priors": policy, "forced_rows": Acting(policy.cell, policy.manifest, policy.path)}
        for repeat in range(-1, args.repeats):  # -1: a warm-up round (compiles, first calls), not counted
            for mode, acting in modes.items():
                games = SelfPlayGames(spec, acting_evaluator(acting), cfg.train.search_settings(), cfg.train.games,
                                      cfg.train.temperature_moves, np.random.default_rng([cfg.seed, repeat + 1]))
                games.play(finished if repeat >= 0 else 1)
                stats = games.stats()
                if repeat >= 0:
                    samples[mode].append(stats)
                print(f"{mode:12s} {'warm-up' if repeat < 0 else f'repeat {repeat}'}: "
                      f"{stats['graph_calls_per_second']:.0f} graph calls/s, "
                      f"{stats['games_per_second']:.2f} games/s ({stats['games']} games)", flush=True)
    rows = {}
    for mode, runs in samples.items():
        rows[mode] = {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                            "max": max(r[key] for r in runs)}
                      for key in ("graph_calls_per_second", "games_per_second")}
    print(json.dumps({"config": args.config, "game": spec.name, "games_side_by_side": cfg.train.games,
                      "simulations": cfg.train.simulations, "finished_per_measurement": finished, **rows}, indent=2))
    return 0

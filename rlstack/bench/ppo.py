"""`python -m rlstack.bench ppo`: PPO CartPole-v1 (Zoo config) throughput with its time split, as JSON."""

from __future__ import annotations

import argparse
import json
import tempfile


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench ppo")
    parser.add_argument("--config", default=None, help="config file (default: configs/ppo_cartpole.yaml)")
    parser.add_argument("--solved", type=float, default=475.0, help="training mean return that counts as solved")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.total_steps=50000")
    args = parser.parse_args(argv)

    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    cfg = load_config(args.config, ["train.progress=off", *args.overrides])
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg, out)
        summary = trainer.train()
    history = trainer.history
    # The first update includes graph compilation; steady state is measured after it.
    first_steps, _, first_t = history[0]
    last_steps, _, last_t = history[-1]
    solved = next((steps for steps, ret, _ in history if ret is not None and ret >= args.solved), None)
    split = summary["time_split_seconds"]
    result = {
        "benchmark": "ppo",
        "env": cfg.env.id,
        "n_envs": cfg.env.n_envs,
        "total_steps": summary["total_steps"],
        "wall_seconds": round(summary["wall_seconds"], 2),
        "steps_per_second": round(summary["steps_per_second"], 1),
        "steps_per_second_after_compile": round((last_steps - first_steps) / max(last_t - first_t, 1e-9), 1),
        "first_update_seconds_incl_compile": round(first_t, 2),
        "time_split_seconds": {k: round(v, 2) for k, v in split.items()},
        "time_split_percent": {k: round(100 * v / summary["wall_seconds"], 1) for k, v in split.items()},
        "act_ms_per_call": round(1e3 * split["act"] / max(summary["total_steps"] / cfg.env.n_envs, 1), 3),
        "learn_ms_per_update": round(1e3 * split["learn"] / max(summary["updates"], 1), 2),
        "solved_at_steps": solved,
        "eval_mean_return": summary["eval/mean_return"],
    }
    print(json.dumps(result, indent=2))
    return 0

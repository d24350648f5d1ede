"""`python -m rlstack.bench dqn|sac`: off-policy throughput (steps/s with the env / acting graph /
update split) and final evaluation over one or more seeds, printed as JSON."""

from __future__ import annotations

import argparse
import json
import tempfile


def run(name: str, default_config: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m rlstack.bench {name}")
    parser.add_argument("--config", default=default_config, help=f"config file (default: {default_config})")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, one training run each (e.g. 0,1,2,3,4)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.total_steps=20000")
    args = parser.parse_args(argv)

    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        cfg = load_config(args.config, ["train.progress=off", f"seed={seed}", *args.overrides])
        with tempfile.TemporaryDirectory() as out:
            trainer = Trainer(cfg, out)
            summary = trainer.train()
        t = cfg.train
        split = summary["time_split_seconds"]
        vector_steps = summary["total_steps"] / cfg.env.n_envs
        acting_steps = max(vector_steps - t.learning_starts / cfg.env.n_envs, 1)  # random actions before
        # Steady state: from the first log point after the first update (which compiles the graph).
        first_update = t.learning_starts + t.train_freq * cfg.env.n_envs
        history = [h for h in trainer.history if h[0] > first_update]
        steady = (history[-1][0] - history[0][0]) / max(history[-1][2] - history[0][2], 1e-9) \
            if len(history) > 1 else None
        runs.append({
            "seed": seed,
            "eval_mean_return": summary["eval/mean_return"],
            "eval_std_return": summary["eval/std_return"],
            "wall_seconds": round(summary["wall_seconds"], 2),
            "steps_per_second": round(summary["steps_per_second"], 1),
            "steps_per_second_after_first_update": None if steady is None else round(steady, 1),
            "time_split_seconds": {k: round(v, 2) for k, v in split.items()},
            "act_ms_per_call": round(1e3 * split["act"] / acting_steps, 3),
            "env_ms_per_vector_step": round(1e3 * split["env"] / max(vector_steps, 1), 3),
            "learn_ms_per_update": round(1e3 * split["learn"] / max(summary["updates"], 1), 2),
            "learn_ms_per_gradient_step": round(
                1e3 * split["learn"] / max(summary["updates"] * t.gradient_steps, 1), 3),
        })
    cfg = load_config(args.config, args.overrides)
    result = {
        "benchmark": name,
        "env": cfg.env.id,
        "n_envs": cfg.env.n_envs,
        "total_steps": cfg.train.total_steps,
        "gradient_steps_per_update": cfg.train.gradient_steps,
        "graph_calls_per_gradient_step": 1,
        "runs": runs,
        "eval_mean_return_over_seeds": sum(r["eval_mean_return"] for r in runs) / len(runs),
        "steps_per_second_over_seeds": sum(r["steps_per_second"] for r in runs) / len(runs),
    }
    print(json.dumps(result, indent=2))
    return 0

"""`python -m rlstack.bench update --configs sac_halfcheetah,td3_halfcheetah [--python VENV/bin/python]`:
milliseconds per gradient step of an off-policy algorithm, beside Stable-Baselines3's.

Where a run's speed is mostly its gradient steps (SAC and TD3 on MuJoCo take one per environment
step), this times that step alone: rlstack's `learn` (sampling the minibatch, the step's graph
calls, reading the losses) and, with `--python`, SB3's `train(gradient_steps=...)` (sampling, the
step, its logging) on the same config, each on a replay buffer of `--fill` random transitions
drawn from the env's spaces. The sides alternate within each of `--repeats` rounds (SB3 in the
peer's interpreter, built again each round); each row gives the median and min-max over the
rounds of milliseconds per gradient step, each round's figure the mean of `--calls` calls after
as many warm-up calls.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

# Imported before MindSpore is: the peer's environment as this command started.
from rlstack.bench.conv import spread
from rlstack.bench.peer import FIXED, SB3_BUILD, run_sb3, sb3_spec

SB3_UPDATE = SB3_BUILD + r"""
from stable_baselines3.common.logger import configure as configure_logger

model.set_logger(configure_logger(None, []))
fill, calls, steps = spec["fill"], spec["calls"], spec["kwargs"]["gradient_steps"]
n = env.num_envs
rng = np.random.default_rng(spec["seed"])
model.observation_space.seed(spec["seed"])
model.action_space.seed(spec["seed"])
for _ in range(fill // n):
    obs, next_obs = (np.stack([model.observation_space.sample() for _ in range(n)]) for _ in range(2))
    action = np.stack([model.action_space.sample() for _ in range(n)])
    model.replay_buffer.add(obs, next_obs, action, rng.standard_normal(n).astype(np.float32), np.zeros(n, bool),
                            [{} for _ in range(n)])
for _ in range(calls):
    model.train(gradient_steps=steps, batch_size=model.batch_size)
start = time.perf_counter()
for _ in range(calls):
    model.train(gradient_steps=steps, batch_size=model.batch_size)
ms = (time.perf_counter() - start) / (calls * steps) * 1e3
print(json.dumps({"ms_per_gradient_step": ms, "torch": torch.__version__, "threads": torch.get_num_threads()}))
"""


def rlstack_step(cfg, fill: int) -> Callable[[int], float]:
    """A function timing `calls` calls of the algorithm's `learn` on a replay of `fill` random
    transitions: milliseconds per gradient step."""
    import numpy as np

    from rlstack import registry
    from rlstack.envs.make import make_env
    from rlstack.registry import Progress
    from rlstack.replay import make_replay
    from rlstack.runtime import configure

    configure(cfg.device, cfg.fusion)
    env = make_env(cfg.env.id, cfg.env.kwargs, imports=cfg.env.imports)
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    algo = registry.get(cfg.algo).build(cfg, obs_space, action_space)
    if algo.data_path != registry.DataPath.REPLAY:
        raise SystemExit(f"bench update times algorithms that learn from a replay buffer, not {cfg.algo}")
    replay = make_replay(fill, obs_space, action_space)
    rng = np.random.default_rng(cfg.seed)
    obs_space.seed(cfg.seed)
    action_space.seed(cfg.seed)
    for _ in range(fill):
        replay.add(obs_space.sample()[None], np.asarray(action_space.sample())[None],
                   rng.standard_normal(1).astype(np.float32), obs_space.sample()[None], np.zeros(1, bool),
                   np.zeros(1, bool))
    progress = Progress(cfg.train.learning_starts, 1.0)

    def timed(calls: int) -> float:
        for _ in range(calls):
            algo.learn(replay, progress, rng)
        start = time.perf_counter()
        for _ in range(calls):
            algo.learn(replay, progress, rng)
        return (time.perf_counter() - start) / (calls * cfg.train.gradient_steps) * 1e3

    return timed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench update", description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="sac_halfcheetah,td3_halfcheetah",
                        help="comma-separated shipped config names or YAML paths of off-policy algorithms")
    parser.add_argument("--python", default=None, help="interpreter of a venv with stable-baselines3 and torch")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, the sides alternating in each")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per round (after as many untimed)")
    parser.add_argument("--fill", type=int, default=10_000, help="random transitions in the replay buffer")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both sides")
    args = parser.parse_args(argv)

    from rlstack.config import load_config

    rows = []
    for name in args.configs.split(","):
        cfg = load_config(name, [*FIXED, *args.overrides])
        timed = rlstack_step(cfg, args.fill)
        spec = {**sb3_spec(cfg), "fill": args.fill, "calls": args.calls}
        times: dict[str, list[float]] = {"rlstack": []}
        torch_info = {}
        for _ in range(args.repeats):
            times["rlstack"].append(timed(args.calls))
            if args.python:
                result = run_sb3(args.python, spec, SB3_UPDATE)
                times.setdefault("sb3", []).append(result["ms_per_gradient_step"])
                torch_info = {"torch": result["torch"], "threads": result["threads"]}
        row = {"config": Path(name).stem, "algo": cfg.algo, "env": cfg.env.id, "batch_size": cfg.train.batch_size,
               "hidden": list(cfg.net.hidden), **{f"{side}_ms": spread(v) for side, v in times.items()},
               **torch_info}
        line = f"{row['config']}: rlstack {row['rlstack_ms']['median']:.2f} ms a gradient step"
        if "sb3" in times:
            row["speed_vs_sb3"] = round(row["sb3_ms"]["median"] / row["rlstack_ms"]["median"], 2)
            line += f", SB3 {row['sb3_ms']['median']:.2f} ms: {row['speed_vs_sb3']:.2f}x"
        print(line, flush=True)
        rows.append(row)
    result = {"benchmark": "update", "repeats": args.repeats, "calls": args.calls, "fill": args.fill, "rows": rows}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0

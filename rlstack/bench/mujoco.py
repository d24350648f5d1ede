"""`python -m rlstack.bench mujoco --algo sac --env HalfCheetah --steps 200000 --seeds 1,2
[--python VENV/bin/python] --out DIR`: a MuJoCo benchmark on several seeds.

Runs the shipped config `<algo>_<env>` (the Zoo's settings: `sac_halfcheetah`, `td3_hopper`,
`ppo_halfcheetah`, ...) for `--steps` steps on each seed, and with `--python` (a venv with
Stable-Baselines3, as `bench peer`) SB3 on the same config, steps and seed beside it (on the seeds
of `--peer-seeds`, default all). Prints one line per seed (steps/s of each side, rlstack's time
split into env, acting and learning, the final deterministic evaluation of each side), a summary
per side (mean and range of the final evaluations) and the results as JSON; keeps every run under
`--out` (rlstack's run directories, SB3's TensorBoard logs) and draws their learning curves to
`--out/curves.png` (`rlstack.plot`: seeds of one side as one curve with its range).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rlstack.bench.peer import FIXED, compare

ENVS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5"}
"""`--env` names (case-insensitive) -> the gymnasium id the configs train on."""
ALGOS = ("sac", "td3", "ppo")


def config_name(algo: str, env: str) -> str:
    """The shipped config for `algo` on `env`, or a SystemExit naming the ones there are."""
    from rlstack.config import shipped_configs

    name = f"{algo}_{env.lower()}"
    available = sorted(p.stem for p in shipped_configs().glob("*.yaml") if p.stem.split("_", 1)[-1] in ENVS)
    if algo not in ALGOS or env.lower() not in ENVS or name not in available:
        raise SystemExit(f"no shipped MuJoCo config '{name}'; available: {', '.join(available)}")
    return name


def _summary(rows: list[dict], side: str) -> str | None:
    finals = [value for row in rows for value in row.get(f"{side}_eval", [])]
    if not finals:
        return None
    return (f"{side}: final evaluation {statistics.mean(finals):,.0f} (range {min(finals):,.0f} to "
            f"{max(finals):,.0f}) over seeds {', '.join(str(r['seed']) for r in rows if f'{side}_eval' in r)}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench mujoco", description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", required=True, choices=ALGOS)
    parser.add_argument("--env", required=True, help=f"one of {', '.join(ENVS)} (case-insensitive)")
    parser.add_argument("--steps", type=int, required=True, help="environment steps of every run")
    parser.add_argument("--seeds", default="1,2", help="comma-separated seeds (default 1,2)")
    parser.add_argument("--python", default=None, help="interpreter of a venv with stable-baselines3 and torch: "
                                                       "SB3 runs beside rlstack")
    parser.add_argument("--peer-seeds", default=None, help="the seeds SB3 runs on (default: all of --seeds)")
    parser.add_argument("--out", required=True, help="directory for the runs, curves.png and results.json")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both sides")
    args = parser.parse_args(argv)

    from rlstack.config import load_config
    from rlstack.plot import PlotError, load_run, plot_runs

    name = config_name(args.algo, args.env)
    seeds = [int(s) for s in args.seeds.split(",")]
    peer_seeds = set(seeds if args.peer_seeds is None else (int(s) for s in args.peer_seeds.split(",")))
    out = Path(args.out)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in seeds:
            cfg = load_config(name, [*FIXED, *args.overrides, f"train.total_steps={args.steps}", f"seed={seed}"])
            sides = ["rlstack", "sb3"] if args.python and seed in peer_seeds else ["rlstack"]
            row = compare(name, cfg, sides, 1, args.python, True, out, scratch)
            split = row["rlstack"]["time_split_seconds"]
            print("  rlstack time split (s): " + ", ".join(f"{k} {v:,.0f}" for k, v in split.items()), flush=True)
            rows.append(row)
    for side in ("rlstack", "sb3"):
        line = _summary(rows, side)
        if line:
            print(line)
    runs = []
    for path in sorted(p for side in ("rlstack", "sb3") for p in (out / side).glob(f"{name}_seed*")):
        try:
            runs.append(load_run(path))
        except PlotError as err:  # e.g. SB3 logs an off-policy run's return every 4 episodes only
            print(f"not plotted: {err}")
    if runs:
        print(f"learning curves: {plot_runs(runs, out / 'curves.png', title=f'{name}: {args.steps:,} steps')}")
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows, indent=2))
    return 0

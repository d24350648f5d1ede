"""`python -m rlstack.bench consistency`: the seed's train/inference A/B (section 6.4), made honest.

Same config, same seed, the same learner (built fresh per path from the seed; the initial
parameters are hashed to prove they are identical); only the rollout path differs:

| path       | how the actor computes `act(obs, noise)`                                         |
|------------|----------------------------------------------------------------------------------|
| `exported` | the consistent path, the project's own acting module (`rlstack.acting.Acting`    |
|            | from `load_policy`): `nn.GraphCell` on the MindIR the trainer exported,          |
|            | Parameters refreshed from the learner (`Acting.sync_from`; `--full-reload`:      |
|            | publish and load a new version instead, `Acting.swap` to its new GraphCell)      |
| `pynative` | a copy of the network run eagerly: PyNative mode around each acting call, the    |
|            | update stays in graph mode (`set_context(mode=...)` is process-wide: switched    |
|            | per call, which MindSpore allows without recompiling the update)                 |
| `numpy`    | a separately maintained float32 numpy re-implementation of `Network.act`         |
| `float16`  | a copy of the network with `to_float(ms.float16)` (float16 compute, graph mode)  |

Each path is an `ActingPath`: its own compute function behind a `Recorder` (latency and recent
observations of the rollout's sampling calls), wrapped in an `rlstack.acting.Acting` that the
trainer's in-process collector acts with (`Trainer.train(acting=...)`). An update hook refreshes
the path from the learner; the parity probes compare it with the learner's own module
(`Acting.of_network`).

Every path gets the learner's weights after every `refresh_every` updates (default 1, as the
trainer's own actor), so all act on weights of the same age and only the computation differs.

For each path: steps/s of the whole run and of the rollout alone, acting latency per call at the
rollout batch size (p50/p99), the cost of refreshing the actor's weights, parity against the
learner (max |Δlogp| and the share of actions that differ, both computed by running the path and
the learner's graph on the same recent observations with the same noise), and the final
deterministic evaluation return of the path. Gain % = (consistent − baseline) / |baseline| × 100
per metric; the JSON says for each metric whether higher or lower is better. Writes
`<out>/consistency.json` and `<out>/consistency.png`; the run directories of every path stay under
`<out>/<case>/<path>/` (TensorBoard scalars for `rlstack.plot`, exported policies).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np

from rlstack import registry
from rlstack.acting import Acting
from rlstack.bench.paths import PATHS, ActingPath, PyNativePath, make_path
from rlstack.config import ConfigError, config_path, load_config
from rlstack.envs import make_vector_env
from rlstack.fsutil import atomic_write_bytes, atomic_write_text
from rlstack.trainer import Trainer

CONSISTENT = "exported"
METRICS: dict[str, str] = {
    "steps_per_second": "higher",
    "rollout_steps_per_second": "higher",
    "act_latency_p50_ms": "lower",
    "act_latency_p99_ms": "lower",
    "refresh_ms_mean": "lower",
    "parity_max_abs_dlogp": "lower",
    "parity_action_mismatch": "lower",
    "parity_max_abs_daction": "lower",
    "eval_return_mean": "higher",
}
"""Every reported metric and which direction is better."""
_COMMON = ("train.progress=off", "train.export_every=0", "train.checkpoint_every=0", "train.keep_versions=2")


@dataclass(frozen=True)
class Case:
    """One algorithm/environment pair of the benchmark."""

    key: str
    title: str
    config: str
    """A shipped config (`rlstack.config.config_path`: a name under configs/)."""
    full: tuple[str, ...]
    quick: tuple[str, ...]
    refresh_every: int
    """Learner updates between weight refreshes of the actor (1: what the trainer's own actor does)."""
    parity_every: int
    """Refreshes between parity probes in a full run (every refresh in a quick run)."""


CASES = {
    "ppo": Case("ppo", "PPO CartPole-v1", "ppo_cartpole.yaml", full=("train.total_steps=50000",),
                quick=("train.total_steps=256", "train.n_steps=16", "train.batch_size=128", "train.n_epochs=1",
                       "env.eval_episodes=2"),
                refresh_every=1, parity_every=20),
    "sac": Case("sac", "SAC Pendulum-v1", "sac_pendulum.yaml", full=("train.total_steps=10000",),
                quick=("train.total_steps=400", "train.learning_starts=100", "net.hidden=[64,64]",
                       "env.eval_episodes=2"),
                refresh_every=1, parity_every=1000),
}


# ----- parity --------------------------------------------------------------------------------------

@dataclass
class Parity:
    """Accumulated comparison of a path against the learner's graph on the same inputs."""

    probes: int = 0
    rows: int = 0
    max_abs_dlogp: float = 0.0
    sum_abs_dlogp: float = 0.0
    mismatched_actions: int = 0
    max_abs_daction: float = 0.0
    seconds: float = 0.0

    def add(self, path_out: tuple[np.ndarray, ...], learner_out: tuple[np.ndarray, ...]) -> None:
        a_p, l_p = np.asarray(path_out[0]), np.asarray(path_out[1], np.float64)
        a_l, l_l = np.asarray(learner_out[0]), np.asarray(learner_out[1], np.float64)
        dlogp = np.abs(l_p - l_l)
        differs = a_p != a_l
        if differs.ndim > 1:
            differs = differs.reshape(len(differs), -1).any(-1)
            self.max_abs_daction = max(self.max_abs_daction, float(np.max(np.abs(a_p.astype(np.float64) - a_l))))
        self.rows += len(dlogp)
        self.max_abs_dlogp = max(self.max_abs_dlogp, float(dlogp.max()))
        self.sum_abs_dlogp += float(dlogp.sum())
        self.mismatched_actions += int(differs.sum())

    def as_dict(self) -> dict[str, Any]:
        return {"probes": self.probes, "rows": self.rows, "max_abs_dlogp": self.max_abs_dlogp,
                "mean_abs_dlogp": self.sum_abs_dlogp / max(self.rows, 1),
                "action_mismatch": self.mismatched_actions / max(self.rows, 1),
                "max_abs_daction": self.max_abs_daction, "seconds": self.seconds}


def probe_parity(path: ActingPath, learner: Acting, parity: Parity, rng: np.random.Generator) -> None:
    """Run the path and the learner's graph on the path's recent rollout observations with the same
    noise, one call per rollout-sized batch (outputs are not batch-invariant), and accumulate."""
    if not path.rec.recent:
        return
    start = time.perf_counter()
    with path.rec.paused():
        for obs in path.rec.recent:
            noise = learner.noise(len(obs), rng)
            parity.add(path.acting(obs, noise), learner(obs, noise))
    parity.probes += 1
    parity.seconds += time.perf_counter() - start


# ----- one path, one case ----------------------------------------------------------------------------

def params_sha256(network: Any) -> str:
    digest = hashlib.sha256()
    for name, p in sorted(network.parameters_and_names(), key=lambda kv: kv[0]):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(p.asnumpy()).tobytes())
    return digest.hexdigest()


def evaluate_path(path: ActingPath, cfg: Any, episodes: int, seed: int) -> np.ndarray:
    """Deterministic returns of the path itself (what this acting path would deploy)."""
    acting, returns, running = path.acting, np.zeros(episodes), np.ones(episodes, bool)
    zeros = acting.noise(episodes, None)
    with closing(make_vector_env(cfg.env.id, episodes, "sync", cfg.env.kwargs)) as envs, path.rec.paused():
        obs, _ = envs.reset(seed=seed)
        while running.any():
            obs, reward, terminated, truncated, _ = envs.step(acting.to_env(acting(obs, zeros).action))
            returns += reward * running
            running &= ~(terminated | truncated)
    return returns


@dataclass
class Options:
    quick: bool = False
    steps: int | None = None
    seed: int = 0
    refresh_every: int | None = None
    parity_every: int | None = None
    parity_rows: int = 128
    full_reload: bool = False
    """Exported path: publish and load a new version on every refresh instead of refreshing weights."""


def run_path(case: Case, name: str, out: Path, opts: Options) -> dict[str, Any]:
    """Train `case` once with acting path `name`; returns the path's metrics."""
    overrides = [*_COMMON, *(case.quick if opts.quick else case.full), f"seed={opts.seed}"]
    if opts.steps is not None:
        overrides.append(f"train.total_steps={opts.steps}")
    cfg = load_config(case.config, overrides)
    trainer = Trainer(cfg, out / name)
    initial = params_sha256(trainer.network)
    # The learner's own module in graph mode (Cell.__call__), for the parity probes.
    learner = Acting.of_network(trainer.network, trainer.obs_space, trainer.action_space)
    path = make_path(name, trainer, min(opts.parity_rows, 32) if opts.quick else opts.parity_rows,
                     opts.full_reload)
    refresh_every = opts.refresh_every or case.refresh_every
    parity_every = 1 if opts.quick else (opts.parity_every or case.parity_every)
    parity, rng = Parity(), np.random.default_rng(10_000 + opts.seed)

    def hook(counters: Any) -> None:
        if counters.updates % refresh_every == 0:
            path.refresh(trainer)
            if len(path.refresh_seconds) % parity_every == 0:
                probe_parity(path, learner, parity, rng)

    trainer.update_hooks.append(hook)
    summary = trainer.train(acting=path.acting)
    # The parity probes inside the loop's hooks are measurement, not training: their time is
    # taken out of the loop's wall-clock time below.
    probe_seconds_in_loop = parity.seconds
    if trainer.counters.updates % refresh_every:  # the last updates were not refreshed yet
        path.refresh(trainer, timed=False)  # the final weights, for the last probe and the evaluation
    probe_parity(path, learner, parity, rng)
    returns = evaluate_path(path, cfg, cfg.env.eval_episodes, cfg.seed + 10_000)
    lat = np.asarray(path.rec.latencies) * 1e3
    split = summary["time_split_seconds"]
    loop_seconds = summary["wall_seconds"] - probe_seconds_in_loop
    result = {
        "description": path.description,
        "run_dir": str(trainer.out),
        "initial_params_sha256": initial,
        "steps": summary["total_steps"], "updates": summary["updates"], "rollout_batch": cfg.env.n_envs,
        "loop_seconds": loop_seconds,
        "steps_per_second": summary["total_steps"] / max(loop_seconds, 1e-9),
        "rollout_steps_per_second": summary["total_steps"] / max(split["env"] + split["act"], 1e-9),
        "act_calls": int(len(lat)),
        "act_latency_p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "act_latency_p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "act_latency_mean_ms": float(lat.mean()) if len(lat) else None,
        "refresh_every": refresh_every,
        "refreshes": len(path.refresh_seconds),
        "refresh_ms_mean": float(np.mean(path.refresh_seconds) * 1e3) if path.refresh_seconds else 0.0,
        "refresh_seconds_total": float(np.sum(path.refresh_seconds)),
        "parity": parity.as_dict(),
        "parity_max_abs_dlogp": parity.max_abs_dlogp,
        "parity_action_mismatch": parity.mismatched_actions / max(parity.rows, 1),
        # Continuous actions: how far apart, since float actions rarely agree to the last bit.
        "parity_max_abs_daction": parity.max_abs_daction if path.acting.box else None,
        "eval_returns": returns.tolist(),
        "eval_return_mean": float(returns.mean()),
        "eval_return_std": float(returns.std()),
        "eval_return_learner_graph": summary["eval/mean_return"],
        # The trainer's own check, from the learner's side: max |ratio - 1| of PPO's first minibatch
        # (logp recorded by the acting path vs. the learner's logp of the same action); None for SAC.
        "learner_ppo_ratio_dev_max": summary.get("parity/ppo_ratio_dev_max"),
        "time_split_seconds": {**split, "refresh": float(np.sum(path.refresh_seconds)), "parity": parity.seconds},
    }
    if isinstance(path, PyNativePath):
        result["modes_seen_while_acting"] = sorted("PYNATIVE_MODE" if m == ms.PYNATIVE_MODE else "GRAPH_MODE"
                                                   for m in path.modes_seen)
    return result


def gains(paths: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """(consistent − baseline) / |baseline| × 100 for every metric and baseline (None: baseline is 0)."""
    def gain(c: float | None, b: float | None) -> float | None:
        return None if c is None or b is None or b == 0 else (c - b) / abs(b) * 100.0

    base = paths[CONSISTENT]
    return {name: {m: gain(base.get(m), other.get(m)) for m in METRICS}
            for name, other in paths.items() if name != CONSISTENT}


def run_case(case: Case, paths: list[str], out: Path, opts: Options, log=print) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    for name in paths:
        start = time.perf_counter()
        log(f"[{case.key}] path {name} ...")
        results[name] = run_path(case, name, out / case.key, opts)
        log(f"[{case.key}] path {name} done in {time.perf_counter() - start:.1f} s")
        # Kept as each path finishes: a long run that fails later keeps what it measured.
        atomic_write_text(out / case.key / "partial.json", json.dumps(results, indent=2))
    hashes = {r["initial_params_sha256"] for r in results.values()}
    first = next(iter(results.values()))
    return {
        "title": case.title, "config": case.config,
        "overrides": [*_COMMON, *(case.quick if opts.quick else case.full)],
        "total_steps": first["steps"], "rollout_batch": first["rollout_batch"],
        "learner_identical_at_start": len(hashes) == 1,
        "paths": results,
        "gain_percent": gains(results) if CONSISTENT in results else {},
    }


# ----- reporting -----------------------------------------------------------------------------------

def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if value != 0 and (abs(value) < 10 ** -digits or abs(value) >= 1e6):
        return f"{value:.2e}"
    return f"{value:,.{digits}f}"


_COLUMNS = (("steps_per_second", "steps/s", 0), ("rollout_steps_per_second", "rollout/s", 0),
            ("act_latency_p50_ms", "act p50 ms", 3), ("act_latency_p99_ms", "act p99 ms", 3),
            ("refresh_ms_mean", "refresh ms", 1), ("parity_max_abs_dlogp", "max|dlogp|", 3),
            ("parity_action_mismatch", "act differ", 4), ("parity_max_abs_daction", "max|da|", 3),
            ("eval_return_mean", "eval return", 1))


def format_case(case: dict[str, Any]) -> str:
    head = f"{'path':<10}" + "".join(f"{label:>13}" for _, label, _ in _COLUMNS)
    first = next(iter(case["paths"].values()))
    lines = [f"{case['title']}: {case['total_steps']} steps, rollout batch {case['rollout_batch']}, "
             f"weights refreshed every {first['refresh_every']} update(s); learner identical at start: "
             f"{case['learner_identical_at_start']}", head]
    for name, r in case["paths"].items():
        lines.append(f"{name:<10}" + "".join(f"{_fmt(r.get(m), d):>13}" for m, _, d in _COLUMNS))
    if case["gain_percent"]:
        lines.append(f"gain % of '{CONSISTENT}' over each baseline = (consistent - baseline) / |baseline| x 100")
        lines.append(f"{'baseline':<10}" + "".join(f"{label:>13}" for _, label, _ in _COLUMNS))
        for name, row in case["gain_percent"].items():
            lines.append(f"{name:<10}" + "".join(f"{_fmt(row[m], 1):>13}" for m, _, _ in _COLUMNS))
        lines.append("better is: " + ", ".join(f"{label} {METRICS[m]}" for m, label, _ in _COLUMNS))
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Bar charts, one panel per metric (two rows of four per case); bars are the acting paths,
    labels the gain % of the consistent path over each baseline."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(report["cases"].values())
    metrics = [c for c in _COLUMNS if c[0] != "parity_max_abs_daction"]
    # Throughput, latency and |dlogp| span orders of magnitude between paths: log axes.
    log_axes = {"steps_per_second", "rollout_steps_per_second", "act_latency_p50_ms", "act_latency_p99_ms",
                "refresh_ms_mean", "parity_max_abs_dlogp"}
    colors = {"exported": "#2a7ab9", "pynative": "#d95f02", "numpy": "#7570b3", "float16": "#1b9e77"}
    fig, axes = plt.subplots(2 * len(cases), 4, figsize=(13, 5.2 * len(cases)), squeeze=False)
    for c, case in enumerate(cases):
        names = list(case["paths"])
        panels = axes[2 * c: 2 * c + 2].reshape(-1)
        for ax, (metric, label, _) in zip(panels, metrics, strict=True):
            values = [case["paths"][n].get(metric) or 0.0 for n in names]
            bars = ax.bar(names, values, color=[colors.get(n, "grey") for n in names])
            if metric in log_axes and any(v > 0 for v in values):
                if metric == "parity_max_abs_dlogp":
                    ax.set_yscale("symlog", linthresh=1e-8)  # the consistent path is exactly 0
                else:
                    ax.set_yscale("log")
            ax.set_title(f"{case['title']}: {label}\n({METRICS[metric]} is better)", fontsize=8)
            ax.tick_params(labelsize=7)
            for bar, name, value in zip(bars, names, values, strict=True):
                gain = case["gain_percent"].get(name, {}).get(metric)
                text = _fmt(value, 3 if value < 10 else 0) + (f"\n{gain:+.0f}%" if gain is not None else "")
                ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                            va="bottom", fontsize=6)
            ax.margins(y=0.25)
    fig.suptitle("train/inference consistency A/B: 'exported' (consistent) vs. inconsistent acting paths\n"
                 "labels: value and gain % of exported over that baseline", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _available(key: str) -> str | None:
    """None when the case's algorithm is registered and its config exists, else the reason."""
    case = CASES[key]
    if key not in registry.names():
        return f"algorithm '{key}' is not registered"
    try:
        config_path(case.config)
    except ConfigError as err:
        return str(err)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench consistency", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="CI-sized run: a few updates of PPO CartPole only (add --algos ppo,sac for SAC too)")
    parser.add_argument("--algos", default=None, help="comma-separated cases: ppo (CartPole), sac (Pendulum); "
                                                      "default ppo,sac (ppo with --quick)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated acting paths (default all: "
                                                                 f"{','.join(PATHS)}); '{CONSISTENT}' is the reference")
    parser.add_argument("--out", default=None, help="output directory (default runs/bench_consistency_<time>)")
    parser.add_argument("--steps", type=int, default=None, help="override train.total_steps of every case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--refresh-every", type=int, default=None,
                        help="learner updates between actor weight refreshes (default 1, as the trainer's actor)")
    parser.add_argument("--parity-every", type=int, default=None, help="refreshes between parity probes (full runs)")
    parser.add_argument("--parity-rows", type=int, default=128,
                        help="recent rollout observations per parity probe (at most 32 with --quick)")
    parser.add_argument("--full-reload", action="store_true",
                        help="exported path: publish a new policy version on every refresh and load it (a new "
                             "GraphCell and its compilation), instead of refreshing the compiled graph's weights")
    return parser


def _split(text: str, valid: tuple[str, ...] | list[str], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in valid]
    if bad or not items:
        raise SystemExit(f"error: unknown {what} {', '.join(bad) or '(none given)'}; valid: {', '.join(valid)}")
    return items


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    algos = _split(args.algos or ("ppo" if args.quick else "ppo,sac"), list(CASES), "case")
    paths = _split(args.paths, PATHS, "acting path")
    for name, value in (("--refresh-every", args.refresh_every), ("--parity-every", args.parity_every),
                        ("--parity-rows", args.parity_rows), ("--steps", args.steps)):
        if value is not None and value < 1:
            raise SystemExit(f"error: {name} must be >= 1, got {value}")
    out = Path(args.out) if args.out else Path("runs") / f"bench_consistency_{time.strftime('%Y%m%d-%H%M%S')}"
    opts = Options(quick=args.quick, steps=args.steps, seed=args.seed, refresh_every=args.refresh_every,
                   parity_every=args.parity_every, parity_rows=args.parity_rows, full_reload=args.full_reload)
    report: dict[str, Any] = {
        "benchmark": "consistency", "quick": args.quick, "consistent_path": CONSISTENT, "metrics": METRICS,
        "gain_formula": "(consistent - baseline) / |baseline| * 100",
        "machine": {"cpu_count": os.cpu_count(), "load_average_start": list(os.getloadavg()),
                    "mindspore": ms.__version__, "numpy": np.__version__},
        "cases": {}, "skipped": {},
    }
    start = time.perf_counter()
    for key in algos:
        reason = _available(key)
        if reason:
            report["skipped"][key] = reason
            print(f"[{key}] skipped: {reason}", flush=True)
            continue
        report["cases"][key] = run_case(CASES[key], paths, out, opts, log=lambda m: print(m, flush=True))
    report["machine"]["load_average_end"] = list(os.getloadavg())
    report["seconds"] = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "consistency.json", json.dumps(report, indent=2))
    if report["cases"]:
        plot(report, out / "consistency.png")
    print()
    for case in report["cases"].values():
        print(format_case(case), end="\n\n")
    print(f"wrote {out / 'consistency.json'}" + (f" and {out / 'consistency.png'}" if report["cases"] else ""))
    print(f"timings are from a shared 2-core machine (load average {report['machine']['load_average_start'][0]:.1f} "
          f"at start, {report['machine']['load_average_end'][0]:.1f} at end): treat them as noisy")
    return 0 if report["cases"] else 1

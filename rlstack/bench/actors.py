"""`python -m rlstack.bench actors`: PPO CartPole-v1 steps/s with actors 0/1/2 and parity fast vs strict,
on the process and (`--backends process,ray`) the Ray actor backend.

With Ray it also measures the per-chunk overhead of each backend: one actor sends chunks of 8 envs x
32 steps to a learner that only receives them; the time between chunks minus the actor's own
env + acting time is what the transport (shared memory or Ray's object store and calls) costs.

Also measures what the actor design rests on: re-exporting the policy (`ms.export`), loading and
compiling a new `nn.GraphCell`, and refreshing the weights of an already compiled GraphCell
in place (what the in-process actor and the actor processes do after every update).

Steady-state steps/s is measured between the end of update `--warmup` and the last update
(graph compilation and actor start-up excluded); the whole-run figure is reported too. Cases
are interleaved over `--repeats` rounds and the median is taken, because the machine is shared.
On a loaded machine wall-clock rates mostly measure the other tenants, so each case also reports
steady-state steps per CPU-second of the learner process (all its threads): with `actors: 0`
that is the whole cost of training, and it compares fast with strict without the noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def run_case(config: str | None, actors: int, parity: str, steps: int, warmup: int,
             backend: str = "process") -> dict[str, Any]:
    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    cfg = load_config(config, [f"actors={actors}", f"parity={parity}", f"train.total_steps={steps}",
                               f"actors_backend={backend}", "train.progress=off", "env.eval_episodes=2"])
    cpu: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg, out)
        trainer.update_hooks.append(lambda c: cpu.append((c.steps, time.process_time())))
        summary = trainer.train()
    history = trainer.history
    first = min(warmup, len(history) - 2)
    start, end = history[first], history[-1]
    cpu_start, cpu_end = cpu[first], cpu[-1]
    return {
        "actors": actors, "backend": backend if actors else "in-process", "parity": parity,
        "steps": summary["total_steps"],
        "steps_per_second": round(summary["steps_per_second"], 1),
        "steady_steps_per_second": round((end[0] - start[0]) / max(end[2] - start[2], 1e-9), 1),
        "steady_steps_per_learner_cpu_second": round((cpu_end[0] - cpu_start[0]) / max(cpu_end[1] - cpu_start[1], 1e-9),
                                                     1),
        "time_split_seconds": {k: round(v, 2) for k, v in summary["time_split_seconds"].items()},
        "parity_max_abs_logp": summary.get("parity/max_abs_logp"),
        "ppo_ratio_dev_max": summary.get("parity/ppo_ratio_dev_max"),
        "rollout_return_mean": summary["rollout/ep_return_mean"],
    }


def _case(parity: str, actors: int, backend: str) -> str:
    return f"{parity}/actors={actors}" + (f"/{backend}" if actors and backend != "process" else "")


def measure_chunk_overhead(backend: str, chunks: int = 60) -> dict[str, float]:
    """Milliseconds per chunk (8 CartPole envs x 32 steps, one actor): the interval at which the
    learner receives chunks, the actor's own env + acting time, and the difference (transport)."""
    import gymnasium as gym

    from rlstack import registry
    from rlstack.acting import load_policy, weights_of
    from rlstack.artifact import export_policy
    from rlstack.collector import ActorSpec, trajectory_specs
    from rlstack.network import NetSpec, Network
    from rlstack.runtime import configure

    configure()
    env = gym.make("CartPole-v1")
    net = Network(env.observation_space, env.action_space, NetSpec())
    with tempfile.TemporaryDirectory() as tmp:
        bootstrap = export_policy(net, Path(tmp) / "policy", algorithm="ppo", obs_space=env.observation_space,
                                  action_space=env.action_space, device="cpu", fusion=False, config_hash="b")
        layout = load_policy(bootstrap).layout
        spec = ActorSpec(env_id="CartPole-v1", n_envs=8, steps=32, policy_dir=str(Path(tmp) / "policy"),
                         bootstrap=str(bootstrap))
        specs = trajectory_specs(32, 8, (4,), (), "int32", False)
        with registry.actor_backend(backend)(spec, 1, layout, specs) as pool:
            pool.publish(weights_of(net, layout), 0)
            pool.start()
            for _ in range(10):  # start-up and the first compilations
                pool.get()
            intervals, own = [], []
            last = time.perf_counter()
            for _ in range(chunks):
                traj = pool.get()
                now = time.perf_counter()
                intervals.append(now - last)
                own.append(traj.env_seconds + traj.act_seconds)
                last = now
    interval, collect = statistics.median(intervals), statistics.median(own)
    return {"chunk_interval_ms": round(1e3 * interval, 3), "actor_collect_ms": round(1e3 * collect, 3),
            "transport_ms": round(1e3 * (interval - collect), 3)}


def _ms(samples: list[float]) -> float:
    return round(1e3 * statistics.median(samples), 3)


def measure_refresh(repeats: int = 10) -> dict[str, Any]:
    """Milliseconds: export a version, load + first call of a new GraphCell, in-place refresh,
    and one acting call at batch 8 through the GraphCell and through the live Cell."""
    import gymnasium as gym
    import numpy as np

    from rlstack.acting import Acting, load_policy
    from rlstack.artifact import export_policy
    from rlstack.network import NetSpec, Network
    from rlstack.runtime import configure

    configure()
    env = gym.make("CartPole-v1")
    net = Network(env.observation_space, env.action_space, NetSpec())
    obs, noise = np.zeros((8, 4), np.float32), np.zeros((8, 2), np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        def export() -> Path:
            return export_policy(net, Path(tmp) / "policy", algorithm="ppo", obs_space=env.observation_space,
                                 action_space=env.action_space, device="cpu", fusion=False, config_hash="b",
                                 keep=2)

        export()  # the first export compiles the graph once per process
        exports, reloads, refreshes = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            version = export()
            t1 = time.perf_counter()
            policy = load_policy(version)
            policy.run(obs, noise)  # a new GraphCell compiles on its first call
            t2 = time.perf_counter()
            exports.append(t1 - t0)
            reloads.append(t2 - t1)
        acting = policy
        for i in range(repeats * 5):
            t0 = time.perf_counter()
            acting.sync_from(net, i)
            refreshes.append(time.perf_counter() - t0)
        live = Acting.of_network(net, env.observation_space, env.action_space)  # the live Cell's call
        graph_calls, live_calls = [], []
        for _ in range(200):
            t0 = time.perf_counter()
            acting(obs, noise)
            t1 = time.perf_counter()
            live(obs, noise)
            t2 = time.perf_counter()
            graph_calls.append(t1 - t0)
            live_calls.append(t2 - t1)
    return {"export_ms": _ms(exports), "load_and_compile_ms": _ms(reloads), "in_place_refresh_ms": _ms(refreshes),
            "act_call_graphcell_ms": _ms(graph_calls), "act_call_live_cell_ms": _ms(live_calls)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench actors")
    parser.add_argument("--config", default=None, help="config file (default: configs/ppo_cartpole.yaml)")
    parser.add_argument("--steps", type=int, default=40_960, help="environment steps per case")
    parser.add_argument("--warmup", type=int, default=10, help="updates excluded from the steady-state rate")
    parser.add_argument("--actors", default="0,1,2", help="comma-separated actor counts")
    parser.add_argument("--parity", default="fast,strict", help="comma-separated parity modes")
    parser.add_argument("--backends", default="process",
                        help="comma-separated actor backends for the cases with actors (process, ray)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over all cases (median reported)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)

    actor_counts = [int(a) for a in args.actors.split(",")]
    modes = args.parity.split(",")
    backends = args.backends.split(",")
    cases = [(parity, actors, backend) for parity in modes for actors in actor_counts
             for backend in (backends if actors else backends[:1])]
    runs: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        for parity, actors, backend in cases:
            runs.append(run_case(args.config, actors, parity, args.steps, args.warmup, backend) | {
                "case": _case(parity, actors, backend)})
            print(json.dumps(runs[-1]), flush=True)
    table: dict[str, dict[str, float]] = {}
    for parity, actors, backend in cases:
        mine = [r for r in runs if r["case"] == _case(parity, actors, backend)]
        table[_case(parity, actors, backend)] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("steady_steps_per_second", "steps_per_second", "steady_steps_per_learner_cpu_second")}
    comparisons: dict[str, float] = {}
    for actors in actor_counts:
        if {"fast", "strict"} <= set(modes):
            fast = table[_case("fast", actors, backends[0])]["steady_steps_per_second"]
            strict = table[_case("strict", actors, backends[0])]["steady_steps_per_second"]
            comparisons[f"strict_cost_percent/actors={actors}"] = round(100 * (fast - strict) / fast, 1)
            fast = table[_case("fast", actors, backends[0])]["steady_steps_per_learner_cpu_second"]
            strict = table[_case("strict", actors, backends[0])]["steady_steps_per_learner_cpu_second"]
            comparisons[f"strict_cpu_cost_percent/actors={actors}"] = round(100 * (fast - strict) / fast, 1)
    for parity in modes:
        if {1, 2} <= set(actor_counts):
            one = table[_case(parity, 1, backends[0])]["steady_steps_per_second"]
            comparisons[f"speedup_actors_2_vs_1/{parity}"] = round(table[_case(parity, 2, backends[0])]
                                                                  ["steady_steps_per_second"] / one, 3)
    for backend in backends if len(backends) > 1 else []:
        for actors in actor_counts:
            for parity in modes:
                if actors and backend != backends[0]:
                    base = table[_case(parity, actors, backends[0])]["steady_steps_per_second"]
                    comparisons[f"{backend}_vs_{backends[0]}/{parity}/actors={actors}"] = round(
                        table[_case(parity, actors, backend)]["steady_steps_per_second"] / base, 3)
    overhead = {backend: measure_chunk_overhead(backend) for backend in backends} if "ray" in backends else {}
    result = {"benchmark": "actors", "steps_per_case": args.steps, "repeats": args.repeats, "table": table,
              "comparisons": comparisons, "chunk_overhead": overhead, "refresh": measure_refresh(), "runs": runs}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0

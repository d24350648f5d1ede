"""`python -m rlstack.bench seeds`: every learning test's run over a list of seeds, with the test's
own threshold, printed per seed: the evidence behind each learning test's margin.

The learning tests train exactly the runs defined here (`LEARNING_RUNS`), from their own seed; this
command trains the same runs from other seeds too. Each run is a fresh process (MindSpore keeps
per-process state); `--jobs` runs that many side by side (one per core is the most this CPU
backend uses).

    python -m rlstack.bench seeds                            # every run x seeds 0,1,2,3,4
    python -m rlstack.bench seeds --runs dqn,sac --seeds 0,5,6,7,8 --jobs 2 --out seeds.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LearningRun:
    """One learning test's training run and its pass criterion."""

    config: str
    """Shipped config, by name (`configs/<name>.yaml`)."""
    test: str | None
    """The test that trains this run from its own seed; None: a benchmark only (too long for the
    default suite, whose tests exercise the same path on a shorter run)."""
    min_return: float | None
    """The test's threshold on the final deterministic evaluation (`eval/mean_return`); None for
    tic-tac-toe, whose tests assert no loss against perfect play (and the random player) instead."""
    overrides: tuple[str, ...] = field(default=())
    game: str = "tictactoe"
    """The game a run with no `min_return` is judged on (`game_spec` names)."""

    @property
    def threshold(self) -> str:
        if self.min_return is None:
            return ("0 losses in 100 games against perfect play and 0 in 100 against random "
                    "(the losing lines against every reply are reported)")
        return f"eval/mean_return >= {self.min_return:g}"

    def train(self, seed: int, out: str | Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
        """Train the run from `seed` into `out`; the run's `summary.json` as a dict."""
        from rlstack.config import load_config
        from rlstack.trainer import Trainer

        overrides = [f"seed={seed}", "train.progress=log", *self.overrides, *extra]
        return Trainer(load_config(self.config, overrides), out).train()


def tictactoe_losses_to_perfect_play(run_dir: str | Path, games: int = 100) -> Any:
    """The exported policy (argmax moves) against the perfect player: a `MatchResult`, seats
    alternating, the perfect player choosing at random among its optimal moves."""
    return tictactoe_match(run_dir, "perfect", games)


def tictactoe_match(run_dir: str | Path, opponent: str, games: int = 100, game: str = "tictactoe",
                    search: int = 0) -> Any:
    """The exported policy (argmax moves; with `search`, the most visited move of that many
    simulations) against `perfect` or `random` on tic-tac-toe (built in, or `game`, e.g.
    OpenSpiel's): a `MatchResult`, seats alternating."""
    import numpy as np

    from rlstack.envs.games import game_spec
    from rlstack.envs.players import load_player, make_player
    from rlstack.search import SearchPlayer
    from rlstack.selfplay_eval import play_match

    spec = game_spec(game)
    agent = load_player(run_dir, spec, sample=False)  # the exported graph, argmax moves
    if search:
        agent = SearchPlayer(agent.acting, spec, search)
    other = make_player(spec, opponent, seed=123)
    return play_match(spec, agent, other, games, np.random.default_rng(7))


def tictactoe_every_line(run_dir: str | Path) -> Any:
    """The exported policy (argmax moves) against every legal reply at every opponent turn, both
    seats (`every_reply_line`): a `MatchResult` of lines; 0 losses means no opponent can beat it."""
    from rlstack.envs.games import TICTACTOE
    from rlstack.envs.players import load_player
    from rlstack.selfplay_eval import every_reply_line

    return every_reply_line(TICTACTOE, load_player(run_dir, TICTACTOE, sample=False))


LEARNING_RUNS: dict[str, LearningRun] = {
    # The Zoo config at 6e4 of its 1e5 steps (its schedules annealed over them).
    "ppo": LearningRun("ppo_cartpole", "tests/algorithms/test_ppo.py::test_ppo_solves_cartpole_within_6e4_steps",
                       475.0, ("train.total_steps=60000",)),
    # PPO through actor processes: the Ray actors' learning test's path on the process backend;
    # seeds 0-3 reached 500, two runs at a time.
    "ppo_actors": LearningRun("ppo_cartpole", None, 475.0, ("actors=2",)),
    # The same on Ray actors; the suite kills one of them on a half-length run
    # (tests/serving/test_actor_backends.py::test_ppo_with_two_ray_actors_survives_one_killed_mid_run).
    "ppo_ray_actors": LearningRun("ppo_cartpole", None, 475.0, ("actors=2", "actors_backend=ray")),
    # The Zoo config at 4e4 of its 5e4 steps (with train.keep_best).
    "dqn": LearningRun("dqn_cartpole", "tests/algorithms/test_dqn.py::test_dqn_solves_cartpole_within_4e4_steps",
                       475.0, ("train.total_steps=40000",)),
    # DQN's off-policy path through actor processes is tested on a short run
    # (tests/serving/test_actor.py::test_dqn_collects_and_updates_through_two_actor_processes).
    "dqn_actors": LearningRun("dqn_cartpole", None,
                              475.0, ("actors=2",)),
    # The Zoo config at a quarter of its 2e4-step budget (`python -m rlstack.bench sac` runs the whole
    # budget).
    "sac": LearningRun("sac_pendulum", "tests/algorithms/test_sac.py::test_sac_solves_pendulum_within_5e3_steps",
                       -200.0, ("train.total_steps=5000",)),
    # The Zoo config with 1e3 of its 1e4 random steps and 6e3 steps in all.
    "td3": LearningRun("td3_pendulum", "tests/algorithms/test_td3.py::test_td3_learns_pendulum_within_6e3_steps",
                       -200.0, ("train.total_steps=6000", "train.learning_starts=1000")),
    # PPO from MinAtar Breakout's frames (the MinAtar conv encoder, uint8 storage) at a tenth of its
    # config's budget; a random policy scores 0.41 +- 0.65 an episode (200 episodes).
    "ppo_minatar": LearningRun("ppo_minatar",
                               "tests/algorithms/test_ppo.py::test_ppo_learns_minatar_breakout_from_frames_within_1e5_steps",
                               1.2, ("train.total_steps=100000",)),
    "tictactoe": LearningRun(
        "ppo_tictactoe_selfplay",
        "tests/envs/test_selfplay.py::test_tictactoe_selfplay_agent_never_loses_to_perfect_play_or_any_reply",
        None),
    "alphazero_tictactoe": LearningRun(
        "alphazero_tictactoe",
        "tests/algorithms/test_alphazero.py::test_alphazero_tictactoe_never_loses_to_perfect_play_with_or_without_search",
        None, ("train.total_steps=20000",)),
    # The same through OpenSpiel's tic_tac_toe (the generic game path: no win-in-one shortcut in the
    # search), evaluated against the solved game (`selfplay.reference: perfect`), at the config's
    # whole budget (at 20k, 3 of seeds 5-9 lost); judged with and without search.
    "alphazero_openspiel_tictactoe": LearningRun(
        "alphazero_tictactoe",
        "tests/algorithms/test_alphazero.py::test_alphazero_on_openspiel_tictactoe_never_loses_to_perfect_play",
        None, ("env.id=rlstack/Game-v0", "env.kwargs.game=openspiel:tic_tac_toe", "selfplay.reference=perfect"),
        game="openspiel:tic_tac_toe"),
}


def _one(name: str, seed: int, extra: tuple[str, ...]) -> dict[str, Any]:
    """Train one run from one seed (in a worker process) and judge it as its test does."""
    run = LEARNING_RUNS[name]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"rlstack-seeds-{name}-{seed}-") as out:
        summary = run.train(seed, out, extra)
        row: dict[str, Any] = {"run": name, "seed": seed, "total_steps": summary["total_steps"],
                               "wall_seconds": round(time.perf_counter() - start, 1),
                               "final_policy": summary.get("final_policy"),
                               "eval_mean_return": round(summary["eval/mean_return"], 2)}
        if run.min_return is None and run.game != "tictactoe":
            results = {(opponent, sims): tictactoe_match(out, opponent, game=run.game, search=sims)
                       for opponent in ("perfect", "random") for sims in (0, 32)}
            row.update(result="; ".join(f"{'search 32' if sims else 'policy'} vs {opponent} W/D/L {r.wins}/{r.draws}/"
                                        f"{r.losses}" for (opponent, sims), r in results.items()),
                       passed=all(r.losses == 0 for r in results.values()))
        elif run.min_return is None:
            perfect, random = tictactoe_match(out, "perfect"), tictactoe_match(out, "random")
            lines = tictactoe_every_line(out)
            row.update(result=f"{perfect.losses} losses to perfect play (W/D/L {perfect.wins}/{perfect.draws}/"
                              f"{perfect.losses}), {random.losses} to random ({random.wins}/{random.draws}/"
                              f"{random.losses}); {lines.losses} losing lines of {lines.games} against every reply",
                       passed=perfect.losses == 0 and random.losses == 0)
        else:
            row.update(result=row["eval_mean_return"], passed=summary["eval/mean_return"] >= run.min_return)
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(LEARNING_RUNS),
                        help=f"comma-separated runs (default: all of {', '.join(LEARNING_RUNS)})")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default: 0,1,2,3,4)")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained side by side (default: 1)")
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parser.parse_args(argv)
    names = [n for n in args.runs.split(",") if n]
    unknown = [n for n in names if n not in LEARNING_RUNS]
    if unknown:
        parser.error(f"unknown run {', '.join(unknown)}; available: {', '.join(LEARNING_RUNS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [(n, s) for n in names for s in seeds]
    rows: list[dict[str, Any]] = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=ctx, max_tasks_per_child=1) as pool:
        futures = {pool.submit(_one, n, s, tuple(args.overrides)): (n, s) for n, s in jobs}
        for future in as_completed(futures):
            n, s = futures[future]
            try:
                row = future.result()
            except Exception as err:  # a crashed run is a result too, not the end of the sweep
                row = {"run": n, "seed": s, "result": f"error: {err!r}", "passed": False}
            rows.append(row)
            print(f"{n:11s} seed {s:3d}: {row['result']}  {'pass' if row['passed'] else 'FAIL'}"
                  f"  ({row.get('wall_seconds', '-')} s)", flush=True)
    rows.sort(key=lambda r: (names.index(r["run"]), seeds.index(r["seed"])))
    table = {n: {"test": LEARNING_RUNS[n].test, "threshold": LEARNING_RUNS[n].threshold,
                 "passed": sum(r["passed"] for r in rows if r["run"] == n),
                 "seeds": [r for r in rows if r["run"] == n]} for n in names}
    result = {"benchmark": "seeds", "seeds": seeds, "overrides": args.overrides, "runs": table}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    print("\n| run | " + " | ".join(f"seed {s}" for s in seeds) + " | passed |")
    print("|---|" + "---|" * (len(seeds) + 1))
    for n in names:
        cells = [str(r["result"]) for r in table[n]["seeds"]]
        print(f"| {n} | " + " | ".join(cells) + f" | {table[n]['passed']}/{len(seeds)} |")
    return 0

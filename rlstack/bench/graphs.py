"""`python -m rlstack.bench graphs`: a census of the compiled graphs a config runs (acting, update,
evaluation, parity), each with its kernel count, the runtime's thread mode, compilations and time per call.

The config trains briefly in a child process (MindSpore reads its log settings at import), and the
census is what MindSpore 2.10 reports there:
- kernels: `[Kernel actors:N]` in the runtime's actor-set dump (`MS_DEV_SAVE_GRAPHS=1`, other IR
  files filtered away), the N `GraphScheduler::CheckSingleThreadRunningCondition` compares with 100
  (control-flow, copy and super-kernel actors rule single-thread mode out whatever N is);
- mode and time: the runtime's INFO line per execution, `<actor set> execution count: C, execution
  time: T ms in multi thread or not: 0|1`: the flag is the mode that execution ran in (the first is
  always multi-threaded); T is launch to sync, without Python's call overhead but with the INFO logging;
- which graph: the child wraps `nn.Cell.compile` to report each new compile phase (Cell class, input
  shapes, rlstack call chain), and the runtime's `Start compiling, phase: P` ... `produce actor: A`
  joins phase to actor set. Graphs run in other processes (`actors: N`, the server) are not seen.

    python -m rlstack.bench graphs --config configs/dqn_cartpole.yaml --json graphs.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any

from rlstack.errors import RlstackError

SINGLE_THREAD_MAX_KERNELS = 100
"""`kSingleThreadExecutionActorMaxNum` of MindSpore's runtime (`actor_common.h`)."""
MARK = "rlstack-graphs-compile "
"""Prefix of the child's own stderr lines (one JSON object each: a new compile phase)."""
DEFAULT_CONFIG = "ppo_cartpole"
"""A shipped config by name (`rlstack.config.config_path`)."""

_PHASE = re.compile(r"Start compiling, phase: (\S+)")
_ACTOR = re.compile(r"end compile function graph: (\S+), produce actor: (\S+),")
_EXEC = re.compile(r"(\S+) execution count: \d+, execution time: ([-+.\deE]+) ms in multi thread or not: ([01])")
# Purpose of a graph from its rlstack call chain: the first entry matching any frame wins.
# None: an algorithm's own Cell, named by its class (PPOUpdate -> update, LearnerLogp -> learner_logp).
# "parity" becomes parity_exported (the loaded version) or parity_live (the learner's module).
ROLES: tuple[tuple[str, str | None], ...] = (
    ("rlstack.algorithms.", None), ("rlstack.parity:", "parity"), ("check_parity", "parity"),
    ("evaluate", "eval"), ("rlstack.evaluation:", "eval"), ("rlstack.selfplay_eval:", "eval"),
    ("rlstack.envs.", "opponent"), ("rlstack.serving.", "act"), ("Acting", "act"))


class CensusError(RlstackError, RuntimeError):
    """The config's short training run failed (e.g. its env cannot be made here)."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log
        """The end of the run's stderr."""


def budget(cfg: Any) -> list[str]:
    """Overrides for a short run: on-policy three rollouts (three updates); off-policy the replay
    filled to one minibatch, then at least 20 vector steps and three `train_freq` rounds; a
    search learner about three updates of self-play games."""
    train, n_envs = cfg.train, cfg.env.n_envs
    if hasattr(train, "n_steps"):
        return [f"train.total_steps={3 * train.n_steps * n_envs}"]
    if hasattr(train, "games_per_update"):  # a search learner: about three updates (games of >= 5 moves)
        return [f"train.total_steps={3 * train.games_per_update * 5}"]
    starts = -(-train.batch_size // n_envs) * n_envs
    return [f"train.learning_starts={starts}",
            f"train.total_steps={starts + max(3 * train.train_freq, 20) * n_envs}"]


def census(config_path: str | Path, overrides: list[str] | tuple[str, ...] = (), *,
           timeout: float | None = None) -> list[dict[str, Any]]:
    """Train `config_path` briefly (`budget`, then `overrides`) and describe every graph it ran,
    in order of first compilation. Raises CensusError when the run fails."""
    from rlstack.config import load_config

    cfg = load_config(config_path, list(overrides))
    run_overrides = ["train.progress=off", *budget(cfg), *overrides]
    with tempfile.TemporaryDirectory(prefix="rlstack-graphs-") as tmp:
        env = {**os.environ, "GLOG_v": "2", "GLOG_logtostderr": "1",
               "MS_SUBMODULE_LOG_v": "{RUNTIME_FRAMEWORK:1,PIPELINE:1}",
               "MS_DEV_SAVE_GRAPHS": "1", "MS_DEV_SAVE_GRAPHS_PATH": f"{tmp}/ir",
               "MS_DEV_DUMP_IR_PASSES": "rlstack_graphs_no_such_pass"}
        cmd = [sys.executable, "-m", "rlstack.bench.graphs", "--child-out", f"{tmp}/run",
               "--config", str(config_path), *run_overrides]
        with open(f"{tmp}/stdout", "w") as stdout:
            proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
            expired = threading.Event()
            timer = threading.Timer(timeout or 0, lambda: (expired.set(), proc.kill()))
            if timeout:
                timer.start()
            compiles, built, runs, tail = _read_log(proc.stderr)  # until the child exits
            code = proc.wait()
            timer.cancel()
        if expired.is_set():
            raise CensusError(f"{config_path}: the run took more than {timeout} s", "\n".join(tail))
        if code != 0:
            last = next((line for line in reversed(tail) if line.strip()), "no message")
            raise CensusError(f"{config_path}: the run failed (exit {code}): {last}", "\n".join(tail))
        sets = _actor_sets(Path(tmp, "ir", "actor_set"))
    return _rows(compiles, built, sets, runs, cfg.algo)


def _read_log(stream: Any) -> tuple[dict, dict, dict, deque]:
    """The child's stderr: compile reports by phase, actor sets built (in order), executions by
    actor set as (ms, multi-thread flag), and the last non-INFO lines (for errors)."""
    compiles: dict[str, dict[str, Any]] = {}
    built: dict[str, dict[str, str]] = {}
    runs: dict[str, list[tuple[float, int]]] = {}
    tail: deque[str] = deque(maxlen=25)
    phase = ""
    for line in stream:
        if line.startswith(MARK):
            info = json.loads(line[len(MARK):])
            compiles[info["phase"]] = info
        elif m := _EXEC.search(line):
            runs.setdefault(m[1], []).append((float(m[2]), int(m[3])))
        elif m := _PHASE.search(line):
            phase = m[1]
        elif m := _ACTOR.search(line):
            built[m[2]] = {"phase": phase, "func_graph": m[1]}
        elif not line.startswith("[INFO]"):
            tail.append(line.rstrip())
    return compiles, built, runs, tail


def _actor_sets(folder: Path) -> dict[str, dict[str, Any]]:
    """Actor-set name -> kernel actors and what rules single-thread mode out, from the dumps."""
    sets: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.ir")):
        text = path.read_text(errors="replace")
        name = re.search(r"actor_name:(\S+)_DataPrepareActor", text)
        counts = {label: int(n) for label, n in re.findall(r"^\[([A-Za-z ]+):(\d+)\]$", text, re.M)}
        if name is None or name[1] in sets or "Kernel actors" not in counts:
            continue
        sets[name[1]] = {"kernels": counts["Kernel actors"], "super_kernel_actors": counts.get("Super kernel actors", 0),
                         "copy_actors": counts.get("Copy actors", 0), "control_flow": "[Control actors]" in text}
    return sets


def _rows(compiles: dict, built: dict, sets: dict, runs: dict, algo: str) -> list[dict[str, Any]]:
    """One row per graph: actor sets of the same purpose, Cell and input shapes are one graph
    compiled `compiles` times (e.g. a GraphCell loaded again for every export)."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for actor, build in built.items():
        info = compiles.get(build["phase"], {})
        cell = info.get("cell") or _class_of(build["func_graph"])
        name = _role(cell, info.get("site", []), algo)
        groups.setdefault((name, cell, info.get("inputs", "?")), []).append(actor)
    rows = []
    for (name, cell, inputs), actors in groups.items():
        dumps = [sets[a] for a in actors if a in sets]
        kernels = max((d["kernels"] for d in dumps), default=None)
        blocked = any(d["control_flow"] or d["copy_actors"] or d["super_kernel_actors"] for d in dumps)
        calls = [runs.get(a, []) for a in actors]
        steady = [ms for r in calls for ms, _ in r[1:]]
        last_flags = {r[-1][1] for r in calls if len(r) >= 2}
        mode = {frozenset({0}): "single", frozenset({1}): "multi"}.get(frozenset(last_flags),
                                                                      "mixed" if last_flags else "unknown")
        site = compiles.get(built[actors[0]]["phase"], {}).get("site", [])
        rows.append({
            "graph": name, "cell": cell, "inputs": inputs, "kernels": kernels,
            "control_flow": any(d["control_flow"] for d in dumps),
            "single_thread_eligible": None if kernels is None else kernels <= SINGLE_THREAD_MAX_KERNELS
            and not blocked,
            "mode": mode, "compiles": len(actors), "calls": sum(len(r) for r in calls),
            "ms_per_call": round(statistics.median(steady), 4) if steady else None,
            "ms_min": round(min(steady), 4) if steady else None,
            "first_call_ms": round(calls[0][0][0], 3) if calls[0] else None,
            "actor_sets": actors, "called_from": " < ".join(site)})
    return rows


def _class_of(func_graph: str) -> str:
    """`2031_2030_rlstack_algorithms_ppo_PPOUpdate_construct_2471` -> `PPOUpdate`."""
    words = re.sub(r"^(\d+_)+|(_\d+)+$", "", func_graph).split("_")
    return next((w for w in reversed(words) if w[:1].isupper()), func_graph)


def _role(cell: str, site: list[str], algo: str) -> str:
    for needle, role in ROLES:
        if any(needle in frame for frame in site):
            if role is None:
                break
            return f"parity_{'exported' if cell == 'GraphCell' else 'live'}" if role == "parity" else role
    name = cell.removeprefix(algo.upper()) or cell
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _watch_compiles() -> None:
    """In the child: report each new compile phase of any Cell on stderr (class, input shapes,
    the innermost rlstack frames that called it). Runs only when a phase first appears."""
    from mindspore import nn

    compile_cell = nn.Cell.compile
    seen: set[str] = set()

    def compile(cell: Any, *args: Any, **kwargs: Any) -> Any:
        result = compile_cell(cell, *args, **kwargs)
        phase = getattr(cell, "compile_phase", "")
        if phase not in seen:
            seen.add(phase)
            try:
                params = [p.name for p in inspect.signature(cell.construct).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            except (TypeError, ValueError):  # a construct without a Python signature
                params = []
            shapes = [(params[i] if i < len(params) else "") + str(list(a.shape)).replace(" ", "")
                      for i, a in enumerate(args) if hasattr(a, "shape")]
            site, frame = [], sys._getframe(1)
            while frame is not None and len(site) < 6:
                module = frame.f_globals.get("__name__", "")
                if module.startswith("rlstack.") and module != "rlstack.bench.graphs":
                    site.append(f"{module}:{frame.f_code.co_qualname}")
                frame = frame.f_back
            report = {"phase": phase, "cell": type(cell).__name__, "inputs": " ".join(shapes), "site": site}
            print(MARK + json.dumps(report), file=sys.stderr, flush=True)
        return result

    nn.Cell.compile = compile


def _child(out: str, config: str, overrides: list[str]) -> int:
    _watch_compiles()
    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    Trainer(load_config(config, overrides), out).train()
    return 0


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ("graph", "cell", "inputs", "kernels", "mode", "compiles", "calls", "ms/call", "min ms", "first ms")
    body = [(r["graph"], r["cell"], r["inputs"],
             "?" if r["kernels"] is None else f"{r['kernels']}{' +ctrl' if r['control_flow'] else ''}",
             r["mode"], r["compiles"], r["calls"], *("-" if r[k] is None else r[k]
                                                    for k in ("ms_per_call", "ms_min", "first_call_ms"))) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *body])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench graphs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help=f"config file, or a shipped config by name (default: {DEFAULT_CONFIG})")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the census as JSON to OUT")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before the training run is killed")
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="dotted overrides after the short-run budget, "
                        "e.g. train.total_steps=2048")
    args = parser.parse_args(argv)
    if args.child_out:
        return _child(args.child_out, args.config, args.overrides)
    try:
        rows = census(args.config, args.overrides, timeout=args.timeout)
    except (CensusError, ValueError) as err:  # ValueError: rlstack.config.ConfigError
        print(f"cannot take the census: {err}", file=sys.stderr)
        return 1
    result = {"benchmark": "graphs", "config": args.config, "overrides": args.overrides,
              "single_thread_max_kernels": SINGLE_THREAD_MAX_KERNELS, "graphs": rows}
    print(format_table(rows))
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`python -m rlstack.bench graphs`: the kernel census finds the acting graph under MindSpore's
100-kernel single-thread line, and finds the update graphs."""

import io
import json
from pathlib import Path

import pytest

from rlstack.bench import graphs

pytestmark = pytest.mark.slow  # a minute or more: scheduled early (tests/conftest.py)
CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# Lines as MindSpore 2.10 writes them (GLOG INFO for PIPELINE and RUNTIME_FRAMEWORK), shortened.
LOG = """\
[INFO] PIPELINE(1,7f,python):2026-12-03 [graph_executor_py.cc:1] CompileInner] Start compiling, phase: train.1.2.3
[INFO] RUNTIME_FRAMEWORK(1,7f,python):2026-12-03 [ms_backend_base.cc:1] Build] Status record: end compile function \
graph: 2031_2030_rlstack_algorithms_ppo_PPOUpdate_construct_2471, produce actor: kernel_graph_1, backend_graph_id: 1
rlstack-graphs-compile {"phase": "train.1.2.3", "cell": "PPOUpdate", "inputs": "obs[256,4]", \
"site": ["rlstack.algorithms.ppo:PPO.learn"]}
[INFO] RUNTIME_FRAMEWORK(1,7f,python):2026-12-03 [graph_scheduler.cc:1298] SetActorExecutionStrategy] kernel_graph_1 \
execution count: 1, execution time: 109.5 ms in multi thread or not: 1.
[INFO] RUNTIME_FRAMEWORK(1,7f,python):2026-12-03 [graph_scheduler.cc:1298] SetActorExecutionStrategy] kernel_graph_1 \
execution count: 2, execution time: 70.25 ms in multi thread or not: 1.
Traceback (most recent call last):
"""


def test_log_lines_are_joined_into_one_row_per_graph():
    compiles, built, runs, tail = graphs._read_log(io.StringIO(LOG))
    assert built == {"kernel_graph_1": {"phase": "train.1.2.3",
                                        "func_graph": "2031_2030_rlstack_algorithms_ppo_PPOUpdate_construct_2471"}}
    assert runs == {"kernel_graph_1": [(109.5, 1), (70.25, 1)]}
    assert list(tail) == ["Traceback (most recent call last):"]
    sets = {"kernel_graph_1": {"kernels": 101, "super_kernel_actors": 0, "copy_actors": 0, "control_flow": False}}
    (row,) = graphs._rows(compiles, built, sets, runs, "ppo")
    assert (row["graph"], row["cell"], row["kernels"], row["mode"]) == ("update", "PPOUpdate", 101, "multi")
    assert (row["calls"], row["compiles"], row["ms_per_call"]) == (2, 1, 70.25)
    assert row["single_thread_eligible"] is False  # 101 kernels: over the runtime's line


@pytest.mark.parametrize(("config", "overrides"), [
    # Two rollouts of 8 envs x 32 steps: 64 acting calls, 40 minibatch steps, export, parity, eval.
    ("ppo_cartpole.yaml", ["train.total_steps=512"]),
    ("dqn_cartpole.yaml", []),  # the census's own short budget: a few updates of 128 gradient steps
    ("ppo_pendulum.yaml", ["train.total_steps=8192"]),  # two rollouts of 4 envs x 1024 steps
    # Five rollouts of 64 envs x 16 steps (the census's three give 48 acting calls).
    ("ppo_tictactoe_selfplay.yaml", ["train.total_steps=5120"]),
    ("ppo_connect4_selfplay.yaml", []),  # three rollouts of 64 envs x 32 steps
    # About three updates of 64 searched self-play games: one acting call per simulation (the
    # evaluations' searching agent off: the same acting graph, at more batch sizes).
    ("alphazero_tictactoe.yaml", ["selfplay.eval_search=0", "selfplay.eval_every=0"]),
    # 300 gradient steps through MinAtar's conv encoder (99 kernels) after 500 steps of warm-up
    ("dqn_minatar.yaml", ["train.total_steps=800", "train.learning_starts=500"]),
])
def test_acting_and_update_graphs_run_single_threaded(config, overrides, record_property):
    rows = graphs.census(CONFIGS / config, overrides, timeout=300)
    print("\n" + graphs.format_table(rows))
    record_property("graphs", json.dumps(rows))

    act = [r for r in rows if r["graph"] == "act"]
    assert act, f"no acting graph among {[r['graph'] for r in rows]}"
    assert sum(row["calls"] for row in act) >= 64  # one call per vector step (or search simulation)
    for row in act:
        assert 0 < row["kernels"] <= graphs.SINGLE_THREAD_MAX_KERNELS, row
        assert row["mode"] == "single", row
        assert row["ms_per_call"] > 0

    # Every graph the algorithm's `learn` runs (each a per-step graph): under the line, no
    # control flow, executed in the single-thread mode, compiled once.
    updates = [r for r in rows if "rlstack.algorithms." in r["called_from"]]
    assert updates, f"no graph called from rlstack/algorithms among {[r['called_from'] for r in rows]}"
    assert any(r["calls"] >= 20 for r in updates), updates
    for row in updates:
        assert 0 < row["kernels"] <= graphs.SINGLE_THREAD_MAX_KERNELS, row
        assert row["single_thread_eligible"] and not row["control_flow"], row
        assert row["compiles"] == 1, row
        if row["calls"] >= 2:
            assert row["mode"] == "single", row

"""The consistency A/B (`python -m rlstack.bench consistency`): the quick run's JSON and PNG, and the
inconsistent acting paths really computing on their own (parity is measured, not assumed)."""

import dataclasses
import json
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest

from rlstack.acting import Acting
from rlstack.bench.consistency import CASES, METRICS, Options, Parity, probe_parity, run_path
from rlstack.bench.paths import PATHS, ExportedPath, NumpyPath, PyNativePath, make_path
from rlstack.config import load_config
from rlstack.trainer import Trainer

TINY = ["env.n_envs=4", "train.n_steps=8", "train.batch_size=32", "train.n_epochs=1", "train.progress=off"]


def test_quick_benchmark_writes_every_field_and_a_chart(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "rlstack.bench", "consistency", "--quick", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "consistency.json").read_text())
    case = report["cases"]["ppo"]
    assert set(case["paths"]) == set(PATHS)
    assert case["learner_identical_at_start"] is True
    for name, result in case["paths"].items():
        for metric in METRICS:
            assert metric in result, (name, metric)
            if metric != "parity_max_abs_daction":  # None for a Discrete action space
                assert isinstance(result[metric], float | int), (name, metric, result[metric])
        assert result["act_calls"] > 0 and result["steps"] == 256
        assert result["act_latency_p99_ms"] >= result["act_latency_p50_ms"] > 0
        assert result["parity"]["probes"] > 0 and result["parity"]["rows"] > 0
        assert 0.0 <= result["parity_action_mismatch"] <= 1.0
        assert len(result["eval_returns"]) == 2
        # Every update refreshed the path (refresh_every 1), and each refresh was timed.
        assert result["refreshes"] == result["updates"] > 0 and result["refresh_ms_mean"] > 0
    # The exported graph computes what the learner computes, bit for bit, at the rollout batch size.
    assert case["paths"]["exported"]["parity_max_abs_dlogp"] == 0.0
    assert case["paths"]["pynative"]["modes_seen_while_acting"] == ["PYNATIVE_MODE"]
    assert set(case["gain_percent"]) == {"pynative", "numpy", "float16"}
    for row in case["gain_percent"].values():
        assert set(row) == set(METRICS)
    base, other = case["paths"]["exported"], case["paths"]["numpy"]
    expected = (base["act_latency_p50_ms"] - other["act_latency_p50_ms"]) / other["act_latency_p50_ms"] * 100
    assert case["gain_percent"]["numpy"]["act_latency_p50_ms"] == pytest.approx(expected)
    png = (out / "consistency.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "gain % of 'exported'" in proc.stdout


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    trainer = Trainer(load_config(None, TINY), tmp_path_factory.mktemp("paths") / "run")
    yield trainer
    trainer.publisher.close()  # the exported path's private acting graphs


@pytest.fixture(scope="module")
def learner(trainer):
    """The learner's own module (graph mode), the reference of every parity probe."""
    return Acting.of_network(trainer.network, trainer.obs_space, trainer.action_space)


def _obs(trainer, rows=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (rows, *trainer.obs_space.shape)).astype(np.float32)


def _compare(path, learner, obs, seed=1):
    noise = learner.noise(len(obs), np.random.default_rng(seed))
    parity = Parity()
    parity.add(path.acting(obs, noise), learner(obs, noise))
    return parity


def test_numpy_path_is_a_separate_computation(trainer, learner):
    path = make_path("numpy", trainer)
    assert isinstance(path, NumpyPath) and isinstance(path.acting, Acting)
    path.refresh(trainer)
    obs = _obs(trainer)
    action, logp, value = path.acting(obs, learner.noise(len(obs), np.random.default_rng(1)))
    assert isinstance(logp, np.ndarray) and logp.dtype == np.float32 and value.shape == (4,)
    assert _compare(path, learner, obs).max_abs_dlogp < 1e-5
    # Its weights are its own copy: changing them moves only the numpy path, and the parity
    # measurement sees it; a refresh from the learner brings it back.
    path.forward.params["pi.0.weight"] = path.forward.params["pi.0.weight"] * 3.0
    assert _compare(path, learner, obs).max_abs_dlogp > 1e-3
    path.refresh(trainer)
    assert _compare(path, learner, obs).max_abs_dlogp < 1e-5


def test_pynative_path_runs_eagerly_on_its_own_copy(trainer, learner):
    path = make_path("pynative", trainer)
    assert isinstance(path, PyNativePath) and path.network is not trainer.network
    path.refresh(trainer)
    obs = _obs(trainer)
    parity = _compare(path, learner, obs)
    assert path.modes_seen == {ms.PYNATIVE_MODE}
    assert ms.get_context("mode") == ms.GRAPH_MODE  # the update's graph mode is restored
    assert parity.rows == 4 and parity.max_abs_dlogp < 1e-5
    first = path.network.trainable_params()[0]
    first.set_data(ms.Tensor(first.asnumpy() * 3.0))
    assert _compare(path, learner, obs).max_abs_dlogp > 1e-3
    path.refresh(trainer)
    assert _compare(path, learner, obs).max_abs_dlogp < 1e-5


def test_float16_path_computes_in_half_precision(trainer, learner):
    path = make_path("float16", trainer)
    path.refresh(trainer)
    parity = _compare(path, learner, _obs(trainer, rows=16))
    # float16 rounding is visible in logp, and small.
    assert 0.0 < parity.max_abs_dlogp < 0.05


def _perturbed(trainer):
    """Move the learner's first weight (as an update would); returns the undo."""
    first = trainer.network.trainable_params()[0]
    saved = first.asnumpy().copy()
    first.set_data(ms.Tensor(saved + 0.05))
    return lambda: first.set_data(ms.Tensor(saved))


def test_exported_path_follows_the_learner_bit_for_bit(trainer, learner):
    path = make_path("exported", trainer)
    assert isinstance(path, ExportedPath) and isinstance(path.graph, Acting)
    obs = _obs(trainer)
    assert _compare(path, learner, obs).max_abs_dlogp == 0.0
    graph_cell = path.graph.cell
    undo = _perturbed(trainer)
    try:
        # Until refreshed, the path still acts with the exported weights: parity sees the change.
        assert _compare(path, learner, obs).max_abs_dlogp > 1e-4
        trainer.counters.updates += 1
        path.refresh(trainer)
        assert _compare(path, learner, obs).max_abs_dlogp == 0.0
        assert path.acting.updates == trainer.counters.updates and len(path.refresh_seconds) == 1
        assert path.graph.cell is graph_cell  # the same compiled graph, its Parameters overwritten
    finally:
        undo()
        trainer.counters.updates -= 1


def test_full_reload_publishes_and_swaps_a_version_per_refresh(tmp_path):
    """In process, through `Trainer.train(acting=...)`: every update's refresh publishes a version
    and swaps its new GraphCell into the path, which stays bitwise equal to the learner."""
    case = dataclasses.replace(CASES["ppo"], quick=(*TINY, "train.total_steps=64", "env.eval_episodes=1"))
    result = run_path(case, "exported", tmp_path, Options(quick=True, full_reload=True))
    assert result["steps"] == 64 and result["updates"] == 2 == result["refreshes"]
    assert "publishing route" in result["description"]
    assert result["parity"]["probes"] == 3 and result["parity_max_abs_dlogp"] == 0.0
    assert result["act_calls"] > 0 and len(result["eval_returns"]) == 1
    versions = [int(v.name[1:]) for v in (tmp_path / "exported" / "policy").iterdir() if v.name.startswith("v")]
    assert max(versions) == result["refreshes"] + 1  # one per refresh, then the final export


def test_recorder_times_only_rollout_sampling_calls(trainer, learner):
    path = make_path("numpy", trainer, probe_rows=8)
    batch = trainer.cfg.env.n_envs
    obs, rng = _obs(trainer, rows=batch), np.random.default_rng(2)
    path.acting(obs, path.acting.noise(batch, rng))  # a rollout step: timed and kept
    path.acting(obs, path.acting.noise(batch, None))  # the zero-noise bootstrap: neither
    path.acting(obs[:1], path.acting.noise(1, rng))  # not the rollout batch (truncation bootstrap)
    with path.rec.paused():
        path.acting(obs, path.acting.noise(batch, rng))
    assert len(path.rec.latencies) == 1 and len(path.rec.recent) == 1
    np.testing.assert_array_equal(path.rec.recent[0], obs)
    parity = Parity()
    probe_parity(path, learner, parity, rng)
    assert parity.probes == 1 and parity.rows == batch and parity.max_abs_dlogp < 1e-5
    assert len(path.rec.latencies) == 1  # the probe's own calls are not acting latency


def test_unknown_path_is_refused(trainer):
    with pytest.raises(ValueError, match="valid: exported, pynative, numpy, float16"):
        make_path("onnx", trainer)

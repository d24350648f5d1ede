"""The consistency A/B (`python -m rlstack.bench consistency`): the quick run's JSON and PNG, and the
inconsistent acting paths really computing on their own (parity is measured, not assumed)."""

import json
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest

from rlstack.bench.consistency import METRICS, PATHS, NumpyPath, Parity, PyNativePath, make_path
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
    return Trainer(load_config(None, TINY), tmp_path_factory.mktemp("paths") / "run")


def _obs(trainer, rows=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (rows, *trainer.obs_space.shape)).astype(np.float32)


def _compare(path, trainer, obs, seed=1):
    noise = trainer.acting.noise(len(obs), np.random.default_rng(seed))
    parity = Parity()
    parity.add(path(obs, noise), trainer.acting(obs, noise))
    return parity


def test_numpy_path_is_a_separate_computation(trainer):
    path = make_path("numpy", trainer)
    assert isinstance(path, NumpyPath)
    path.refresh(trainer)
    obs = _obs(trainer)
    action, logp, value = path(obs, trainer.acting.noise(len(obs), np.random.default_rng(1)))
    assert isinstance(logp, np.ndarray) and logp.dtype == np.float32 and value.shape == (4,)
    assert _compare(path, trainer, obs).max_abs_dlogp < 1e-5
    # Its weights are its own copy: changing them moves only the numpy path, and the parity
    # measurement sees it; a refresh from the learner brings it back.
    path.forward.params["pi.0.weight"] = path.forward.params["pi.0.weight"] * 3.0
    assert _compare(path, trainer, obs).max_abs_dlogp > 1e-3
    path.refresh(trainer)
    assert _compare(path, trainer, obs).max_abs_dlogp < 1e-5


def test_pynative_path_runs_eagerly_on_its_own_copy(trainer):
    path = make_path("pynative", trainer)
    assert isinstance(path, PyNativePath) and path.network is not trainer.network
    path.refresh(trainer)
    obs = _obs(trainer)
    parity = _compare(path, trainer, obs)
    assert path.modes_seen == {ms.PYNATIVE_MODE}
    assert ms.get_context("mode") == ms.GRAPH_MODE  # the update's graph mode is restored
    assert parity.rows == 4 and parity.max_abs_dlogp < 1e-5
    first = path.network.trainable_params()[0]
    first.set_data(ms.Tensor(first.asnumpy() * 3.0))
    assert _compare(path, trainer, obs).max_abs_dlogp > 1e-3
    path.refresh(trainer)
    assert _compare(path, trainer, obs).max_abs_dlogp < 1e-5


def test_float16_path_computes_in_half_precision(trainer):
    path = make_path("float16", trainer)
    path.refresh(trainer)
    parity = _compare(path, trainer, _obs(trainer, rows=16))
    # float16 rounding is visible in logp, and small.
    assert 0.0 < parity.max_abs_dlogp < 0.05


def test_unknown_path_is_refused(trainer):
    with pytest.raises(ValueError, match="valid: exported, pynative, numpy, float16"):
        make_path("onnx", trainer)

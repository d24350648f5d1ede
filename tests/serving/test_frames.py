"""Frames over HTTP: the MinAtar conv encoder's exported graph (bool planes entering as uint8)
served on 127.0.0.1, frames sent as JSON lists and as a binary .npy body, answered exactly as
`load_policy(run).act` answers; bad frames get a 4xx naming what was expected, and the server
keeps serving."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from rlstack.acting import load_policy
from tests.serving import test_server
from tests.serving.test_server import TOKEN, ServerProcess

FRAME = (10, 10, 4)
NPY = {"Content-Type": "application/x-npy"}


@pytest.fixture(scope="module")
def minatar_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """configs/ppo_minatar.yaml's network on MinAtar Breakout's spaces, exported as a run's policy
    (a trained one: tests/algorithms/test_ppo.py's MinAtar learning test)."""
    from rlstack.artifact import export_policy
    from rlstack.config import load_config
    from rlstack.envs import make_env
    from rlstack.network import NetSpec, Network, PolicyKind

    env = make_env("MinAtar/Breakout-v1")
    spaces = {"obs_space": env.observation_space, "action_space": env.action_space}
    network = Network(*spaces.values(), NetSpec.of(load_config("ppo_minatar").net, policy=PolicyKind.CATEGORICAL))
    out = tmp_path_factory.mktemp("frames") / "run"
    export_policy(network, out / "policy", algorithm="ppo", device="cpu", fusion=False, config_hash="test", **spaces)
    return out


@pytest.fixture(scope="module")
def server(minatar_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess([str(minatar_run), "--max-rows", "64", "--max-wait-ms", "2"],
                         tmp_path_factory.mktemp("frames_log") / "server.log", env={"RLSTACK_TOKEN": TOKEN})
    yield proc
    proc.stop()


client = test_server.client  # (on this module's server)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _pickled(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _frames(batch: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((batch, *FRAME)) < 0.3).astype(np.uint8)


def test_the_exported_policy_takes_uint8_frames(minatar_run: Path):
    policy = load_policy(minatar_run)
    assert policy.obs_dtype == np.uint8 and policy.obs_shape == FRAME
    assert policy.manifest["encoder"] == {"name": "minatar_cnn", "conv_form": "matmul"}
    assert policy.manifest["observation_space"]["dtype"] == "bool"  # MinAtar's planes, entering as 0/1


def test_json_and_npy_frames_answer_as_load_policy(minatar_run: Path, client: httpx.Client):
    policy = load_policy(minatar_run)
    frames = _frames(16, seed=1)
    expected = policy.act(frames, deterministic=True)
    as_json = client.post("/v1/act", json={"obs": frames.tolist(), "deterministic": True})
    as_npy = client.post("/v1/act", params={"deterministic": "true"}, content=_npy(frames), headers=NPY)
    for r in (as_json, as_npy):
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["action"] == expected.action.tolist()
        np.testing.assert_array_equal(np.float32(body["logp"]), expected.logp)
        np.testing.assert_array_equal(np.float32(body["value"]), expected.value)
    # one frame, sampled with a seed: the same as `act(obs, seed=...)`
    one = frames[3]
    sampled = policy.act(one, seed=11)
    r = client.post("/v1/act", params={"seed": "11"}, content=_npy(one), headers=NPY)
    assert r.status_code == 200 and r.json()["action"] == int(sampled.action), r.text
    r = client.post("/v1/act", json={"obs": one.tolist(), "seed": 11})
    assert r.status_code == 200 and r.json()["action"] == int(sampled.action), r.text


BAD_FRAMES = {
    # name: (request kwargs, status, words the error must contain)
    "npy_float32": ({"content": _npy(np.zeros((2, *FRAME), np.float32)), "headers": NPY}, 422, "float32"),
    "npy_bool": ({"content": _npy(np.zeros((2, *FRAME), bool)), "headers": NPY}, 422, "bool"),
    "npy_wrong_shape": ({"content": _npy(np.zeros((2, 10, 10, 3), np.uint8)), "headers": NPY}, 422, "shape"),
    "npy_too_many_rows": ({"content": _npy(np.zeros((65, *FRAME), np.uint8)), "headers": NPY}, 413, "rows"),
    "npy_empty": ({"content": _npy(np.zeros((0, *FRAME), np.uint8)), "headers": NPY}, 422, "empty"),
    "npy_garbage": ({"content": b"\x93NUMPY garbage", "headers": NPY}, 422, ".npy"),
    "npy_pickled_objects": ({"content": _pickled(np.array([None, 1], object)), "headers": NPY}, 422, ".npy"),
    "npy_bad_seed": ({"content": _npy(np.zeros(FRAME, np.uint8)), "headers": NPY, "params": {"seed": "-1"}},
                     422, "seed"),
    "npy_unknown_query": ({"content": _npy(np.zeros(FRAME, np.uint8)), "headers": NPY,
                           "params": {"greedy": "1"}}, 422, "greedy"),
    "json_above_255": ({"json": {"obs": np.full(FRAME, 256).tolist()}}, 422, "0..255"),
    "json_fraction": ({"json": {"obs": np.full(FRAME, 0.5).tolist()}}, 422, "0..255"),
    "json_negative": ({"json": {"obs": np.full(FRAME, -1).tolist()}}, 422, "0..255"),
    "text_body": ({"content": b"1 2 3", "headers": {"Content-Type": "text/plain"}}, 415, "npy"),
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_bad_frames_get_a_4xx_naming_what_was_expected_and_the_server_keeps_serving(client: httpx.Client, case):
    kwargs, status, words = BAD_FRAMES[case]
    r = client.post("/v1/act", **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    assert words in body["error"] + (body.get("expected") or ""), body
    assert "[10, 10, 4]" in (body.get("expected") or ""), body
    ok = client.post("/v1/act", content=_npy(_frames(1, seed=0)), headers=NPY)
    assert ok.status_code == 200, ok.text


def test_openapi_documents_the_binary_body_and_integer_frames(client: httpx.Client):
    schema = client.get("/openapi.json").json()
    operation = schema["paths"]["/v1/act"]["post"]
    assert operation["requestBody"]["content"]["application/x-npy"]["schema"]["format"] == "binary"
    assert {p["name"] for p in operation["parameters"]} == {"deterministic", "seed"}
    obs = json.dumps(schema["components"]["schemas"]["ActRequest"]["properties"]["obs"])
    assert '"maximum": 255' in obs and "uint8" in obs

"""The policy server end to end: `python -m rlstack.serve` in a subprocess on a free loopback port,
serving policies exported by a short real training run.

Equality with `load_policy(...).act(...)`: MindSpore outputs are not batch-invariant (~1e-7
between batch sizes), so an answer is compared bitwise only when the server ran it at the same
batch size as the reference (a lone request -> batch 1, a lone request of 16 rows -> batch 16). Answers
that shared a graph call with other clients are compared at rtol/atol 1e-5 on logp/value (100x
the measured batch variance; a wrong noise row or wrong weights move logp by > 1e-2) and exactly
on the discrete action (a flip needs two logits+noise within ~1e-7 of each other).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import httpx
import hypothesis
import mindspore as ms
import numpy as np
import pytest
import schemathesis
from mindspore import Tensor, nn
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from rlstack.acting import Policy, load_policy
from rlstack.fsutil import atomic_write_text
from rlstack.network import NoiseKind, sample_noise
from rlstack.runtime import flush_denormals

pytestmark = pytest.mark.slow  # a minute or more: scheduled early (tests/conftest.py)

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OBS_DIM = 4  # CartPole

_RUNNING = re.compile(r"Uvicorn running on http://([\d.]+):(\d+)")


class ServerProcess:
    """`python -m rlstack.serve ...` in a subprocess on a free loopback port (--port 0, read from its log)."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "rlstack.serve", *args, "--host", "127.0.0.1",
                                      "--port", "0"], stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        self.url = self._wait_for_port(timeout_s=180.0)

    def _wait_for_port(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = _RUNNING.search(self.log_path.read_text())
            if match:
                return f"http://{match.group(1)}:{match.group(2)}"
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"server did not start within {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real PPO CartPole run of two updates, exported after each: policy/v000001..v000003."""
    from rlstack.config import load_config
    from rlstack.trainer import Trainer

    out = tmp_path_factory.mktemp("serve_train") / "run"
    cfg = load_config(None, ["train.total_steps=512", "train.export_every=1", "train.progress=off",
                             "env.eval_episodes=1", "seed=0"])
    Trainer(cfg, out).train()
    assert (out / "policy" / "v000002" / "policy.mindir").is_file()
    return out


def publish(version_src: Path, policy_dir: Path, name: str,
            mutate: Callable[[Path], None] | None = None) -> Path:
    """Put a copy of a version directory into `policy_dir` as `name` and point LATEST at it, the
    way the trainer publishes (directory renamed into place, then LATEST replaced atomically).
    `mutate` edits the copy before it is published (to make a broken version)."""
    tmp = policy_dir / f".{name}.tmp"
    shutil.copytree(version_src, tmp)
    if mutate is not None:
        mutate(tmp)
    os.rename(tmp, policy_dir / name)
    atomic_write_text(policy_dir / "LATEST", name + "\n")
    return policy_dir / name


@pytest.fixture(scope="module")
def serve_root(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory the tests publish into; it starts with v000001 only."""
    root = tmp_path_factory.mktemp("serve_root")
    (root / "policy").mkdir()
    publish(trained_run / "policy" / "v000001", root / "policy", "v000001")
    return root


@pytest.fixture(scope="module")
def server(serve_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server under test: token from the environment, batching window 5 ms, LATEST polled every 0.2 s."""
    proc = ServerProcess([str(serve_root), "--max-batch", "64", "--max-wait-ms", "5", "--max-rows", "256",
                          "--max-body-bytes", "65536", "--reload-poll-s", "0.2"],
                         tmp_path_factory.mktemp("serve_log") / "server.log", env={"RLSTACK_TOKEN": TOKEN})
    yield proc
    proc.stop()


@pytest.fixture()
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30.0) as c:
        yield c


# ----- helpers -------------------------------------------------------------------------------

class References:
    """The reference side: versions loaded with rlstack.load_policy in this process."""

    def __init__(self, policy_dir: Path):
        self.policy_dir = policy_dir
        self._cache: dict[str, Policy] = {}

    def __call__(self, version: str) -> Policy:
        if version not in self._cache:
            self._cache[version] = load_policy(self.policy_dir / version)
        return self._cache[version]


@pytest.fixture(scope="module")
def refs(serve_root: Path) -> References:
    return References(serve_root / "policy")


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of the Prometheus text (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def seeded_rows(policy: Policy, obs: np.ndarray, seeds: list[int]):
    """The graph on obs [N, 4] with row i's noise drawn from default_rng(seeds[i]), in one call."""
    noise = np.concatenate([policy.noise(1, np.random.default_rng(s)) for s in seeds])
    return policy.run(obs.astype(np.float32), noise)


def assert_close_to_reference(answers: list[tuple[np.ndarray, int, dict]], refs: References) -> None:
    """Answers (obs [4], seed, body) that may have shared a graph call: tolerance as in the module doc."""
    by_version: dict[str, list[tuple[np.ndarray, int, dict]]] = {}
    for item in answers:
        by_version.setdefault(item[2]["policy_version"], []).append(item)
    for version, items in by_version.items():
        ref = seeded_rows(refs(version), np.stack([o for o, _, _ in items]), [s for _, s, _ in items])
        np.testing.assert_array_equal(np.array([b["action"] for _, _, b in items]), ref.action)
        np.testing.assert_allclose(np.array([b["logp"] for _, _, b in items], np.float32), ref.logp,
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.array([b["value"] for _, _, b in items], np.float32), ref.value,
                                   rtol=1e-5, atol=1e-5)


# ----- answers ---------------------------------------------------------------------------------

def test_answers_equal_load_policy_act_and_plain_graphcell(client: httpx.Client, refs: References) -> None:
    rng = np.random.default_rng(7)
    obs = rng.normal(size=(5, OBS_DIM)).astype(np.float32)
    for i, o in enumerate(obs):
        seed = 1000 + i
        r = client.post("/v1/act", json={"obs": o.tolist(), "seed": seed})
        assert r.status_code == 200, r.text
        body = r.json()
        policy = refs(body["policy_version"])
        ref = policy.act(o, seed=seed)
        assert isinstance(body["action"], int)
        assert body["action"] == int(ref.action)
        assert np.float32(body["logp"]) == ref.logp and np.float32(body["value"]) == ref.value

        # ... and the bare MindSpore graph, with nothing of rlstack in between but the noise.
        graph = nn.GraphCell(ms.load(str(policy.path / "policy.mindir")))
        noise = sample_noise(NoiseKind(policy.manifest["noise"]["kind"]), policy.manifest["noise"]["dim"], 1,
                             np.random.default_rng(seed))
        action, logp, value = (t.asnumpy() for t in graph(Tensor(o[None]), Tensor(noise)))
        assert (body["action"], np.float32(body["logp"]), np.float32(body["value"])) == \
            (int(action[0]), logp[0], value[0])

    # A batch of 16 rows with one seed: the same rows and noise as act(obs16, seed), and the graph
    # runs at batch size 16 too (a compiled bucket size, so no padding rows).
    batch = rng.normal(size=(16, OBS_DIM)).astype(np.float32)
    r = client.post("/v1/act", json={"obs": batch.tolist(), "seed": 99})
    assert r.status_code == 200, r.text
    body = r.json()
    ref = refs(body["policy_version"]).act(batch, seed=99)
    assert body["action"] == ref.action.tolist()
    np.testing.assert_array_equal(np.array(body["logp"], np.float32), ref.logp)
    np.testing.assert_array_equal(np.array(body["value"], np.float32), ref.value)

    # Deterministic: the zero-noise action, whatever the seed.
    r = client.post("/v1/act", json={"obs": obs[0].tolist(), "deterministic": True, "seed": 5})
    ref = refs(r.json()["policy_version"]).act(obs[0], deterministic=True)
    assert r.json()["action"] == int(ref.action)
    # Seeds matter when sampling: 40 seeds on one observation do not all give one action.
    actions = {client.post("/v1/act", json={"obs": [0.0, 0.0, 0.05, 0.0], "seed": s}).json()["action"]
               for s in range(40)}
    assert actions == {0, 1}


def test_policy_health_and_openapi_describe_the_loaded_graph(client: httpx.Client) -> None:
    manifest = client.get("/v1/policy").json()
    assert manifest["observation_space"]["shape"] == [OBS_DIM] and manifest["action_space"] == {"type": "Discrete", "n": 2}
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and re.fullmatch(r"v\d{6}", health["policy_version"])
    schema = client.get("/openapi.json").json()
    obs = schema["components"]["schemas"]["ActRequest"]["properties"]["obs"]
    one, batch = obs["anyOf"]
    assert one["minItems"] == one["maxItems"] == OBS_DIM and batch["items"] == one and batch["maxItems"] == 256
    action = schema["components"]["schemas"]["ActResponse"]["properties"]["action"]
    assert action["anyOf"][0] == {"type": "integer", "format": "int32", "minimum": 0, "maximum": 1}
    assert "/v1/act" in schema["paths"] and schema["security"] == [{"bearer": []}]


def test_32_concurrent_clients_are_batched_without_errors(server: ServerProcess, refs: References) -> None:
    n_clients, n_requests = 32, 50
    rng = np.random.default_rng(3)
    obs = rng.normal(size=(n_clients, n_requests, OBS_DIM)).astype(np.float32)

    async def run() -> list[list[tuple[int, dict]]]:
        limits = httpx.Limits(max_connections=n_clients, max_keepalive_connections=n_clients)
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, limits=limits, timeout=60.0) as c:
            async def one_client(k: int) -> list[tuple[int, dict]]:
                out = []
                for j in range(n_requests):
                    r = await c.post("/v1/act", json={"obs": obs[k, j].tolist(), "seed": k * 1000 + j})
                    out.append((r.status_code, r.json()))
                return out
            return await asyncio.gather(*(one_client(k) for k in range(n_clients)))

    before = httpx.get(server.url + "/metrics", headers=AUTH).text
    results = asyncio.run(run())
    statuses = [status for client_results in results for status, _ in client_results]
    assert statuses == [200] * (n_clients * n_requests), {s for s in statuses if s != 200}
    assert_close_to_reference([(obs[k, j], k * 1000 + j, results[k][j][1])
                               for k in range(n_clients) for j in range(n_requests)], refs)

    after = httpx.get(server.url + "/metrics", headers=AUTH).text
    calls = metric(after, "rlstack_serve_batch_rows_count") - metric(before, "rlstack_serve_batch_rows_count")
    rows = metric(after, "rlstack_serve_batch_rows_sum") - metric(before, "rlstack_serve_batch_rows_sum")
    single = (metric(after, "rlstack_serve_batch_rows_bucket", le="1.0")
              - metric(before, "rlstack_serve_batch_rows_bucket", le="1.0"))
    assert rows == n_clients * n_requests
    # How large the batches get depends on how fast this process's client can send; > 1 is the claim.
    assert calls - single > 0 and rows > calls, f"{rows} rows in {calls} graph calls, {single} of one row"
    print(f"32 clients x 50 requests: {rows:.0f} rows in {calls:.0f} graph calls ({calls - single:.0f} of > 1 row)")
    ok = (metric(after, "rlstack_serve_requests_total", route="/v1/act", status="200")
          - metric(before, "rlstack_serve_requests_total", route="/v1/act", status="200"))
    assert ok == n_clients * n_requests



def test_an_idle_keep_alive_connection_outlives_a_pooled_clients_expiry(server: ServerProcess) -> None:
    """One TCP connection, idle for longer than httpx's pool keeps one (5 s), still answers: the
    server closes idle connections after --keep-alive-s (75 s), so a pooled client drops its
    connection first and never sends on one the server is closing."""
    url = urlsplit(server.url)
    body = json.dumps({"obs": [0.01, -0.02, 0.03, 0.04], "seed": 1}).encode()
    request = (f"POST /v1/act HTTP/1.1\r\nHost: {url.hostname}\r\nAuthorization: Bearer {TOKEN}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    def exchange(sock: socket.socket) -> bytes:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed by the server after {data!r}"
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed mid-body"
            rest += chunk
        return head.split(b"\r\n", 1)[0]

    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        assert exchange(sock) == b"HTTP/1.1 200 OK"
        time.sleep(6.0)
        assert exchange(sock) == b"HTTP/1.1 200 OK"


# ----- bad input ---------------------------------------------------------------------------------

GOOD = json.dumps({"obs": [0.01, -0.02, 0.03, 0.04], "seed": 1}).encode()
BAD_INPUTS = {
    # name: (body bytes, content type, status, words the error must contain)
    "not json": (b'{"obs": [0.1, 0.2', "application/json", 400, "not valid JSON"),
    "plain text": (b"hello", "application/json", 400, "not valid JSON"),
    "sent as a form": (b"obs=1", "application/x-www-form-urlencoded", 415, "not as JSON"),
    "no content type": (GOOD, None, 415, "without a Content-Type"),
    "empty body": (b"", "application/json", 400, "empty"),
    "body is a list": (b"[0.1, 0.2, 0.3, 0.4]", "application/json", 422, "JSON object"),
    "missing obs": (b'{"deterministic": true}', "application/json", 422, "missing field 'obs'"),
    "unknown field": (b'{"obs": [0, 0, 0, 0], "observation": [1]}', "application/json", 422, "unknown field 'observation'"),
    "obs too short": (b'{"obs": [0.1, 0.2, 0.3]}', "application/json", 422, "shape [3]"),
    "batch of wrong rows": (b'{"obs": [[0.1, 0.2, 0.3], [0.1, 0.2, 0.3]]}', "application/json", 422, "shape [2, 3]"),
    "ragged batch": (b'{"obs": [[0, 0, 0, 0], [0, 0, 0]]}', "application/json", 422, "rectangular"),
    "empty batch": (b'{"obs": []}', "application/json", 422, "shape [0]"),
    "obs is a number": (b'{"obs": 5}', "application/json", 422, "must be a list"),
    "obs holds a string": (b'{"obs": [0, 0, 0, "a"]}', "application/json", 422, "strings"),
    "obs holds a bool": (b'{"obs": [0, 0, 0, true]}', "application/json", 422, "true/false"),
    "obs holds a bool among floats": (b'{"obs": [[false, 0.5, 0.0, 0.0]]}', "application/json", 422, "true/false"),
    "integer beyond float32": (b'{"obs": [0, 0, 0, 100000000000000000000000000000000000000000]}', "application/json", 422, "float32 range"),
    "obs holds null": (b'{"obs": [0, 0, 0, null]}', "application/json", 422, "numbers"),
    "NaN": (b'{"obs": [0, 0, 0, NaN]}', "application/json", 422, "NaN"),
    "infinity": (b'{"obs": [[0, 0, 0, 0], [0, -Infinity, 0, 0]]}', "application/json", 422, "obs[1, 1]"),
    "beyond float32": (b'{"obs": [0, 0, 0, 1e39]}', "application/json", 422, "float32 range"),
    "just past float32's largest": (b'{"obs": [0, 0, 0, 3.402823466385289e38]}', "application/json", 422,
                                    "float32 range"),
    "seed is a float": (b'{"obs": [0, 0, 0, 0], "seed": 1.5}', "application/json", 422, "'seed'"),
    "seed is a string": (b'{"obs": [0, 0, 0, 0], "seed": "7"}', "application/json", 422, "'seed'"),
    "negative seed": (b'{"obs": [0, 0, 0, 0], "seed": -1}', "application/json", 422, "greater than or equal to 0"),
    "deterministic is a string": (b'{"obs": [0, 0, 0, 0], "deterministic": "yes"}', "application/json", 422, "'deterministic'"),
    "too many rows": (json.dumps({"obs": [[0.0] * 4] * 257}).encode(), "application/json", 413, "257 rows; at most 256"),
    "oversized body": (b'{"obs": [' + b"0.0, " * 20000 + b'0.0]}', "application/json", 413, "bytes"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_a_4xx_naming_the_problem_then_good_requests_work(client: httpx.Client, case: str) -> None:
    body, content_type, status, words = BAD_INPUTS[case]
    r = client.post("/v1/act", content=body, headers={"Content-Type": content_type} if content_type else {})
    assert r.status_code == status, r.text
    answer = r.json()
    assert words in answer["error"], answer
    if status != 413 or "rows" in words:  # the obs problems state the expected shape
        assert "[4]" in answer["expected"] and "[B, 4]" in answer["expected"], answer
    good = client.post("/v1/act", content=GOOD, headers={"Content-Type": "application/json"})
    assert good.status_code == 200 and good.json()["action"] in (0, 1)


def test_numbers_json_schema_allows_are_accepted(client: httpx.Client) -> None:
    """JSON Schema counts 7.0 as an integer, and an integer of any size as a number (found by fuzzing)."""
    seeds = [client.post("/v1/act", json={"obs": [0.0, 0.0, 0.05, 0.0], "seed": seed}).json() for seed in (7, 7.0)]
    assert seeds[0] == seeds[1]
    r = client.post("/v1/act", content=b'{"obs": [0, 0, 0, 1180591620717411303424]}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_oversized_chunked_body_and_unknown_routes_are_4xx(client: httpx.Client) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        yield b'{"obs": ['
        for _ in range(200):
            yield b"0.0, " * 100
        yield b"0.0]}"

    r = client.post("/v1/act", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "over 65536 bytes" in r.json()["error"]
    assert client.get("/v1/nothing").status_code == 404
    assert client.get("/v1/act").status_code == 405
    assert client.post("/v1/act", content=GOOD, headers={"Content-Type": "application/json"}).status_code == 200


def test_token_guards_every_route_but_health(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=30.0) as anon:
        assert anon.get("/healthz").status_code == 200
        for method, path in [("POST", "/v1/act"), ("GET", "/v1/policy"), ("POST", "/v1/reload"),
                             ("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/docs")]:
            r = anon.request(method, path, content=GOOD, headers={"Content-Type": "application/json"})
            assert r.status_code == 401 and r.json()["error"] == "missing Authorization header", (path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
        wrong = anon.post("/v1/act", content=GOOD, headers={"Authorization": "Bearer guess"})
        assert wrong.status_code == 401 and wrong.json()["error"] == "wrong bearer token"
        right = anon.post("/v1/act", content=GOOD, headers={**AUTH, "Content-Type": "application/json"})
        assert right.status_code == 200
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert metric(text, "rlstack_serve_request_errors_total", route="/v1/act", status="401") >= 2


# ----- hot reload --------------------------------------------------------------------------------

class Sent(NamedTuple):
    """One request of `Senders` and its answer (status 0: the request failed, `body` says how)."""

    latency: float
    status: int
    obs: np.ndarray
    seed: int
    body: dict
    tag: str
    """The value of the response header `Senders` was asked to keep ("" if none)."""


class Senders:
    """Client threads sending seeded single-observation requests until stopped; `header`: a
    response header kept with each answer (e.g. the replica that answered)."""

    def __init__(self, url: str, n: int, header: str | None = None):
        self.url, self.header, self.stop = url, header, threading.Event()
        self.results: list[list[Sent]] = [[] for _ in range(n)]
        self.threads = [threading.Thread(target=self._send, args=(k,)) for k in range(n)]

    def _send(self, k: int) -> None:
        rng = np.random.default_rng(k)
        with httpx.Client(base_url=self.url, headers=AUTH, timeout=60.0) as c:
            j = 0
            while not self.stop.is_set():
                obs, seed = rng.normal(size=OBS_DIM).astype(np.float32), 10_000 * k + j
                t0 = time.perf_counter()
                try:
                    r = c.post("/v1/act", json={"obs": obs.tolist(), "seed": seed})
                    tag = r.headers.get(self.header, "") if self.header else ""
                    sent = Sent(time.perf_counter() - t0, r.status_code, obs, seed, r.json(), tag)
                except (httpx.HTTPError, ValueError) as err:  # a failed request is a result too
                    sent = Sent(time.perf_counter() - t0, 0, obs, seed, {"error": repr(err)}, "")
                self.results[k].append(sent)
                j += 1

    def __enter__(self) -> Senders:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def versions_seen(self) -> set[str]:
        return {r[4].get("policy_version") for rs in self.results for r in rs}

    def answers(self) -> list[Sent]:
        return [r for rs in self.results for r in rs]

    def last_version_by_tag(self) -> dict[str, str]:
        """Tag (e.g. replica) -> the newest policy version any client got from it."""
        last: dict[str, str] = {}
        for r in self.answers():
            if r.status == 200:
                last[r.tag] = max(last.get(r.tag, ""), r.body["policy_version"])
        return last


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def test_new_version_published_while_clients_send_is_picked_up(
        server: ServerProcess, client: httpx.Client, serve_root: Path, trained_run: Path, refs: References) -> None:
    assert client.get("/healthz").json()["policy_version"] == "v000001"
    with Senders(server.url, 6) as senders:
        wait_for(lambda: all(len(rs) >= 5 for rs in senders.results), 30, "the senders to get going")
        publish(trained_run / "policy" / "v000002", serve_root / "policy", "v000002")
        wait_for(lambda: "v000002" in senders.versions_seen(), 60, "answers from v000002")
        seen = sum(len(rs) for rs in senders.results)
        wait_for(lambda: sum(len(rs) for rs in senders.results) > seen + 30, 30, "more answers")
    answers = [r for rs in senders.results for r in rs]
    assert [r[1] for r in answers] == [200] * len(answers), [r[4] for r in answers if r[1] != 200][:3]
    for rs in senders.results:  # each client sees the old version, then only the new one
        versions = [r[4]["policy_version"] for r in rs]
        assert versions == sorted(versions) and set(versions) <= {"v000001", "v000002"}
    assert_close_to_reference([(a.obs, a.seed, a.body) for a in answers], refs)
    v1, v2 = refs("v000001"), refs("v000002")
    probe = np.random.default_rng(0).normal(size=(64, OBS_DIM)).astype(np.float32)
    assert not np.array_equal(v1.act(probe, seed=0).logp, v2.act(probe, seed=0).logp)  # really new weights
    text = client.get("/metrics").text
    assert metric(text, "rlstack_serve_reloads_total", result="ok") == 1
    assert metric(text, "rlstack_serve_policy_version") == 2
    assert metric(text, "rlstack_serve_policy_info", version="v000002", algorithm="ppo") == 1
    slowest = max(r[0] for r in answers)
    print(f"hot reload under load: {len(answers)} requests, slowest {slowest * 1e3:.0f} ms")


def _flip_graph_bytes(version: Path) -> None:
    data = bytearray((version / "policy.mindir").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (version / "policy.mindir").write_bytes(bytes(data))


def _garbage_graph_with_matching_checksum(version: Path) -> None:
    import hashlib

    garbage = np.random.default_rng(0).bytes(4096)
    (version / "policy.mindir").write_bytes(garbage)
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["sha256"] = hashlib.sha256(garbage).hexdigest()
    (version / "manifest.json").write_text(json.dumps(manifest))


def _other_observation_shape(version: Path) -> None:
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["observation_space"]["shape"] = [5]
    (version / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(("name", "mutate", "words"), [
    ("v000003", _flip_graph_bytes, "is corrupt: sha256"),
    ("v000004", _garbage_graph_with_matching_checksum, "MindSpore cannot load it"),
    ("v000005", _other_observation_shape, "observation shape is [5], the server serves [4]"),
])
def test_broken_version_is_refused_and_the_old_one_keeps_serving(
        server: ServerProcess, client: httpx.Client, serve_root: Path, trained_run: Path,
        name: str, mutate: Callable[[Path], None], words: str) -> None:
    before = client.get("/healthz").json()["policy_version"]
    refused_before = metric(client.get("/metrics").text, "rlstack_serve_reloads_total", result="refused")
    with Senders(server.url, 4) as senders:
        wait_for(lambda: all(len(rs) >= 3 for rs in senders.results), 30, "the senders to get going")
        publish(trained_run / "policy" / "v000003", serve_root / "policy", name, mutate)
        wait_for(lambda: metric(client.get("/metrics").text, "rlstack_serve_reloads_total", result="refused")
                 > refused_before, 30, f"{name} to be refused")
        seen = sum(len(rs) for rs in senders.results)
        wait_for(lambda: sum(len(rs) for rs in senders.results) > seen + 20, 30, "more answers")
    answers = [r for rs in senders.results for r in rs]
    assert {r[1] for r in answers} == {200} and senders.versions_seen() == {before}
    forced = client.post("/v1/reload")  # an explicit reload retries, and says why it refuses
    assert forced.status_code == 409, forced.text
    assert forced.json()["result"] == "refused" and words in forced.json()["detail"], forced.json()
    assert forced.json()["policy_version"] == before
    assert client.get("/healthz").json()["policy_version"] == before
    assert client.post("/v1/act", content=GOOD, headers={"Content-Type": "application/json"}).status_code == 200
    assert words in server.log() and f"still serving {before}" in server.log()


def test_reload_with_nothing_new_is_unchanged(client: httpx.Client, serve_root: Path) -> None:
    atomic_write_text(serve_root / "policy" / "LATEST", "v000002\n")  # roll LATEST back to a good version
    r = client.post("/v1/reload")
    assert r.status_code == 200 and r.json()["result"] == "unchanged" and r.json()["policy_version"] == "v000002"


# ----- fuzzing every route from the server's own OpenAPI schema ---------------------------------

# Schemathesis's negative-data check expects 400/401/403/404/405/406/409/415/422/428/429 for a
# request the schema forbids; this server also answers 413 (documented) for a batch over
# --max-rows. The check still demands that every schema-violating request is refused.
FUZZ_CONFIG = {"checks": {"negative_data_rejection": {"expected-statuses": [
    400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]}},
    "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},  # the token for the schema's `bearer` scheme
    "seed": 1,  # the same requests every run (schemathesis draws a random seed otherwise)
    "cache": {"enabled": False}}  # no replay cache of past failures written into the working directory
FUZZ_REQUESTS: dict[str, int] = {}


@pytest.fixture(scope="module")
def openapi_schema(server: ServerProcess):
    return schemathesis.openapi.from_url(server.url + "/openapi.json", headers=AUTH,
                                         config=SchemathesisConfig.from_dict(FUZZ_CONFIG))


# Schemathesis's public Hypothesis strategies under a plain `hypothesis.given`, not its pytest
# plugin's lazy fixture: that one rewrites the private `Function._nodeid`, which pytest 9.2 removed.
def test_every_route_answers_as_its_openapi_schema_says(openapi_schema, server: ServerProcess) -> None:
    """Generated valid and invalid requests: never a 5xx, every answer's status documented, its
    content type and body as the schema says, invalid requests refused, valid ones accepted."""
    operations = [result.ok() for result in openapi_schema.get_all_operations()]  # raises on a schema error
    assert operations
    for operation in operations:
        cases = hypothesis.strategies.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                                             operation.as_strategy(GenerationMode.NEGATIVE))

        @hypothesis.given(case=cases)
        @hypothesis.settings(max_examples=100, deadline=None, derandomize=True, database=None,
                             suppress_health_check=list(hypothesis.HealthCheck))
        def answers_as_documented(case) -> None:
            FUZZ_REQUESTS[case.operation.label] = FUZZ_REQUESTS.get(case.operation.label, 0) + 1
            case.call_and_validate(timeout=30)

        flush_denormals(False)  # Hypothesis refuses to draw floats where denormals flush to zero
        try:
            answers_as_documented()
        except Exception as error:
            raise AssertionError(f"{operation.label}: {error}") from error
        finally:
            flush_denormals(True)  # as `rlstack.runtime.configure` left this process


def test_the_fuzzed_server_is_still_healthy(client: httpx.Client) -> None:
    """After the fuzzing above: it reached every route, and the server still answers correctly."""
    print(f"schemathesis requests per route: {FUZZ_REQUESTS}")
    assert set(FUZZ_REQUESTS) == {"POST /v1/act", "GET /v1/policy", "POST /v1/reload", "GET /healthz",
                                  "GET /metrics"}, FUZZ_REQUESTS
    assert FUZZ_REQUESTS["POST /v1/act"] >= 100
    assert client.post("/v1/act", content=GOOD, headers={"Content-Type": "application/json"}).status_code == 200
    text = client.get("/metrics").text
    assert not any(metric(text, "rlstack_serve_requests_total", route=route, status=str(code))
                   for route in ("/v1/act", "/v1/policy", "/v1/reload", "/healthz", "/metrics", "other")
                   for code in range(500, 600))


# ----- lifecycle ---------------------------------------------------------------------------------

class Outcome(NamedTuple):
    sent: float  # time.monotonic() when the request was sent
    done: float
    result: int | str  # the HTTP status, or the name of the exception the client got


def _send_until_refused(url: str, outcomes: list[Outcome], stop: threading.Event) -> None:
    """One keep-alive client: requests one after another until a request fails (or `stop`)."""
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer tok"}, timeout=30.0) as c:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                result: int | str = c.post("/v1/act", json={"obs": [0.0, 0.1, 0.0, 0.1]}).status_code
            except httpx.HTTPError as err:
                result = type(err).__name__
            outcomes.append(Outcome(sent, time.monotonic(), result))
            if result != 200:
                return


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_drains_the_requests_in_flight_and_exits_0(trained_run: Path, tmp_path: Path,
                                                             sig: signal.Signals) -> None:
    # A 1 s batching window keeps every client's request queued when the signal arrives; a
    # version directory is served as is (nothing to watch); the token comes from --token.
    srv = ServerProcess([str(trained_run / "policy" / "v000001"), "--max-batch", "64", "--max-wait-ms", "1000",
                         "--token", "tok"], tmp_path / "server.log")
    n_clients = 16
    outcomes: list[list[Outcome]] = [[] for _ in range(n_clients)]
    stop = threading.Event()
    threads = [threading.Thread(target=_send_until_refused, args=(srv.url, out, stop)) for out in outcomes]
    try:
        assert "not watching for new versions" in srv.log()
        for t in threads:
            t.start()
        wait_for(lambda: all(outcomes), 60, "every client to get an answer")
        answered = sum(map(len, outcomes))
        wait_for(lambda: sum(map(len, outcomes)) > answered, 30, "the next batch")
        time.sleep(0.1)  # the clients sent their next requests; the batching window has ~0.9 s left
        srv.proc.send_signal(sig)
        signalled = time.monotonic()
        time.sleep(0.2)
        assert srv.proc.poll() is None, "the server exited before answering the requests in flight"
        with pytest.raises(httpx.ConnectError):  # no new connections while it drains
            httpx.get(srv.url + "/healthz", timeout=5.0)
        assert srv.proc.wait(10) == 0, srv.log()
        assert time.monotonic() - signalled < 5.0
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        srv.stop()
    everything = [o for out in outcomes for o in out]
    in_flight = [o for o in everything if o.sent < signalled < o.done]
    assert len(in_flight) >= n_clients // 2, f"only {len(in_flight)} requests were in flight at the signal"
    assert {o.result for o in in_flight} == {200}, in_flight
    # After the signal a client's next request finds the listening socket closed: refused, never reset.
    assert {o.result for o in everything} <= {200, "ConnectError"}, {o.result for o in everything}
    ok = sum(o.result == 200 for o in everything)
    log = srv.log()
    assert f"drained: every accepted request was answered ({ok} /v1/act answers in all)" in log, log
    assert "drained and stopped; exit 0" in log and "stopped serving v000001" in log
    assert "Traceback" not in log, log


def test_soak_benchmark_reloads_under_load_without_a_failed_request(trained_run: Path, tmp_path: Path) -> None:
    """`python -m rlstack.bench serve --soak` for a few seconds: its code path, and its claims."""
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "rlstack.bench", "serve", "--soak", "0.1", "--policy", str(trained_run),
                        "--soak-clients", "8", "--window-s", "2", "--reload-every-s", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["requests"] > 100 and report["failed"] == 0, report
    assert report["reloads_ok"] >= 1 and report["reloads_refused"] == 0, report
    assert max(w["versions"] for w in report["windows"]) >= 2  # answers came from more than one version
    assert report["rss_start_mb"] > 0 and len(report["windows"]) == 3
    assert report["server_exit"] == 0 and report["server_drained"], report
    assert "failed 0" in r.stdout and "rss_mb" in r.stdout


def test_cli_refuses_a_path_without_a_policy(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "rlstack.serve", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "is not a run directory" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "rlstack.serve", str(tmp_path), "--max-batch", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--max-batch" in r.stderr, r.stderr


def test_profile_records_a_window_of_served_batches(trained_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained_run / "policy", run / "policy")
    srv = ServerProcess([str(run / "policy" / "v000001"), "--max-batch", "1", "--token", "tok", "--profile",
                         "--profile-steps", "3", "--profile-skip", "2"], tmp_path / "server.log")
    try:
        with httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer tok"}, timeout=60.0) as c:
            for i in range(8):  # skip 2 batches, record 3, then the window closes and is parsed
                assert c.post("/v1/act", json={"obs": [0.0, 0.1, 0.0, 0.1], "seed": i}).status_code == 200
        wait_for(lambda: (run / "profile" / "summary.json").is_file(), 120, "the profile summary")
        summary = json.loads((run / "profile" / "summary.json").read_text())
        assert summary["steps"] == 3, summary
        assert list((run / "profile").glob("*_ascend_ms")), "no parsed MindSpore profile directory"
        assert not (run / "policy" / "v000001" / "profile").exists()  # the version stays as exported
        # A graceful stop (the profiler closed) exits 0; -9 if it had to be killed.
        assert srv.stop() == 0, srv.log()
        assert "stopped serving v000001" in srv.log()
    finally:
        srv.stop()


def test_a_plain_client_sending_a_body_over_the_limit_reads_the_413(server: ServerProcess,
                                                                   client: httpx.Client) -> None:
    """urllib sends the whole body before reading: the server reads (and drops) it, then answers."""
    import urllib.error
    import urllib.request

    body = b'{"obs": [' + b"0.0, " * 600_000 + b"0.0]}"  # 3 MB, the limit is 64 KiB
    request = urllib.request.Request(server.url + "/v1/act", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **AUTH})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 413 and "bytes" in json.loads(caught.value.read())["error"]
    assert client.post("/v1/act", content=GOOD, headers={"Content-Type": "application/json"}).status_code == 200

"""`python -m rlstack.serve RUN --replicas 2` end to end: a real local Ray cluster started by the
command, two Ray Serve replicas of the policy server's app behind Serve's HTTP proxy on a free
loopback port, real HTTP; the policy comes from the same short training run as test_server.py's.

Answers are compared to `load_policy(...).act(...)` as test_server.py explains (bitwise for a lone
request, at 1e-5 on logp/value when requests may have shared a graph call). The answering replica
is named by the `x-rlstack-replica` response header that only `--replicas N` adds.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from tests.serving import test_server
from tests.serving.test_server import (
    AUTH,
    OBS_DIM,
    TOKEN,
    References,
    Senders,
    ServerProcess,
    assert_close_to_reference,
    publish,
    wait_for,
)

trained_run = test_server.trained_run  # the same short PPO run (a session fixture, found by name)

pytestmark = pytest.mark.slow  # 40-60 s here: a Ray cluster, Serve and two replicas start once for the file

REPLICAS = 2
REPLICA = "x-rlstack-replica"


serve_root = test_server.serve_root  # a run directory of this module's own, starting with v000001 only


@pytest.fixture(scope="module")
def server(serve_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two replicas; token from the environment, batching window 5 ms, LATEST polled every 0.2 s."""
    proc = ServerProcess([str(serve_root), "--replicas", str(REPLICAS), "--max-wait-ms", "5",
                          "--max-body-bytes", "65536", "--reload-poll-s", "0.2"],
                         tmp_path_factory.mktemp("replicas_log") / "server.log", env={"RLSTACK_TOKEN": TOKEN})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def refs(serve_root: Path) -> References:
    return References(serve_root / "policy")


# ----- the cluster -----------------------------------------------------------------------------

def test_ray_runs_on_loopback_only(server: ServerProcess) -> None:
    # The nodes the command's own Ray cluster reports (ray.nodes()' NodeManagerAddress, logged) ...
    nodes = re.search(r"Ray \S+ started here \(nodes: ([^)]*)\)", server.log())
    assert nodes, server.log()
    addresses = nodes.group(1).split(", ")
    assert addresses == ["127.0.0.1"], addresses
    # ... and every socket the server's process tree (driver, GCS, raylet, agents, Serve's
    # controller and proxy, the replicas) listens on, but one: Ray Serve 2.60 starts each replica's
    # inter-deployment gRPC server on "[::]:0" whatever the node address (serve/_private/replica.py,
    # not configurable; Ray's token authentication guards it). Exactly one such port per replica.
    tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(True)]
    listening = {(p.name(), c.laddr.ip, c.laddr.port) for p in tree for c in _listening(p)}
    exposed = {s for s in listening if s[1] not in ("127.0.0.1", "::ffff:127.0.0.1")}
    assert len(exposed) == REPLICAS and all(name.startswith("ray::ServeReplica") and ip == "::"
                                            for name, ip, _ in exposed), exposed
    assert len(listening) > 2 * REPLICAS
    assert any(port == int(server.url.rsplit(":", 1)[1]) for _, ip, port in listening if ip == "127.0.0.1")


def _listening(proc: psutil.Process) -> list:
    try:
        return [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:  # a worker that exited meanwhile
        return []


# ----- answers ---------------------------------------------------------------------------------

def test_two_replicas_answer_as_load_policy_act(server: ServerProcess, refs: References) -> None:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30.0) as client:
        # Lone requests run at batch size 1 on whichever replica: bitwise the reference.
        obs = np.random.default_rng(7).normal(size=(6, OBS_DIM)).astype(np.float32)
        for i, o in enumerate(obs):
            r = client.post("/v1/act", json={"obs": o.tolist(), "seed": 1000 + i})
            assert r.status_code == 200, r.text
            body = r.json()
            ref = refs(body["policy_version"]).act(o, seed=1000 + i)
            assert (body["action"], np.float32(body["logp"]), np.float32(body["value"])) == \
                (int(ref.action), ref.logp, ref.value)
        batch = np.random.default_rng(8).normal(size=(16, OBS_DIM)).astype(np.float32)
        body = client.post("/v1/act", json={"obs": batch.tolist(), "seed": 99}).json()
        ref = refs(body["policy_version"]).act(batch, seed=99)
        assert body["action"] == ref.action.tolist()
        np.testing.assert_array_equal(np.array(body["logp"], np.float32), ref.logp)
    # Concurrent clients: Serve spreads them over both replicas, each batching its share.
    with Senders(server.url, 8, REPLICA) as clients:
        wait_for(lambda: len(clients.answers()) >= 400 and len(clients.last_version_by_tag()) == REPLICAS,
                 60, "answers from both replicas")
    answers = clients.answers()
    assert [a.status for a in answers] == [200] * len(answers), [a.body for a in answers if a.status != 200][:3]
    per_replica = {rep: sum(a.tag == rep for a in answers) for rep in {a.tag for a in answers}}
    assert len(per_replica) == REPLICAS and all(n >= 20 for n in per_replica.values()), per_replica
    assert_close_to_reference([(a.obs, a.seed, a.body) for a in answers], refs)
    print(f"{len(answers)} concurrent answers by replica: {per_replica}")


def test_guards_and_routes_are_the_apps(server: ServerProcess) -> None:
    good = {"obs": [0.0] * OBS_DIM}
    with httpx.Client(base_url=server.url, timeout=30.0) as anon:
        r = anon.post("/v1/act", json=good)
        assert r.status_code == 401 and r.json()["error"] == "missing Authorization header"
        assert anon.get("/healthz").status_code == 200  # the one route without the token
        big = anon.post("/v1/act", content=b"[" + b"0.0," * 20_000 + b"0.0]", headers=AUTH)
        assert big.status_code == 413 and "65536" in big.json()["expected"]
        bad = anon.post("/v1/act", json={"obs": [1.0, 2.0]}, headers=AUTH)
        assert bad.status_code == 422 and "[4]" in bad.json()["expected"]
        manifest = anon.get("/v1/policy", headers=AUTH).json()
        assert manifest["observation_space"]["shape"] == [OBS_DIM]
        metrics = anon.get("/metrics", headers=AUTH)
        assert metrics.status_code == 200 and "rlstack_serve_requests_total" in metrics.text
        assert REPLICA in metrics.headers


# ----- hot reload --------------------------------------------------------------------------------

def publish_v2_under_load(url: str, trained_run: Path, policy_dir: Path, refs: References) -> list:
    """Six clients on both replicas, serving v000001; v000002 published meanwhile, until both
    replicas answer with it and 60 more answers came. Every answer 200 and as `load_policy`'s."""
    with Senders(url, 6, REPLICA) as clients:
        wait_for(lambda: len(clients.last_version_by_tag()) == REPLICAS, 60, "answers from both replicas")
        assert set(clients.last_version_by_tag().values()) == {"v000001"}
        publish(trained_run / "policy" / "v000002", policy_dir, "v000002")
        wait_for(lambda: set(clients.last_version_by_tag().values()) == {"v000002"}, 60,
                 "both replicas to answer with v000002")
        seen = len(clients.answers())
        wait_for(lambda: len(clients.answers()) > seen + 60, 30, "more answers")
    answers = clients.answers()
    assert [a.status for a in answers] == [200] * len(answers), [a.body for a in answers if a.status != 200][:3]
    assert_close_to_reference([(a.obs, a.seed, a.body) for a in answers], refs)
    return answers


def test_a_new_version_reaches_every_replica_while_clients_send(
        server: ServerProcess, serve_root: Path, trained_run: Path, refs: References) -> None:
    answers = publish_v2_under_load(server.url, trained_run, serve_root / "policy", refs)
    by_replica: dict[str, set[str]] = {}
    for a in answers:
        by_replica.setdefault(a.tag, set()).add(a.body["policy_version"])
    assert len(by_replica) == REPLICAS and all(v == {"v000001", "v000002"} for v in by_replica.values()), by_replica
    # Each replica logged its own reload (Ray forwards the replicas' lines to the command's log).
    wait_for(lambda: len(re.findall(r"reload: now serving v000002", server.log())) == REPLICAS, 10,
             "both replicas' reload lines in the log")
    print(f"hot reload on {REPLICAS} replicas under load: {len(answers)} requests, 0 failed")


# ----- a two-node cluster ----------------------------------------------------------------------

def test_two_replicas_on_the_worker_node_of_a_two_node_cluster(trained_run: Path,
                                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """`--ray-address`: the command joins a cluster of a head node (no CPUs) and a worker node (2
    CPUs), all on 127.0.0.1; each replica needs a CPU, so both run on the worker node. They answer
    as `load_policy` does and take a new version under load without a failed request."""
    import os

    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray is imported: loopback
    import ray
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("replicas_cluster_root")
    (root / "policy").mkdir()
    publish(trained_run / "policy" / "v000001", root / "policy", "v000001")
    refs = References(root / "policy")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=REPLICAS)
    server = None
    try:
        ray.init(address=cluster.address)
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"} and len(ray.nodes()) == 2
        server = ServerProcess([str(root), "--replicas", str(REPLICAS), "--ray-address", cluster.address,
                                "--max-wait-ms", "5", "--reload-poll-s", "0.2"],
                               tmp_path_factory.mktemp("replicas_cluster_log") / "server.log",
                               env={"RLSTACK_TOKEN": TOKEN})
        # The worker node's 2 CPUs are the cluster's only ones, and the replicas hold both.
        assert ray.cluster_resources()["CPU"] == REPLICAS and ray.available_resources().get("CPU", 0) == 0
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=30.0) as client:
            obs = np.random.default_rng(11).normal(size=(3, OBS_DIM)).astype(np.float32)
            for i, o in enumerate(obs):
                body = client.post("/v1/act", json={"obs": o.tolist(), "seed": 50 + i}).json()
                ref = refs(body["policy_version"]).act(o, seed=50 + i)
                assert (body["action"], np.float32(body["logp"])) == (int(ref.action), ref.logp)
        answers = publish_v2_under_load(server.url, trained_run, root / "policy", refs)
        assert server.stop(timeout_s=60) == 0, server.log()
        print(f"two-node cluster: {len(answers)} requests across the reload, 0 failed")
    finally:
        if server is not None:
            server.stop()
        ray.shutdown()
        cluster.shutdown()


# ----- the command -------------------------------------------------------------------------------

def test_sigterm_drains_every_replica_and_stops_ray(server: ServerProcess) -> None:
    tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(True)]
    assert len(tree) > REPLICAS + 3  # driver, GCS, raylet, Serve's controller and proxy, replicas
    t0 = time.monotonic()
    assert server.stop(timeout_s=60) == 0, server.log()
    log = server.log()
    assert len(re.findall(r"drained: every accepted request was answered", log)) == REPLICAS, log
    assert "stopped: Serve and Ray shut down; exit 0" in log
    _, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, [p.info for p in alive]
    print(f"SIGTERM to exit: {time.monotonic() - t0:.1f} s; no process of the server left")


def test_without_ray_the_cli_names_the_install_command(trained_run: Path) -> None:
    # A fresh interpreter where `import ray` fails, as when the extra is not installed.
    code = ("import sys; sys.modules['ray'] = None; from rlstack.serve import main; "
            f"sys.exit(main([{str(trained_run)!r}, '--replicas', '2']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert 'pip install -e ".[ray]"' in done.stderr and "Ray Serve" in done.stderr
    assert "Uvicorn running" not in done.stderr + done.stdout


def test_a_ray_address_where_nothing_answers_is_refused_at_once(trained_run: Path) -> None:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rlstack.serve", str(trained_run), "--replicas", "2",
                           "--ray-address", "127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--ray-address 127.0.0.1:9: nothing answers there" in done.stderr
    assert time.monotonic() - t0 < 30  # Ray itself would try for over a minute

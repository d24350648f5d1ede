"""Runs the policy server's app on N Ray Serve replicas behind Serve's HTTP proxy (serving stage, `--replicas N`).

Each replica is one Ray actor process holding one copy of the app `create_app` builds: Serve
runs the app's lifespan hook in the replica (uvicorn's lifespan code, `ASGIAppReplicaWrapper`),
so every replica configures its own MindSpore runtime, loads and compiles the policy, runs its
own batcher and polls LATEST itself; the token and body-limit guards are the app's middleware.
Serve's proxy (uvicorn) takes the HTTP connections on --host/--port and hands each request to
one replica. Only `python -m rlstack.serve --replicas N` (N >= 2) imports this module: Ray is an
optional dependency (`pip install -e ".[ray]"`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from rlstack.serving import ray_cluster
from rlstack.serving.app import ASGIApp, Receive, Scope, Send, create_app
from rlstack.serving.settings import ServeSettings

log = logging.getLogger("rlstack.serve")

APP_NAME = "rlstack"
"""The Serve application's name (`serve status`, and what is deleted from a joined cluster at exit)."""
REPLICA_HEADER = "x-rlstack-replica"
"""Response header naming the replica that answered (its Serve replica id)."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RAY_INSTALL = ray_cluster.INSTALL


def prepare_ray(settings: ServeSettings) -> str | None:
    """Ready this process for Ray before it is first imported; the reason it cannot run (None: it can).

    Starts nothing: the CLI calls it before it checks the policy and before any process starts."""
    if importlib.util.find_spec("ray") is None:  # finding a top-level package imports nothing
        return f"--replicas {settings.replicas} runs on Ray Serve, which is not installed: {RAY_INSTALL}"
    problem = ray_cluster.prepare(settings.ray_address)  # loopback for a cluster on this machine
    if problem:
        return problem
    problem = ray_cluster.unreachable(settings.ray_address)
    if problem:
        return f"--ray-address {settings.ray_address}: nothing answers there ({problem})"
    # Each replica's log lines reach this console; Ray's de-duplication would show only one replica's.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    try:
        importlib.import_module("ray.serve")
    except ImportError as err:  # `ray` without its serve extra (fastapi, uvicorn, ...)
        return f"--replicas {settings.replicas} needs Ray Serve, which does not import ({err}): {RAY_INSTALL}"
    return None


class ReplicaHeaderMiddleware:
    """Adds `x-rlstack-replica: <id>` to every answer, so a client (and the tests) can tell replicas apart."""

    def __init__(self, app: ASGIApp, replica: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


class PolicyReplica:
    """One replica (a Ray actor process): this process's settings first, then the app, whose
    lifespan hook Serve runs next (it configures MindSpore, loads and compiles the policy, starts
    the batcher and the LATEST poller) and runs again, to drain, when the replica stops."""

    def __init__(self, settings: ServeSettings, switch_interval_s: float):
        self._settings = settings
        # A replica is a fresh Ray worker process: the CLI's process-wide choices are made again here.
        logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
        logging.getLogger("rlstack").setLevel(settings.log_level.upper())
        sys.setswitchinterval(switch_interval_s)  # why: rlstack/serve.py GIL_SWITCH_INTERVAL_S

    def __serve_build_asgi_app__(self) -> ASGIApp:
        from ray import serve

        app = create_app(self._settings)
        replica = serve.get_replica_context().replica_id.unique_id
        app.add_middleware(ReplicaHeaderMiddleware, replica=replica)
        log.info("replica %s (pid %d) built the app; its lifespan loads %s", replica, os.getpid(),
                 self._settings.policy)
        return app


def policy_deployment(settings: ServeSettings) -> Any:
    """The Serve deployment of `PolicyReplica` for `settings` (an ingress built late, in each replica)."""
    from ray import serve

    return serve.deployment(
        serve.ingress()(PolicyReplica), name="policy", num_replicas=settings.replicas,
        # Serve's default (5 requests in flight per replica) would starve the batcher: a batch
        # only fills from requests that are in flight together.
        max_ongoing_requests=max(64, 2 * settings.max_batch),
        graceful_shutdown_timeout_s=settings.graceful_timeout_s,
        logging_config={"enable_access_log": settings.access_log, "log_level": settings.log_level.upper()},
        ray_actor_options={"num_cpus": 1})


def free_port(host: str) -> int:
    """A port free on `host` now (for --port 0: Serve's proxy needs a number up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def start_ray(settings: ServeSettings) -> bool:
    """Join the cluster at `settings.ray_address`, or start a local one on loopback; True if started here."""
    import ray

    if settings.ray_address is not None:
        ray.init(address=settings.ray_address, logging_level=logging.WARNING)
        return False
    if os.environ.get(ray_cluster.LOCAL_ONLY_ENV) != "0":
        raise RuntimeError("prepare_ray() must run before Ray is imported")
    # address="local": a new cluster even when $RAY_ADDRESS or a `ray start` cluster on this
    # machine exists (ray.init() would join those). _node_ip_address alone does not keep Ray on
    # loopback (see serving/ray_cluster.py). No dashboard. Enough CPUs declared for every replica to
    # be placed (each asks for one).
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
             num_cpus=max(os.cpu_count() or 1, settings.replicas), logging_level=logging.WARNING)
    return True


def wait_until_answering(url: str, timeout_s: float) -> None:
    """Serve's proxy learns the app's route a moment after `serve.run` returns: wait for /healthz."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/healthz did not answer 200 within {timeout_s:.0f} s")
        time.sleep(0.1)


def run_replicas(settings: ServeSettings, *, switch_interval_s: float) -> int:
    """Serve `settings.policy` on `settings.replicas` Ray Serve replicas until SIGTERM/SIGINT; the exit status.

    Ray is started here (loopback only) unless `settings.ray_address` names a cluster to join;
    `prepare_ray(settings)` must have run first."""
    import ray
    from ray import serve

    stop = threading.Event()
    received: list[str] = []

    def note(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    def listen() -> dict[int, Any]:
        return {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}

    port = settings.port or free_port(settings.host)
    # Until Ray is up a signal keeps its default effect: ray.init blocks in native code (a wrong
    # --ray-address makes it retry for minutes), where a Python handler would never run.
    try:
        started_here = start_ray(settings)
    except Exception as err:  # e.g. a refused --ray-address
        log.error("cannot start or join Ray: %s: %s", type(err).__name__, err)
        return 1
    # ray.init installs its own SIGTERM handler (it logs the signal and kills the process, with
    # no shutdown of Serve): the signals are ours from here on.
    previous = listen()
    status = 0
    try:
        nodes = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
        log.info("Ray %s %s (nodes: %s); starting Serve's HTTP proxy on %s:%d and %d replicas",
                 ray.__version__, "started here" if started_here else f"joined at {settings.ray_address}",
                 ", ".join(nodes), settings.host, port, settings.replicas)
        if started_here and not all(map(ray_cluster.is_loopback, nodes)):
            raise RuntimeError(f"the local Ray node is not on loopback ({', '.join(nodes)}): refusing to serve")
        serve.start(http_options={"host": settings.host, "port": port,
                                  "keep_alive_timeout_s": math.ceil(settings.keep_alive_s)})
        t0 = time.perf_counter()
        serve.run(policy_deployment(settings).bind(settings, switch_interval_s), name=APP_NAME,
                  route_prefix="/")
        url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '') else settings.host}:{port}"
        wait_until_answering(url, timeout_s=60.0)
        log.info("%d replicas ready in %.1f s", settings.replicas, time.perf_counter() - t0)
        # Serve's proxy is a uvicorn server; the line has the form the single-process server logs.
        log.info("Uvicorn running on http://%s:%d (Ray Serve's HTTP proxy, %d replicas)",
                 settings.host, port, settings.replicas)
        while not stop.wait(0.5):
            pass
        log.info("%s: shutting down Serve (each replica answers the requests it holds, for up to %.0f s)",
                 received[0], settings.graceful_timeout_s)
    except Exception:
        log.exception("Ray Serve failed")
        status = 1
    finally:
        if started_here:
            serve.shutdown()
        else:  # a joined cluster keeps its Serve instance and its other applications
            serve.delete(APP_NAME)
        ray.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("stopped: %s; exit %d", "Serve and Ray shut down" if started_here
             else f"application '{APP_NAME}' deleted, disconnected from Ray", status)
    return status

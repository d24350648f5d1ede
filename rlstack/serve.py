"""`python -m rlstack.serve`: serve a trained policy over HTTP (the serving stage's entry point)."""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from rlstack.errors import RlstackError
from rlstack.serving.settings import TOKEN_ENV, ServeSettings

if TYPE_CHECKING:
    import uvicorn


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlstack.serve",
        description="Serve the exported policy graph over HTTP: POST /v1/act, GET /v1/policy, POST /v1/reload, "
                    "GET /healthz, GET /metrics, OpenAPI at /openapi.json. A run or policy/ directory is "
                    "watched: a new version named by LATEST is loaded, verified and swapped in.")
    parser.add_argument("policy", type=Path, help="run directory, its policy/ directory, or one version directory")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to bind (default loopback; 0.0.0.0 exposes the server to the network)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: pick a free one; default 8000)")
    parser.add_argument("--max-batch", type=int, default=64,
                        help="most observations per graph call (1 turns dynamic batching off; default 64)")
    parser.add_argument("--max-wait-ms", type=float, default=2.0,
                        help="longest a request waits for others to join its batch (default 2)")
    parser.add_argument("--max-rows", type=int, default=1024, help="most observations in one request (default 1024)")
    parser.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (default 4 MiB)")
    parser.add_argument("--token", default=None,
                        help=f"bearer token required on every route but /healthz (default: ${TOKEN_ENV} if set)")
    parser.add_argument("--reload-poll-s", type=float, default=0.5,
                        help="seconds between checks of LATEST (0: only POST /v1/reload; default 0.5)")
    parser.add_argument("--keep-alive-s", type=float, default=75.0,
                        help="seconds an idle keep-alive connection stays open (default 75: longer than "
                             "pooled clients keep theirs)")
    parser.add_argument("--replicas", type=int, default=1, metavar="N",
                        help="copies of the server: 1 (default) runs it in this process; N >= 2 runs it on N "
                             "Ray Serve replicas behind Serve's HTTP proxy on --host/--port (needs "
                             "pip install -e \".[ray]\")")
    parser.add_argument("--ray-address", default=None, metavar="ADDR",
                        help="with --replicas >= 2: join the Ray cluster at ADDR (e.g. 'auto' or "
                             "HOST:6379) instead of starting a local one bound to loopback")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu", "ascend"), help="MindSpore device")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--access-log", action="store_true", help="log every request (costs CPU at high rates)")
    parser.add_argument("--profile", action="store_true",
                        help="run MindSpore's Profiler over a window of served batches; output in <run>/profile "
                             "with a table of the slowest operators")
    parser.add_argument("--profile-steps", type=int, default=20, metavar="N",
                        help="served batches recorded by --profile (default 20)")
    parser.add_argument("--profile-skip", type=int, default=5, metavar="N",
                        help="served batches before the window opens (default 5)")
    return parser


GIL_SWITCH_INTERVAL_S = 0.0005


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _uvicorn_impl() -> tuple[str, str]:
    # uvicorn's "auto": the C implementations when `uvicorn[standard]` is installed (less CPU per
    # request), else pure-Python h11 and asyncio.
    has = importlib.util.find_spec
    return ("httptools" if has("httptools") else "h11"), ("uvloop" if has("uvloop") else "asyncio")


def profile_dir_for(policy: Path) -> Path:
    """`--profile` output: `<run>/profile` for a run, its `policy/` dir or one of its versions."""
    from rlstack.artifact import MANIFEST_FILE  # imported here: `--help` does not load MindSpore

    if (policy / MANIFEST_FILE).is_file():  # a version directory: keep it as exported
        policy = policy.parent
    if policy.name == "policy":
        policy = policy.parent
    return policy / "profile"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = ServeSettings(
            policy=args.policy, host=args.host, port=args.port, max_batch=args.max_batch,
            max_wait_ms=args.max_wait_ms, max_rows=args.max_rows, max_body_bytes=args.max_body_bytes,
            token=args.token or os.environ.get(TOKEN_ENV) or None, reload_poll_s=args.reload_poll_s,
            keep_alive_s=args.keep_alive_s,
            device=args.device, log_level=args.log_level, access_log=args.access_log,
            profile_dir=profile_dir_for(args.policy) if args.profile else None,
            profile_steps=args.profile_steps, profile_skip=args.profile_skip,
            replicas=args.replicas, ray_address=args.ray_address)
    except ValidationError as err:
        problems = "; ".join(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in err.errors())
        print(f"error: {problems}", file=sys.stderr)
        return 2
    if settings.replicas > 1:
        if settings.profile_dir is not None:
            print("error: --profile profiles one server process; use it with --replicas 1", file=sys.stderr)
            return 2
        from rlstack.serving.replicas import prepare_ray  # Ray itself is imported by prepare_ray

        problem = prepare_ray(settings)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    elif settings.ray_address is not None:
        print("error: --ray-address needs --replicas >= 2 (one replica runs in this process, without Ray)",
              file=sys.stderr)
        return 2
    # Imported late: `--help` and usage errors should not pay for MindSpore and uvicorn.
    from rlstack.artifact import check_manifest, read_manifest, resolve_version_dir

    try:  # fail fast, before the server starts, on a path that holds no policy
        version_dir = resolve_version_dir(settings.policy)
        check_manifest(read_manifest(version_dir), version_dir)
    except RlstackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("rlstack.serve")
    if not _is_loopback(settings.host):
        log.warning("binding %s: the server is reachable from other machines%s", settings.host,
                    "" if settings.token else " and has no token (--token or $" + TOKEN_ENV + ")")
    if settings.replicas > 1:
        from rlstack.serving.replicas import run_replicas  # imports Ray: only for --replicas >= 2

        if settings.reload_poll_s == 0:
            log.warning("--reload-poll-s 0 with %d replicas: POST /v1/reload reaches only the replica Serve "
                        "routes it to; the others keep serving their version", settings.replicas)
        return run_replicas(settings, switch_interval_s=GIL_SWITCH_INTERVAL_S)

    import uvicorn

    from rlstack.serving.app import create_app

    # The graph thread has to win the GIL back from a busy event loop several times per graph
    # call: a 0.5 ms switch interval, not Python's default 5 ms (docs/PERFORMANCE.md#serve). The
    # server process is ours, so the interpreter-wide setting is too.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    log.info("HTTP parser %s, event loop %s", *_uvicorn_impl())
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level,
        access_log=settings.access_log, lifespan="on", timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=settings.graceful_timeout_s))
    # SIGTERM/SIGINT: stop accepting, answer the requests in flight, run the lifespan shutdown.
    stopped_by = run_until_signal(server)
    if not server.started:
        return 1
    drained = getattr(app.state, "drained", False)
    if stopped_by:
        log.info("%s: %s; exit %d", stopped_by, "drained and stopped" if drained else "stopped without draining",
                 0 if drained else 1)
    return 0 if drained else 1


def run_until_signal(server: uvicorn.Server) -> str | None:
    """Run `server` until SIGTERM/SIGINT has shut it down; the name of the signal (None if none).

    uvicorn catches the signal, shuts down gracefully, restores the handlers it found and then
    raises the signal again so the process dies of it (exit 143 for SIGTERM, a KeyboardInterrupt
    traceback for SIGINT) even after a clean drain. The handlers installed here are the ones it
    finds, so they receive that second signal instead, and the exit status says whether the
    drain was clean. A signal that arrives before uvicorn installs its own handlers (while the
    app is built) asks the server to exit as soon as it has started.
    """
    received: list[int] = []

    def note(signum: int, frame: object) -> None:
        received.append(signum)
        server.should_exit = True

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return signal.Signals(received[0]).name if received else None


if __name__ == "__main__":
    sys.exit(main())

"""Builds the policy server's FastAPI app (serving stage): lifespan, guards, error answers, hot reload.

The policy is loaded in the lifespan hook through `rlstack.acting.load_policy` (the loader
the actor uses), never at import. A new version is loaded and verified beside the one being
served (reading and checksumming on a loader thread, compiling on the graph thread between two
batches) and swapped in only when it works; a version that fails any check is refused, logged
and counted, and the old one keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from rlstack.acting import Policy, load_policy
from rlstack.artifact import ArtifactError
from rlstack.profiling import ProfileWindow
from rlstack.runtime import configure
from rlstack.serving.batcher import Batcher, ServedPolicy, bucket_sizes
from rlstack.serving.metrics import ServeMetrics
from rlstack.serving.routes import (
    FLOAT32_MAX,
    NPY,
    ROUTES,
    BadInput,
    act,
    act_openapi,
    expected_obs,
    router,
)
from rlstack.serving.settings import ServeSettings
from rlstack.serving.state import Reloader, ServerState

log = logging.getLogger("rlstack.serve")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# ----- ASGI guards (pure ASGI: BaseHTTPMiddleware costs far more per request) ----------------

async def _send_error(send: Send, status: int, error: str, expected: str | None,
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": error, "expected": expected}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class MetricsMiddleware:
    """Counts every answer by route and status (including the guards' 401/413) and times it; keeps
    the count of requests in flight and of those cut off, which tell whether a shutdown drained."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics):
        self.app = app
        self.metrics = metrics
        self._cache: dict[tuple[str, int], _RouteStatus] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in ROUTES else "other"
        status = 500
        t0 = time.perf_counter()

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:
            self.metrics.cut_off.inc()
            raise
        finally:
            self.metrics.in_flight.dec()
            self._children(route, status).observe(time.perf_counter() - t0)

    def _children(self, route: str, status: int) -> _RouteStatus:
        # Label lookups take a lock and hash the labels; at thousands of requests/s, cache them.
        key = (route, status)
        if key not in self._cache:
            code = str(status)
            self._cache[key] = _RouteStatus(self.metrics.requests.labels(route, code),
                                            self.metrics.errors.labels(route, code) if status >= 400 else None,
                                            self.metrics.request_seconds.labels(route))
        return self._cache[key]


@dataclass(frozen=True)
class _RouteStatus:
    requests: Any
    errors: Any
    seconds: Any

    def observe(self, seconds: float) -> None:
        self.requests.inc()
        if self.errors is not None:
            self.errors.inc()
        self.seconds.observe(seconds)


class TokenMiddleware:
    """`Authorization: Bearer <token>` on every route but /healthz."""

    def __init__(self, app: ASGIApp, token: str):
        self.app = app
        self.expected = b"Bearer " + token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz":
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if not hmac.compare_digest(given, self.expected):  # constant time: no token guessing by timing
            problem = "missing Authorization header" if not given else "wrong bearer token"
            return await _send_error(send, 401, problem, "header 'Authorization: Bearer <token>'",
                                     [(b"www-authenticate", b"Bearer")])
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """413 for a body over `limit` bytes, decided before the app reads it.

    The refused body is still read and discarded (up to `DRAIN_MAX_BYTES`) before the answer:
    an ordinary client (Python's urllib) sends its whole body before it reads a response, and
    sees a reset connection instead of the 413 if the server answers and closes first."""

    DRAIN_MAX_BYTES = 64 * 2**20

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        expected = f"a body of at most {self.limit} bytes (--max-body-bytes)"
        if length is not None:  # the HTTP layer already checked it is a number that matches the body
            if int(length) > self.limit:
                if int(length) <= self.DRAIN_MAX_BYTES:
                    await _drain(receive)
                return await _send_error(send, 413, f"body is {int(length)} bytes", expected,
                                         [(b"connection", b"close")])
            return await self.app(scope, receive, send)
        # Chunked body of unknown length: read it here, up to the limit, then replay it.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                if more:
                    await _drain(receive, self.DRAIN_MAX_BYTES - size)
                return await _send_error(send, 413, f"body is over {self.limit} bytes", expected,
                                         [(b"connection", b"close")])
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def receive_replayed() -> dict[str, Any]:
            return replay.pop() if replay else await receive()

        await self.app(scope, receive_replayed, send)


async def _drain(receive: Receive, budget: int = BodyLimitMiddleware.DRAIN_MAX_BYTES) -> None:
    """Read and discard the rest of a request body (at most `budget` bytes)."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


# ----- error answers -------------------------------------------------------------------------

def _describe(err: dict[str, Any]) -> str:
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    field = ".".join(loc)
    kind = err.get("type", "")
    if kind == "json_invalid":
        if err.get("input") in (b"", ""):
            return "body is empty; a JSON object is required"
        return f"body is not valid JSON ({err.get('ctx', {}).get('error', 'decode error')})"
    if kind == "missing":
        return f"missing field '{field}'" if field else "body is empty; a JSON object is required"
    if kind == "extra_forbidden":
        return f"unknown field '{field}'"
    if kind in ("model_type", "model_attributes_type", "dict_type") and not field:
        return f"body must be a JSON object, got {type(err.get('input')).__name__}"
    if kind == "list_type":
        return f"'{field}' must be a list (JSON array), got {json.dumps(err.get('input'))[:60]}"
    return f"'{field}': {err.get('msg', kind)}, got {json.dumps(err.get('input'), default=str)[:60]}"


def _expected(request: Request) -> str | None:
    server: ServerState | None = getattr(request.app.state, "server", None)
    if server is None:
        return None
    policy = server.batcher.served.policy
    return expected_obs(policy.obs_shape, server.settings.max_rows, policy.obs_dtype)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    status = 400 if any(e.get("type") == "json_invalid" for e in errors) else 422
    return JSONResponse({"error": "; ".join(_describe(e) for e in errors), "expected": _expected(request)},
                        status_code=status)


async def on_bad_input(request: Request, exc: BadInput) -> JSONResponse:
    return JSONResponse({"error": exc.error, "expected": exc.expected}, status_code=exc.status)


# ----- OpenAPI: the schemas state the loaded policy's obs shape and action dtype --------------

def _array_schema(shape: list[int], item: dict[str, Any]) -> dict[str, Any]:
    schema = item
    for dim in reversed(shape):
        schema = {"type": "array", "items": schema, "minItems": dim, "maxItems": dim}
    return schema


def _policy_schemas(policy: Policy, max_rows: int) -> tuple[dict[str, Any], dict[str, Any]]:
    # Beyond float32's range a number would be inf in the graph; the server refuses it (422).
    number = {"type": "number", "format": "float", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX}
    frames = policy.obs_dtype == np.uint8
    entry = {"type": "integer", "minimum": 0, "maximum": 255} if frames else number
    one = _array_schema(list(policy.obs_shape), entry)
    obs = {"anyOf": [one, {"type": "array", "items": one, "minItems": 1, "maxItems": max_rows}],
           "description": f"One observation of shape {list(policy.obs_shape)} ({policy.obs_dtype.name}) or a batch "
                          f"[B, {', '.join(map(str, policy.obs_shape))}] with 1 <= B <= {max_rows}."}
    space = policy.manifest["action_space"]
    if space["type"] == "Discrete":
        single = {"type": "integer", "format": "int32", "minimum": 0, "maximum": int(space["n"]) - 1}
        what = f"int32 index in [0, {int(space['n']) - 1}]"
    else:
        single = _array_schema(list(space["shape"]), number)
        what = f"float32 vector of shape {list(space['shape'])}, clipped to the action space"
    action = {"anyOf": [single, {"type": "array", "items": single}],
              "description": f"The action: {what} (a list of them for a batch)."}
    return obs, action


def _document_npy(operation: dict[str, Any], obs_shape: tuple[int, ...], max_rows: int) -> None:
    """POST /v1/act of a policy of uint8 frames also takes them as one binary .npy array."""
    dims = ", ".join(map(str, obs_shape))
    operation["requestBody"]["content"][NPY] = {"schema": {
        "type": "string", "format": "binary",
        "description": f"One .npy array (numpy.save) of dtype uint8: one frame [{dims}] or a batch [B, {dims}] with "
                       f"1 <= B <= {max_rows}; the answer is the same JSON as for a JSON request."}}
    operation["parameters"] = [
        {"name": "deterministic", "in": "query", "required": False, "schema": {"type": "boolean", "default": False},
         "description": f"With a {NPY} body: the greedy / mean action (the JSON body's `deterministic`)."},
        {"name": "seed", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
         "description": f"With a {NPY} body: fixes the noise of a sampled action (the JSON body's `seed`)."}]


# ----- the app -------------------------------------------------------------------------------

@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: ServeSettings = app.state.settings
    metrics: ServeMetrics = app.state.metrics
    loop = asyncio.get_running_loop()
    runtime = configure(settings.device)
    # One graph thread: MindSpore runs (and compiles) one graph at a time in a process.
    graph_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlstack-graph")
    loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlstack-loader")
    try:
        policy = await loop.run_in_executor(loader, functools.partial(
            load_policy, settings.policy, device=runtime.device, fusion=runtime.fusion))
        served = ServedPolicy.of(policy, bucket_sizes(settings.max_batch, settings.max_rows))
        profile = None
        if settings.profile_dir is not None:
            profile = ProfileWindow(settings.profile_dir, steps=settings.profile_steps, skip=settings.profile_skip,
                                    printer=log.info)
        batcher = Batcher(served, max_batch=settings.max_batch, max_wait_s=settings.max_wait_s,
                          metrics=metrics, executor=graph_thread, profile=profile)
        t0 = time.perf_counter()
        await batcher.compile(served)
    except ArtifactError as err:
        log.error("cannot serve %s: %s", settings.policy, err)
        graph_thread.shutdown()
        loader.shutdown()
        raise
    log.info("compiled %s for batch sizes %s in %.1f s", policy.version, list(served.buckets),
             time.perf_counter() - t0)
    batcher.start()
    reloader = Reloader(settings, runtime, batcher, metrics, loader)
    app.state.server = ServerState(settings, metrics, batcher, reloader, np.random.default_rng())
    metrics.serving(policy)
    poller = loop.create_task(reloader.poll(settings.reload_poll_s)) if settings.reload_poll_s > 0 else None
    log.info("serving %s (%s, obs %s) from %s; batching up to %d rows / %.1f ms; %s",
             policy.version, policy.manifest["algorithm"], list(policy.obs_shape), policy.path,
             settings.max_batch, settings.max_wait_ms,
             f"watching {reloader.latest}" if reloader.latest and poller else "not watching for new versions")
    app.state.drained = False
    try:
        yield
    finally:
        # uvicorn has already answered the in-flight requests (they are awaiting batcher futures,
        # which keep being served until here); stop watching, drain the queue, release the threads.
        if poller is not None:
            poller.cancel()
            with suppress(asyncio.CancelledError):
                await poller
        await batcher.stop()
        graph_thread.shutdown()
        loader.shutdown()
        app.state.drained = _report_drain(metrics)
        log.info("stopped serving %s", batcher.served.version)


def _report_drain(metrics: ServeMetrics) -> bool:
    """Log whether the shutdown answered every request it had accepted; True if it did.

    uvicorn runs the lifespan shutdown after the connections closed, or after its graceful
    timeout cancelled the requests still running: those are counted as cut off, and a request
    whose cancellation has not run yet is still in flight here."""
    answered = int(metrics.value("rlstack_serve_requests_total", route="/v1/act", status="200"))
    in_flight = int(metrics.value("rlstack_serve_requests_in_flight"))
    cut_off = int(metrics.value("rlstack_serve_requests_cut_off_total"))
    if in_flight or cut_off:
        log.error("shutdown did not drain: %d request(s) cut off, %d still in flight (graceful timeout "
                  "exceeded, or forced); %d /v1/act requests answered before", cut_off, in_flight, answered)
        return False
    log.info("drained: every accepted request was answered (%d /v1/act answers in all); the batcher's "
             "queue is empty and it has stopped", answered)
    return True


def create_app(settings: ServeSettings) -> FastAPI:
    """The FastAPI app for `settings`; nothing is loaded until the lifespan hook runs."""
    app = FastAPI(title="rlstack policy server", version="1",
                  description="Runs the exported rlstack policy graph (MindIR) over HTTP with dynamic batching "
                              "and hot reload. Every route but /healthz needs `Authorization: Bearer <token>` "
                              "when the server was started with a token.",
                  lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = ServeMetrics.create()
    app.add_route("/v1/act", act, methods=["POST"], include_in_schema=False)
    app.include_router(router)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(BadInput, on_bad_input)
    # Added innermost first: metrics see every answer, the token is checked before the body is read.
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    if settings.token:
        app.add_middleware(TokenMiddleware, token=settings.token)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            path_item, act_components = act_openapi()  # /v1/act is a plain Starlette route
            schema["paths"] = {"/v1/act": path_item, **schema.get("paths", {})}
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(act_components)
            server: ServerState | None = getattr(app.state, "server", None)
            if server is not None:  # the interface never changes across reloads (check_compatible)
                obs, action = _policy_schemas(server.batcher.served.policy, settings.max_rows)
                components["ActRequest"]["properties"]["obs"] = obs
                components["ActResponse"]["properties"]["action"] = action
                if server.batcher.served.policy.obs_dtype == np.uint8:
                    _document_npy(path_item["post"], server.batcher.served.policy.obs_shape, settings.max_rows)
            if settings.token:
                schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                schema["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app

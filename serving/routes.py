"""HTTP routes and their request/response schemas (serving stage): /v1/act, /v1/policy, /v1/reload, /healthz, /metrics.

Observations are checked here, against the loaded policy's manifest, before anything reaches
the batcher: every client mistake becomes a 4xx whose message names the problem and the
expected shape, never a 5xx.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
)

from rlstack.serving.state import ServerState

router = APIRouter()


class BadInput(Exception):
    """A client mistake: answered with `status` and a message naming the problem and the expected input."""

    def __init__(self, status: int, error: str, expected: str | None = None):
        super().__init__(error)
        self.status = status
        self.error = error
        self.expected = expected


# ----- schemas -------------------------------------------------------------------------------

class ActRequest(BaseModel):
    """Observations to act on. The exact observation shape of the loaded policy is filled into
    this schema in /openapi.json (and is in GET /v1/policy as `observation_space.shape`)."""

    model_config = ConfigDict(extra="forbid")

    obs: list[Any] = Field(description="One observation (nested list of numbers of the policy's "
                                       "observation shape, e.g. [4] floats for CartPole) or a batch "
                                       "of them [B, *shape]. Finite numbers only.")
    deterministic: StrictBool = Field(False, description="true: the greedy / mean action (zero noise); "
                                                         "false: sample from the policy.")
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1,
                                   description="Fixes the noise of a sampled action: the same obs and seed "
                                               "give the same action, batched with others or not "
                                               "(equal to rlstack.load_policy(...).act(obs, seed=seed)).")


    @field_validator("seed", mode="before")
    @classmethod
    def _integral_float(cls, seed: Any) -> Any:
        # JSON Schema counts 7.0 as an integer (the schema says `integer`), so it is accepted as 7.
        return int(seed) if type(seed) is float and seed.is_integer() else seed


class ActResponse(BaseModel):
    """The policy's answer: a scalar/vector per observation when `obs` was one observation,
    a list with one entry per row when it was a batch."""

    action: int | list[float] | list[int] | list[list[float]] = Field(
        description="Discrete action space: int32 action index (list of them for a batch). "
                    "Box action space: float32 vector of the action shape, clipped to the space "
                    "(list of vectors for a batch).")
    logp: float | list[float] = Field(description="float32 log-probability of the (unclipped) action.")
    value: float | list[float] = Field(description="float32 state-value estimate.")
    policy_version: str = Field(description="The policy version that answered, e.g. v000012.", examples=["v000012"])


class ErrorResponse(BaseModel):
    error: str = Field(description="What is wrong with the request.")
    expected: str | None = Field(None, description="What the server expects instead.")


class HealthResponse(BaseModel):
    status: str = Field(examples=["ok"])
    policy_version: str


class ReloadResponse(BaseModel):
    result: str = Field(description="reloaded | unchanged | refused")
    policy_version: str = Field(description="The version served after this call.")
    detail: str


_ERRORS = {400: {"model": ErrorResponse, "description": "Body is not JSON"},
           401: {"model": ErrorResponse, "description": "Missing or wrong bearer token"},
           413: {"model": ErrorResponse, "description": "Body or batch too large"},
           415: {"model": ErrorResponse, "description": "Body is not sent as JSON (or as .npy frames)"},
           422: {"model": ErrorResponse, "description": "Wrong field, type, shape or a non-finite number"}}


FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest observation entry accepted (the schema's `maximum`; `-FLOAT32_MAX` its `minimum`)."""


# ----- observation checks --------------------------------------------------------------------

NPY = "application/x-npy"
"""The binary body of /v1/act: one `.npy` array (`numpy.save`) of frames in the policy's own dtype,
with `deterministic` and `seed` as query parameters."""


FLOAT32 = np.dtype(np.float32)


def expected_obs(obs_shape: tuple[int, ...], max_rows: int, dtype: np.dtype = FLOAT32) -> str:
    dims = ", ".join(map(str, obs_shape))
    values = "integers 0..255 (uint8 frames)" if dtype == np.uint8 else "finite numbers"
    text = (f'{{"obs": one observation of shape [{dims}] or a batch [B, {dims}] with 1 <= B <= {max_rows}, '
            f'{values}; "deterministic": bool (optional, default false); "seed": int >= 0 (optional)}}')
    if dtype == np.uint8:
        text += (f"; or the frames as one .npy array of dtype uint8 ('Content-Type: {NPY}', "
                 "?deterministic=true&seed=N as query parameters)")
    return text


def _holds_bool(raw: list[Any]) -> bool:
    # JSON true/false become 1/0 in np.asarray; a boolean observation entry is a client mistake.
    return any(v is True or v is False or (type(v) is list and _holds_bool(v)) for v in raw)


def _holds_only_numbers(raw: list[Any]) -> bool:
    return all(type(v) in (int, float) or (type(v) is list and _holds_only_numbers(v)) for v in raw)


def parse_obs(raw: list[Any], obs_shape: tuple[int, ...], max_rows: int,
              dtype: np.dtype = FLOAT32) -> tuple[np.ndarray, bool]:
    """JSON obs -> (batch [B, *obs_shape] of the policy's `dtype`: float32, or uint8 frames, whether
    it was one observation); BadInput otherwise."""
    expected = expected_obs(obs_shape, max_rows, dtype)
    try:
        arr = np.asarray(raw)
    except ValueError:  # numpy refuses ragged nesting
        arr = None
    if arr is not None and arr.dtype == object and _holds_only_numbers(raw):
        # An integer beyond int64 (JSON numbers have no size limit) makes an object array.
        try:
            arr = np.asarray(raw, dtype=np.float64)
        except OverflowError:
            raise BadInput(422, "obs holds an integer beyond float32 range; observations must be finite",
                           expected) from None
    if arr is None or arr.dtype == object:
        raise BadInput(422, "obs is not a rectangular array of numbers (rows of different lengths, "
                            "or values that are not numbers)", expected)
    # true/false become 1/0 (1.0/0.0 beside floats) in np.asarray; the walk over the Python list
    # that finds them is slow on large batches (docs/PERFORMANCE.md#serve), so it runs only when
    # the array holds a 0 or a 1.
    maybe_bool = arr.dtype.kind in "iu" or (arr.dtype.kind == "f" and bool(((arr == 0) | (arr == 1)).any()))
    if maybe_bool and _holds_bool(raw):
        raise BadInput(422, "obs holds true/false; it must hold numbers", expected)
    if arr.dtype.kind not in "iuf":
        kind = {"b": "booleans", "U": "strings", "S": "strings"}.get(arr.dtype.kind, f"values of dtype {arr.dtype}")
        raise BadInput(422, f"obs holds {kind}; it must hold numbers", expected)
    wide, single = _batch_of(arr, "obs", obs_shape, max_rows, expected)
    # Checked before the cast: a number just past float32's largest would round down to it, but the
    # schema (/openapi.json) says numbers within float32's range, and NaN compares False.
    finite = np.abs(wide) <= FLOAT32_MAX
    if not finite.all():
        where = tuple(int(i) for i in np.argwhere(~finite)[0])
        where = where[1:] if single else where
        raise BadInput(422, f"obs{list(where)} is NaN or infinite (or beyond float32 range); "
                            "observations must be finite", expected)
    if dtype == np.uint8:
        _check_frames(wide, single, expected)
    return wide.astype(dtype), single


def _batch_of(arr: np.ndarray, what: str, obs_shape: tuple[int, ...], max_rows: int,
              expected: str) -> tuple[np.ndarray, bool]:
    """(`arr` as a batch [B, *obs_shape], whether it was one observation); BadInput for another
    shape, an empty batch or more than `max_rows` rows."""
    single = arr.shape == obs_shape
    if not single and (arr.ndim != len(obs_shape) + 1 or arr.shape[1:] != obs_shape):
        raise BadInput(422, f"{what} has shape {list(arr.shape)}; the policy takes observations of shape "
                            f"{list(obs_shape)}", expected)
    wide = arr[None] if single else arr
    if len(wide) == 0:
        raise BadInput(422, f"{what} is an empty batch", expected)
    if len(wide) > max_rows:
        raise BadInput(413, f"{what} has {len(wide)} rows; at most {max_rows} per request", expected)
    return wide, single


def _check_frames(frames: np.ndarray, single: bool, expected: str) -> None:
    """Frames of a uint8 policy: every entry an integer 0..255."""
    bad = (frames < 0) | (frames > 255) | (frames != np.floor(frames))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise BadInput(422, f"obs{list(where[1:] if single else where)} is {frames[where]!r}; the policy takes "
                            "uint8 frames, integers 0..255", expected)


def parse_npy(body: bytes, obs_shape: tuple[int, ...], max_rows: int,
              dtype: np.dtype) -> tuple[np.ndarray, bool]:
    """A `.npy` body -> (batch [B, *obs_shape] of `dtype`, whether it was one observation); it
    must hold exactly the policy's dtype (no conversion guessed) and shape; BadInput otherwise."""
    expected = expected_obs(obs_shape, max_rows, dtype)
    if dtype != np.uint8:
        raise BadInput(415, f"a {NPY} body is for policies of uint8 frames; this policy takes {dtype} "
                            "observations as JSON", expected)
    try:
        arr = np.lib.format.read_array(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise BadInput(422, f"the body is not one .npy array (numpy.save): {err}", expected) from None
    if arr.dtype != dtype:
        raise BadInput(422, f"the .npy array holds {arr.dtype}; the policy takes {dtype} frames", expected)
    wide, single = _batch_of(arr, "the .npy array", obs_shape, max_rows, expected)
    return np.ascontiguousarray(wide), single


def _query_options(request: Request, expected: str) -> tuple[bool, int | None]:
    """`deterministic` and `seed` of a binary request, from its query string."""
    unknown = sorted(set(request.query_params) - {"deterministic", "seed"})
    if unknown:
        raise BadInput(422, f"unknown query parameter(s) {', '.join(unknown)}; valid: deterministic, seed", expected)
    deterministic = request.query_params.get("deterministic", "false").lower()
    if deterministic not in ("true", "false"):
        raise BadInput(422, f"deterministic is {deterministic!r}; it must be true or false", expected)
    seed = request.query_params.get("seed")
    if seed is not None and not (seed.isdigit() and int(seed) <= 2**63 - 1):
        raise BadInput(422, f"seed is {seed!r}; it must be an integer 0..2**63-1", expected)
    return deterministic == "true", None if seed is None else int(seed)


def _answer_json(action: np.ndarray, logp: np.ndarray, value: np.ndarray, version: str, single: bool) -> bytes:
    if single:
        payload = {"action": action[0].tolist(), "logp": float(logp[0]), "value": float(value[0])}
    else:
        payload = {"action": action.tolist(), "logp": logp.tolist(), "value": value.tolist()}
    payload["policy_version"] = version
    # json.dumps of plain lists is faster than validating the union schema per response
    # (docs/PERFORMANCE.md#serve).
    return json.dumps(payload, allow_nan=False).encode()


# ----- routes --------------------------------------------------------------------------------

def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


# /v1/act, the route every client hits, is a plain Starlette route (added by the app factory):
# FastAPI's parameter and dependency machinery is a large share of this route's per-request CPU
# (docs/PERFORMANCE.md#serve), and pydantic parses the body bytes in Rust
# (`model_validate_json`) just as well here. Its OpenAPI entry is written out in `act_openapi`
# instead of being derived from the signature.
async def act(request: Request) -> Response:
    server: ServerState = request.app.state.server
    policy = server.batcher.served.policy
    settings = server.settings
    content_type = request.headers.get("content-type")
    expected = expected_obs(policy.obs_shape, settings.max_rows, policy.obs_dtype)
    if content_type and content_type.split(";", 1)[0].strip().lower() == NPY:
        obs, single = parse_npy(await request.body(), policy.obs_shape, settings.max_rows, policy.obs_dtype)
        deterministic, seed = _query_options(request, expected)
    elif content_type and _is_json(content_type):
        try:
            body = ActRequest.model_validate_json(await request.body())
        except ValidationError as err:
            raise RequestValidationError(err.errors(include_url=False)) from None
        obs, single = parse_obs(body.obs, policy.obs_shape, settings.max_rows, policy.obs_dtype)
        deterministic, seed = body.deterministic, body.seed
    else:
        sent = f"sent as '{content_type}'" if content_type else "sent without a Content-Type"
        raise BadInput(415, f"body was {sent}, not as JSON", "header 'Content-Type: application/json' and "
                       "the JSON body " + expected)
    rng = np.random.default_rng(seed) if seed is not None else server.rng
    noise = policy.noise(len(obs), None if deterministic else rng)
    answer = await server.batcher.submit(obs, noise)
    bad = ~(np.isfinite(answer.logp) & np.isfinite(answer.value))
    if answer.action.dtype.kind == "f":
        bad |= ~np.isfinite(answer.action.reshape(len(obs), -1)).all(axis=1)
    if bad.any():
        raise BadInput(422, f"the policy's output is not finite for observation row {int(np.argmax(bad))} "
                            "(values far outside the training range overflow the network)",
                       expected)
    return Response(_answer_json(answer.action, answer.logp, answer.value, answer.policy_version, single),
                    media_type="application/json")


def act_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """The OpenAPI path item of POST /v1/act and the component schemas it refers to."""
    def ref(model: type[BaseModel]) -> dict[str, Any]:
        return {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}

    responses = {"200": {"description": "The action for each observation", "content": ref(ActResponse)}}
    responses.update({str(code): {"description": info["description"], "content": ref(ErrorResponse)}
                      for code, info in _ERRORS.items()})
    path_item = {"post": {"tags": ["policy"], "operationId": "act_v1_act_post",
                          "summary": "Act on one observation or a batch (dynamically batched with other requests)",
                          "requestBody": {"required": True, "content": ref(ActRequest)}, "responses": responses}}
    components = {m.__name__: m.model_json_schema(ref_template="#/components/schemas/{model}")
                  for m in (ActRequest, ActResponse, ErrorResponse)}
    return path_item, components


@router.get("/v1/policy", tags=["policy"], summary="The manifest of the policy being served",
            responses={401: _ERRORS[401]})
async def policy_manifest(request: Request) -> dict[str, Any]:
    server: ServerState = request.app.state.server
    return server.batcher.served.policy.manifest


@router.post("/v1/reload", response_model=ReloadResponse, tags=["admin"],
             summary="Load the version LATEST names now (also done by polling); 409 if it is refused",
             responses={401: _ERRORS[401], 409: {"model": ReloadResponse, "description": "New version refused"}})
async def reload(request: Request) -> Response:
    server: ServerState = request.app.state.server
    outcome = await server.reloader.reload(force=True)
    body = ReloadResponse(result=outcome.result, policy_version=server.batcher.served.version,
                          detail=outcome.detail)
    return Response(body.model_dump_json(), status_code=409 if outcome.result == "refused" else 200,
                    media_type="application/json")


@router.get("/healthz", response_model=HealthResponse, tags=["ops"], summary="Liveness and the loaded version",
            openapi_extra={"security": []})  # the one route the token does not guard
async def healthz(request: Request) -> HealthResponse:
    server: ServerState = request.app.state.server
    return HealthResponse(status="ok", policy_version=server.batcher.served.version)


@router.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=Response,
            responses={401: _ERRORS[401]})
async def metrics(request: Request) -> Response:
    server: ServerState = request.app.state.server
    return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)


ROUTES = ("/v1/act", "/v1/policy", "/v1/reload", "/healthz", "/metrics", "/openapi.json", "/docs")
"""Paths that get their own metrics label (anything else is counted as `other`)."""

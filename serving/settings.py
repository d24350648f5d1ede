"""Typed settings of the policy server (serving stage): what `python -m rlstack.serve` was asked to do."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

TOKEN_ENV = "RLSTACK_TOKEN"
"""Environment variable read for the bearer token when `--token` is not given."""


class ServeSettings(BaseModel):
    """Everything the app factory needs; built once by the CLI (or a test) and never mutated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: Path
    """A run directory or a `policy/` directory (LATEST is followed and watched for new
    versions), or one version directory (served as is, never reloaded)."""
    host: str = "127.0.0.1"
    """Interface to bind; loopback by default, anything else is an explicit choice."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port; 0 picks a free one (the chosen port is logged)."""
    max_batch: int = Field(64, ge=1, le=65536)
    """Most rows gathered into one graph call; 1 turns dynamic batching off."""
    max_wait_ms: float = Field(2.0, ge=0.0, le=1000.0)
    """Longest a request waits in the queue for others to join its batch."""
    max_rows: int = Field(1024, ge=1, le=1 << 20)
    """Most observations in one request."""
    max_body_bytes: int = Field(4 << 20, ge=1024)
    """Largest request body accepted; bigger ones get 413 before they are read."""
    token: str | None = Field(None, min_length=1)
    """Bearer token required on every route but /healthz (None: no guard)."""
    reload_poll_s: float = Field(0.5, ge=0.0)
    """How often LATEST is checked for a new version; 0 turns polling off (POST /v1/reload still works)."""
    device: str = "cpu"
    """MindSpore device the graph runs on (see rlstack.runtime)."""
    log_level: str = "info"
    """Python logging level for the server's own log and uvicorn's."""
    access_log: bool = False
    """One log line per request (off by default: at thousands of requests/s it costs real CPU)."""
    profile_dir: Path | None = None
    """MindSpore Profiler output directory (`--profile`: `<run>/profile`, beside `policy/`); None: no profiling."""
    profile_steps: int = Field(20, ge=1)
    """Served batches (graph calls) the profile records."""
    profile_skip: int = Field(5, ge=0)
    """Served batches before the profile starts (the first ones may still compile)."""
    keep_alive_s: float = Field(75.0, gt=0.0)
    """How long an idle keep-alive connection stays open. Longer than a pooled client's own idle
    expiry (httpx: 5 s), so the client drops a connection before the server closes it: with
    uvicorn's 5 s default both timers ran out together, and a request sent on the closing
    connection failed with a reset (seen under load with 32 pooled clients)."""
    graceful_timeout_s: float = Field(30.0, gt=0.0)
    """On SIGTERM, how long in-flight requests get to finish before connections are closed."""
    replicas: int = Field(1, ge=1, le=1024)
    """Copies of the app: 1 runs it in this process under uvicorn; N >= 2 on N Ray Serve replicas
    behind Serve's HTTP proxy (serving/replicas.py). Not read by the app itself."""
    ray_address: str | None = Field(None, min_length=1)
    """With replicas >= 2: the Ray cluster to join (None: start a local one bound to loopback)."""

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0

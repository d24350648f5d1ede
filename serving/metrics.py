"""Prometheus metrics of the policy server (serving stage): one registry per app, never the global one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from rlstack.acting import Policy

# Rows per graph call: powers of two up to the largest request we accept by default.
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# Seconds, from 100 µs (a queue hop) to 2.5 s (a graph compile at reload).
_TIME_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class ServeMetrics:
    """The `rlstack_serve_*` metrics (Prometheus names cannot hold the `serve/` namespace's slash)."""

    registry: CollectorRegistry
    requests: Counter
    errors: Counter
    request_seconds: Histogram
    batch_rows: Histogram
    batch_requests: Histogram
    queue_wait_seconds: Histogram
    graph_seconds: Histogram
    policy_version: Gauge
    policy_info: Gauge
    reloads: Counter
    in_flight: Gauge
    cut_off: Counter

    @classmethod
    def create(cls) -> ServeMetrics:
        registry = CollectorRegistry()
        ns = "rlstack_serve"
        metrics = cls(
            registry=registry,
            requests=Counter("requests", "HTTP requests answered, by route and status code",
                             ["route", "status"], namespace=ns, registry=registry),
            errors=Counter("request_errors", "HTTP requests answered with status >= 400, by route and status",
                           ["route", "status"], namespace=ns, registry=registry),
            request_seconds=Histogram("request_seconds", "Time from request start to response end, by route",
                                      ["route"], namespace=ns, registry=registry, buckets=_TIME_BUCKETS),
            batch_rows=Histogram("batch_rows", "Observations (rows) per graph call",
                                 namespace=ns, registry=registry, buckets=_ROW_BUCKETS),
            batch_requests=Histogram("batch_requests", "Requests answered by one graph call",
                                     namespace=ns, registry=registry, buckets=_ROW_BUCKETS),
            queue_wait_seconds=Histogram("queue_wait_seconds", "Time a request waited before its graph call started",
                                         namespace=ns, registry=registry, buckets=_TIME_BUCKETS),
            graph_seconds=Histogram("graph_seconds", "Wall time of one graph call on the graph thread",
                                    namespace=ns, registry=registry, buckets=_TIME_BUCKETS),
            policy_version=Gauge("policy_version", "Number of the policy version being served (v000012 -> 12)",
                                 namespace=ns, registry=registry),
            policy_info=Gauge("policy_info", "1 for the policy version being served",
                              ["version", "algorithm"], namespace=ns, registry=registry),
            reloads=Counter("reloads", "Attempts to load a new policy version, by result (ok | refused)",
                            ["result"], namespace=ns, registry=registry),
            in_flight=Gauge("requests_in_flight", "HTTP requests received and not yet answered",
                            namespace=ns, registry=registry),
            cut_off=Counter("requests_cut_off", "HTTP requests cancelled before their answer (the graceful "
                            "shutdown timed out, or a second Ctrl-C forced the exit)", namespace=ns, registry=registry),
        )
        for result in ("ok", "refused"):  # exported as 0 from the start, so alerts can use rate()
            metrics.reloads.labels(result)
        return metrics

    def value(self, name: str, **labels: str) -> float:
        """The current value of one sample, e.g. `value("rlstack_serve_requests_in_flight")` (0 when absent)."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def serving(self, policy: Policy, previous: Policy | None = None) -> None:
        """Record that `policy` is now the version being served (replacing `previous`)."""
        if previous is not None:
            self.policy_info.remove(previous.version, previous.manifest["algorithm"])
        self.policy_info.labels(policy.version, policy.manifest["algorithm"]).set(1)
        self.policy_version.set(int(policy.version[1:]))

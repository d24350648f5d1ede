"""Ray for the Ray actor backend (`serving/ray_actors.py`) and the served replicas
(`serving/replicas.py`): keeping a cluster on this machine on loopback, and telling early that a
cluster address does not answer.

Ray 2.60 turns `ray.init(_node_ip_address="127.0.0.1")` into this machine's routable address
(192.0.2.2 here), and its GCS and raylet then listen on every interface; it also rewrites a
127.0.0.1 cluster address to that address before it connects (measured). With the environment
variable `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER` at 0, read once when `ray` is imported
(`ray._private.ray_constants.ENABLE_RAY_CLUSTER`), the node's address is loopback, and so is every
port Ray's own processes listen on (measured). Despite its name the variable only means
"single-machine cluster" on Linux. One exception is Ray Serve's: each replica starts its
inter-deployment gRPC server on "[::]:0", hard-coded in serve/_private/replica.py (guarded by
Ray's token authentication, on by default in 2.60).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
INSTALL = 'pip install -e ".[ray]"'
CONNECT_TIMEOUT_S = 5.0


def is_loopback(host: str) -> bool:
    """`localhost`, 127.x, ::1, or an IPv4-mapped 127.x."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def prepare(address: str | None) -> str | None:
    """Before Ray is first imported: keep a cluster started here (`address` None) or joined on this
    machine's loopback on 127.0.0.1. Returns why that cannot be done (Ray already imported without
    it), else None."""
    host = (address or "").rpartition(":")[0]
    if address is None or is_loopback(host):
        if "ray" in sys.modules and os.environ.get(LOCAL_ONLY_ENV) != "0":
            return "Ray was imported before its loopback-only setting was made; start a fresh process"
        os.environ[LOCAL_ONLY_ENV] = "0"
    return None


def unreachable(address: str | None) -> str | None:
    """Why nothing answers at a `host:port` cluster address (a TCP connect), else None. Without
    this check Ray tries to reach an absent cluster for over a minute before it gives up
    (docs/PERFORMANCE.md#ray)."""
    if address is None or address == "auto" or "://" in address:
        return None  # a local instance; `auto` (Ray finds the cluster itself); a Ray Client URL
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return "expected host:port, auto, or a ray:// URL"
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as err:
        return f"{type(err).__name__}: {err}"

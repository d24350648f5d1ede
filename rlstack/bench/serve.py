"""`python -m rlstack.bench serve`: policy-server throughput and latency on loopback, batching on and off.

For each server mode (dynamic batching on: `--max-batch 64 --max-wait-ms 2`; off: `--max-batch 1`)
a real `python -m rlstack.serve` subprocess is started, and a load generator in this process
keeps 1, 16 and 64 single-observation requests in flight (closed loop: each client sends its
next request when the previous answer arrives) for a fixed time, then 256-observation requests.
The load generator is a minimal HTTP/1.1 keep-alive client on asyncio streams, because on a
2-core machine it shares the CPU with the server and must cost as little as possible; its CPU
time and the server's are reported so the reader can see who used the cores.
Prints one JSON document; never asserted by tests.

`--soak MINUTES` instead holds a steady load (`--soak-clients`, default 32) on one server for that
long while a new policy version is published into the directory it watches every few seconds,
and reports failed requests (the claim: 0), p50/p99 per time window, the reloads done and the
server's resident memory (VmRSS) at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

_RUNNING = re.compile(r"Uvicorn running on http://([\d.]+):(\d+)")


@dataclass
class Measurement:
    mode: str
    clients: int
    obs_per_request: int
    requests: int
    errors: int
    seconds: float
    requests_per_s: float
    actions_per_s: float
    p50_ms: float
    p99_ms: float
    mean_batch_rows: float
    graph_ms_per_call: float
    server_cpu_ms_per_request: float
    client_cpu_ms_per_request: float


class Server:
    def __init__(self, policy: Path, args: list[str], log_path: Path):
        self._log = open(log_path, "w")
        self.log_path = log_path
        self.proc = subprocess.Popen([sys.executable, "-m", "rlstack.serve", str(policy), "--port", "0",
                                      "--reload-poll-s", "0", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not (match := _RUNNING.search(log_path.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        self.host, self.port = match.group(1), int(match.group(2))

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _request(host: str, path: str, body: bytes, method: str = "POST") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    i = lower.index(b"content-length:")
    length = int(lower[i + 15:lower.index(b"\r\n", i)])
    return status, await reader.readexactly(length)


async def _scrape(host: str, port: int, labelled: tuple[str, ...] = ()) -> dict[str, float]:
    """Batch and graph sums from /metrics, and the samples of the `labelled` metrics keyed by their labels."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(_request(host, "/metrics", b"", "GET"))
    _, body = await _read_response(reader)
    writer.close()
    values = {}
    for line in body.decode().splitlines():
        for name in ("rlstack_serve_batch_rows_sum", "rlstack_serve_batch_rows_count",
                     "rlstack_serve_graph_seconds_sum"):
            if line.startswith(name + " "):
                values[name] = float(line.split()[1])
        for name in labelled:
            if line.startswith(name + "{"):
                values[line[len(name) + 1:line.index("}")]] = float(line.split()[-1])
    return values


async def _load(host: str, port: int, clients: int, obs_per_request: int, seconds: float,
                warmup_s: float) -> tuple[list[float], int, int, float]:
    """Closed-loop load: `clients` connections each with one request in flight. Returns the
    latencies after warm-up, the request and error counts after warm-up, and the measured seconds."""
    rng = np.random.default_rng(0)
    bodies = [_request(host, "/v1/act", json.dumps(
        {"obs": (rng.normal(size=4) if obs_per_request == 1 else rng.normal(size=(obs_per_request, 4))).tolist()}
    ).encode()) for _ in range(64)]
    latencies: list[float] = []
    counts = [0, 0]  # requests, errors (after warm-up)
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from, stop_at = start + warmup_s, start + warmup_s + seconds

    async def client(k: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        i = k
        while (t0 := loop.time()) < stop_at:
            writer.write(bodies[i % len(bodies)])
            status, _ = await _read_response(reader)
            if t0 >= measure_from:
                latencies.append(loop.time() - t0)
                counts[0] += 1
                counts[1] += status != 200
            i += 1
        writer.close()

    await asyncio.gather(*(client(k) for k in range(clients)))
    return latencies, counts[0], counts[1], loop.time() - measure_from


def measure(server: Server, mode: str, clients: int, obs_per_request: int, seconds: float,
            warmup_s: float) -> Measurement:
    before = asyncio.run(_scrape(server.host, server.port))
    cpu0, client0 = server.cpu_seconds(), time.process_time()
    latencies, n, errors, elapsed = asyncio.run(
        _load(server.host, server.port, clients, obs_per_request, seconds, warmup_s))
    cpu, client_cpu = server.cpu_seconds() - cpu0, time.process_time() - client0
    after = asyncio.run(_scrape(server.host, server.port))
    calls = after["rlstack_serve_batch_rows_count"] - before["rlstack_serve_batch_rows_count"]
    rows = after["rlstack_serve_batch_rows_sum"] - before["rlstack_serve_batch_rows_sum"]
    graph = after["rlstack_serve_graph_seconds_sum"] - before["rlstack_serve_graph_seconds_sum"]
    lat = np.asarray(latencies) * 1e3
    total = max(n, 1)
    return Measurement(
        mode=mode, clients=clients, obs_per_request=obs_per_request, requests=n, errors=errors,
        seconds=round(elapsed, 2), requests_per_s=round(n / elapsed, 1),
        actions_per_s=round(n * obs_per_request / elapsed, 1),
        p50_ms=round(float(np.percentile(lat, 50)), 2) if n else float("nan"),
        p99_ms=round(float(np.percentile(lat, 99)), 2) if n else float("nan"),
        mean_batch_rows=round(rows / max(calls, 1), 1), graph_ms_per_call=round(graph / max(calls, 1) * 1e3, 3),
        # CPU over warm-up + measurement, per request of the whole run (warm-up included: a bound).
        server_cpu_ms_per_request=round(cpu / total * 1e3 * elapsed / (elapsed + warmup_s), 3),
        client_cpu_ms_per_request=round(client_cpu / total * 1e3 * elapsed / (elapsed + warmup_s), 3))


# ----- soak: sustained load with hot reloads ---------------------------------------------------

@dataclass
class SoakWindow:
    until_s: float  # end of the window, seconds since the load started
    requests: int
    failed: int  # answered with a status other than 200, or the connection broke
    p50_ms: float
    p99_ms: float
    versions: int  # policy versions that answered in this window
    rss_mb: float  # the server's VmRSS at the end of the window


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` (VmRSS in /proc/PID/status), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


class Publisher:
    """Publishes copies of the trained versions as v000002, v000003, ... into a `policy/` dir the
    way the trainer does (directory renamed into place, then LATEST replaced), keeping the newest
    `keep`, so the server under load has a new version to hot-reload each time."""

    def __init__(self, sources: list[Path], policy_dir: Path, keep: int = 3):
        self.sources, self.policy_dir, self.keep = sources, policy_dir, keep
        self.published = 0
        self.publish()

    def publish(self) -> str:
        from rlstack.fsutil import atomic_write_text

        self.published += 1
        name = f"v{self.published:06d}"
        tmp = self.policy_dir / f".{name}.tmp"
        # Alternate between the trained versions, so every reload brings other weights.
        shutil.copytree(self.sources[(self.published - 1) % len(self.sources)], tmp)
        manifest = json.loads((tmp / "manifest.json").read_text())
        manifest["version"] = name
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        os.rename(tmp, self.policy_dir / name)
        atomic_write_text(self.policy_dir / "LATEST", name + "\n")
        for old in sorted(self.policy_dir.glob("v*"))[:-self.keep]:
            shutil.rmtree(old)
        return name


async def _soak_load(host: str, port: int, clients: int, seconds: float, window_s: float, reload_every_s: float,
                     publisher: Publisher, server_pid: int) -> list[SoakWindow]:
    """Closed-loop single-observation load for `seconds`, a new version every `reload_every_s`;
    one SoakWindow per `window_s`."""
    rng = np.random.default_rng(0)
    bodies = [_request(host, "/v1/act", json.dumps({"obs": rng.normal(size=4).tolist()}).encode()) for _ in range(64)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    stop_at = start + seconds
    done: list[tuple[float, float, bool, bytes]] = []  # (end time, latency, ok, version)

    async def client(k: int) -> None:
        i = k
        while loop.time() < stop_at:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                done.append((loop.time() - start, 0.0, False, b""))
                await asyncio.sleep(0.1)
                continue
            try:
                while (t0 := loop.time()) < stop_at:
                    writer.write(bodies[i % len(bodies)])
                    status, body = await _read_response(reader)
                    at = body.find(b'"policy_version": "')
                    done.append((loop.time() - start, loop.time() - t0, status == 200, body[at + 19:at + 26]))
                    i += 1
            except (OSError, asyncio.IncompleteReadError, ValueError):  # a broken connection fails its request
                done.append((loop.time() - start, loop.time() - t0, False, b""))
            finally:
                writer.close()

    async def publish_and_sample() -> list[float]:
        rss, next_window = [], start + window_s
        next_publish = start + reload_every_s
        while (now := loop.time()) < stop_at:
            await asyncio.sleep(max(0.0, min(next_window, next_publish, stop_at) - now))
            if loop.time() >= next_publish and loop.time() < stop_at:
                await loop.run_in_executor(None, publisher.publish)
                next_publish += reload_every_s
            if loop.time() >= next_window or loop.time() >= stop_at:
                rss.append(rss_mb(server_pid))
                next_window += window_s
        return rss

    *_, rss = await asyncio.gather(*(client(k) for k in range(clients)), publish_and_sample())
    windows = []
    for w, rss_w in enumerate(rss):
        lo, hi = w * window_s, min((w + 1) * window_s, seconds)
        inside = [d for d in done if lo <= d[0] < hi or (w == len(rss) - 1 and d[0] >= hi)]
        lat = np.asarray([d[1] for d in inside if d[2]]) * 1e3
        windows.append(SoakWindow(
            until_s=round(hi, 1), requests=len(inside), failed=sum(not d[2] for d in inside),
            p50_ms=round(float(np.percentile(lat, 50)), 2) if len(lat) else float("nan"),
            p99_ms=round(float(np.percentile(lat, 99)), 2) if len(lat) else float("nan"),
            versions=len({d[3] for d in inside if d[2]}), rss_mb=round(rss_w, 1)))
    return windows


def soak(policy: Path, minutes: float, clients: int, window_s: float, reload_every_s: float, tmp: Path) -> dict:
    """Run the soak (see the module docstring) and return its report."""
    from rlstack.artifact import list_versions  # the trained versions to republish

    sources = list_versions(policy / "policy" if (policy / "policy").is_dir() else policy) or [policy]
    policy_dir = tmp / "soak" / "policy"
    policy_dir.mkdir(parents=True)
    publisher = Publisher(sources, policy_dir)
    server = Server(policy_dir, ["--max-batch", "64", "--max-wait-ms", "2", "--reload-poll-s", "0.5"],
                    tmp / "soak.log")
    try:
        rss_start = rss_mb(server.proc.pid)
        windows = asyncio.run(_soak_load(server.host, server.port, clients, minutes * 60, window_s,
                                         reload_every_s, publisher, server.proc.pid))
        after = asyncio.run(_scrape(server.host, server.port, ("rlstack_serve_reloads_total",)))
    finally:
        server.stop()
    rss_end = windows[-1].rss_mb if windows else rss_start
    log = server.log_path.read_text()
    return {
        "minutes": minutes, "clients": clients, "reload_every_s": reload_every_s, "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg()[0],
        "requests": sum(w.requests for w in windows), "failed": sum(w.failed for w in windows),
        "versions_published": publisher.published, "reloads_ok": int(after.get('result="ok"', 0)),
        "reloads_refused": int(after.get('result="refused"', 0)),
        "rss_start_mb": round(rss_start, 1), "rss_end_mb": rss_end, "rss_growth_mb": round(rss_end - rss_start, 1),
        # The first window's growth is warm-up (buffers, allocator pools); what follows is the trend.
        "rss_growth_after_first_window_mb": round(rss_end - windows[0].rss_mb, 1) if windows else 0.0,
        "server_exit": server.proc.returncode, "server_drained": "drained: every accepted request" in log,
        "windows": [asdict(w) for w in windows],
    }


def print_soak(report: dict) -> None:
    print(f"soak: {report['minutes']} min, {report['clients']} clients, a new version every "
          f"{report['reload_every_s']} s, {report['cpus']} CPUs (load average at end {report['load_average_at_end']:.2f})")
    print(f"{'until_s':>8} {'requests':>9} {'failed':>7} {'p50_ms':>8} {'p99_ms':>8} {'versions':>9} {'rss_mb':>8}")
    for w in report["windows"]:
        print(f"{w['until_s']:>8} {w['requests']:>9} {w['failed']:>7} {w['p50_ms']:>8} {w['p99_ms']:>8} "
              f"{w['versions']:>9} {w['rss_mb']:>8}")
    print(f"requests {report['requests']}, failed {report['failed']}; versions published {report['versions_published']}, "
          f"reloads ok {report['reloads_ok']}, refused {report['reloads_refused']}; RSS {report['rss_start_mb']} -> "
          f"{report['rss_end_mb']} MiB ({report['rss_growth_mb']:+} MiB, "
          f"{report['rss_growth_after_first_window_mb']:+} MiB after the first window); server exit {report['server_exit']}, "
          f"drained: {report['server_drained']}")


def _train_policy(out: Path) -> Path:
    print(f"training a small CartPole policy into {out} (use --policy to skip)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "rlstack.train", "--out", str(out), "train.total_steps=512",
                    "train.progress=off", "env.eval_episodes=1"], check=True, stdout=subprocess.DEVNULL)
    return out


MODES = {"batching_on": ["--max-batch", "64", "--max-wait-ms", "2"],
         "batching_off": ["--max-batch", "1"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, default=None,
                        help="run/policy/version directory (default: train a small CartPole policy first)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per point (default 5)")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured seconds before each point")
    parser.add_argument("--clients", default="1,16,64", help="concurrent clients, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {', '.join(MODES)}")
    parser.add_argument("--batch-clients", type=int, default=4,
                        help="clients sending 256-observation requests (default 4)")
    parser.add_argument("--soak", type=float, default=None, metavar="MINUTES",
                        help="instead: sustained load for MINUTES with a hot reload every --reload-every-s")
    parser.add_argument("--soak-clients", type=int, default=32, help="concurrent clients in --soak (default 32)")
    parser.add_argument("--window-s", type=float, default=30.0, help="--soak reports p50/p99 per window (default 30)")
    parser.add_argument("--reload-every-s", type=float, default=5.0,
                        help="--soak publishes a new version this often (default 5)")
    parser.add_argument("--json", type=Path, default=None, help="--soak also writes its report here")
    args = parser.parse_args(argv)

    if args.soak is not None:
        with tempfile.TemporaryDirectory(prefix="rlstack_bench_soak_") as tmp:
            policy = args.policy or _train_policy(Path(tmp) / "run")
            report = soak(policy, args.soak, args.soak_clients, args.window_s, args.reload_every_s, Path(tmp))
        print_soak(report)
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=2))
        return 0 if report["failed"] == 0 else 1

    with tempfile.TemporaryDirectory(prefix="rlstack_bench_serve_") as tmp:
        policy = args.policy or _train_policy(Path(tmp) / "run")
        results: list[Measurement] = []
        for mode in args.modes.split(","):
            server = Server(policy, MODES[mode], Path(tmp) / f"{mode}.log")
            try:
                for clients in (int(c) for c in args.clients.split(",")):
                    results.append(measure(server, mode, clients, 1, args.seconds, args.warmup_s))
                    print(json.dumps(asdict(results[-1])), file=sys.stderr, flush=True)
                results.append(measure(server, mode, args.batch_clients, 256, args.seconds, args.warmup_s))
                print(json.dumps(asdict(results[-1])), file=sys.stderr, flush=True)
            finally:
                server.stop()
    by = {(r.mode, r.clients, r.obs_per_request): r for r in results}
    on, off = by.get(("batching_on", 64, 1)), by.get(("batching_off", 64, 1))
    summary = {
        "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()[0],
        # uvicorn picks these when installed (`uvicorn[standard]`), else the pure-Python h11 / asyncio.
        "http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "targets": {"requests_per_s_at_64_clients": 2000, "p99_ms_at_64_clients": 50, "batching_gain": 3.0},
        "batching_gain_at_64_clients": round(on.requests_per_s / off.requests_per_s, 2) if on and off else None,
        "results": [asdict(r) for r in results],
    }
    print(json.dumps(summary, indent=2))
    return 0

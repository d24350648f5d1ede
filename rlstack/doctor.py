"""`python -m rlstack.doctor`: the environment check before any training
(docs/DESIGN.md#what-the-seed-document-asks-for).

Reports versions (Python, MindSpore and the backends its install carries, numpy, gymnasium), which
devices are usable (CPU always; GPU and Ascend probed), whether graph-kernel fusion compiles and
computes correctly on each usable backend, Ascend's `npu-smi` and CANN version file where present,
and the thread settings. Every MindSpore probe runs in a child process with a tiny graph, so a
probe that fails, hangs or crashes becomes a row saying why, never a crash of the doctor. With
`--device D` (or `--config FILE`) the exit status is 1, and the reason is printed, when that
device (or the fusion setting the config asks for) cannot be used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

DEVICES = ("cpu", "gpu", "ascend")
_TARGETS = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
PROBE_MARK = "RLSTACK_PROBE "
PROBE_TIMEOUT = 180.0
"""Seconds a probe may take: a CPU fusion probe compiles kernels with AKG
(docs/PERFORMANCE.md#threads-and-fusion)."""
CANN_VERSION_FILES = (
    "ascend-toolkit/latest/ascend_toolkit_install.info",
    "ascend-toolkit/latest/version.cfg",
    "cann/latest/ascend_toolkit_install.info",
    "latest/ascend_toolkit_install.info",
)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
              "MS_WORKER_NUM", "GLOG_v")


@dataclass
class DeviceRow:
    device: str
    usable: bool
    reason: str
    """Why not (or what was checked when usable)."""


@dataclass
class FusionRow:
    device: str
    probe: str
    """`works` (compiled, fused kernels seen or none reported, output correct), `fails` or `skipped`."""
    detail: str
    rlstack: str
    """What rlstack does with `fusion: auto` / `on` on this device (rlstack.runtime.resolve_fusion)."""
    usable: bool
    """Whether rlstack can run this device with fusion on."""
    fused_kernels: int | None = None
    seconds: float | None = None


@dataclass
class Report:
    software: dict[str, str]
    backends_in_install: list[str]
    devices: list[DeviceRow]
    fusion: list[FusionRow]
    ascend: dict[str, str]
    threads: dict[str, str]
    verdict: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----- probes (run in a child process) -----------------------------------------------------------

def _tiny_graph_check(target: str, fusion: bool) -> dict[str, Any]:
    """Compile and run a tiny graph on `target` (the cwd is a scratch directory); compare to numpy."""
    import mindspore as ms
    import numpy as np
    from mindspore import Parameter, Tensor, nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(target)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    x = rng.standard_normal((3, 4)).astype(np.float32)

    class Tiny(nn.Cell):
        # matmul + bias + elementwise chain + reduction: the pattern graph-kernel fusion merges.
        def __init__(self):
            super().__init__()
            self.w = Parameter(Tensor(w), name="w")
            self.b = Parameter(Tensor(b), name="b")

        def construct(self, x):
            h = ops.tanh(ops.matmul(x, self.w) + self.b) * 2.0 + 1.0
            return ops.exp(h - h.max(axis=-1, keepdims=True)).sum(-1)

    unfused = Tiny()(Tensor(x)).asnumpy()
    start = time.perf_counter()
    if fusion:
        # Takes effect for graphs compiled from now on: a second instance compiles with fusion.
        ms.set_context(enable_graph_kernel=True)
        out = Tiny()(Tensor(x)).asnumpy()
    else:
        out = unfused
    seconds = time.perf_counter() - start
    h = np.tanh(x @ w + b) * 2.0 + 1.0
    expected = np.exp(h - h.max(-1, keepdims=True)).sum(-1)
    err = float(np.max(np.abs(out - expected)))
    fused = sum(1 for p in Path.cwd().rglob("Fused_*") if p.suffix in (".so", ".o", ".json")) if fusion else 0
    return {"ok": err < 1e-4, "max_abs_err": err, "seconds": seconds, "fused_kernel_files": fused,
            "max_abs_diff_vs_unfused": float(np.max(np.abs(out - unfused))),
            "error": "" if err < 1e-4 else f"output differs from numpy by {err:.3g}"}


def _availability() -> dict[str, Any]:
    """Which backends this MindSpore install reports, each with the log lines that say why not."""
    import mindspore as ms

    result: dict[str, Any] = {"mindspore": ms.__version__}
    for device, target in _TARGETS.items():
        with tempfile.TemporaryFile(mode="w+") as log:
            # MindSpore's loader writes its reasons to fd 2; capture them per backend.
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(log.fileno(), 2)
            try:
                ok = bool(ms.hal.is_available(target))
                error = ""
            except Exception as err:  # a failing probe is a reason, not a crash
                ok, error = False, f"{type(err).__name__}: {err}"
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
            log.seek(0)
            text = log.read()
        result[device] = {"available": ok, "log": _reasons(text) or error}
    with contextlib.suppress(Exception):
        result["runtime_num_threads"] = str(ms.get_context("runtime_num_threads"))
        result["inter_op_parallel_num"] = str(ms.get_context("inter_op_parallel_num"))
    return result


def _reasons(text: str) -> str:
    lines = []
    for line in text.splitlines():
        line = re.sub(r"^\[(WARNING|ERROR|INFO)\] ME\([^)]*\):\S+ \[[^\]]*\] ", "", line).strip()
        if line and "deprecated" not in line:
            lines.append(line)
    return " ".join(lines)


def _probe_main(what: str) -> int:
    """Child-process entry: `availability`, `run:<device>` or `fusion:<device>`; prints one JSON line."""
    try:
        if what == "availability":
            result = _availability()
        else:
            kind, _, device = what.partition(":")
            if kind not in ("run", "fusion") or device not in _TARGETS:
                raise ValueError(f"unknown probe '{what}'")
            result = _tiny_graph_check(_TARGETS[device], fusion=kind == "fusion")
    except Exception as err:  # reported to the parent as the probe's reason
        first_line = next(iter(str(err).strip().splitlines()), "")
        result = {"ok": False, "error": f"{type(err).__name__}: {first_line}"}
    print(PROBE_MARK + json.dumps(result), flush=True)
    return 0


def run_probe(what: str, timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
    """Run a probe in a child process in a scratch directory (AKG writes kernels into the cwd)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="rlstack-doctor-") as scratch:
        try:
            proc = subprocess.run([sys.executable, "-m", "rlstack.doctor", "--probe", what], cwd=scratch, env=env,
                                  capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"probe timed out after {timeout:g} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PROBE_MARK):
            return json.loads(line[len(PROBE_MARK):])
    tail = _reasons(proc.stderr)[-400:] or "no output"
    return {"ok": False, "error": f"probe process exited with status {proc.returncode} ({tail})"}


# ----- what the parent collects ------------------------------------------------------------------

def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _mindspore_install() -> tuple[str, list[str]]:
    """(commit/build string, backends whose plugin libraries the install carries) without importing it."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("mindspore")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return "not installed", []
    root = Path(spec.origin).parent
    build = ""
    commit = root / ".commit_id"
    if commit.is_file():
        match = re.search(r"\[sha1\]:(\w+)", commit.read_text())
        build = f"commit {match.group(1)}" if match else commit.read_text().strip()
    plugins = root / "lib" / "plugin"
    backends = ["cpu"]
    if plugins.is_dir():
        names = [p.name for p in plugins.iterdir()]
        cuda = sorted({m.group(1) for n in names if (m := re.match(r"gpu(\d+\.\d+)$", n))})
        if any(n.startswith("libmindspore_gpu") or n == "gpu" for n in names):
            backends.append("gpu" + (f" (CUDA {', '.join(cuda)})" if cuda else ""))
        if any(n.startswith("libmindspore_ascend") or n == "ascend" for n in names):
            backends.append("ascend")
    return build, backends


def collect_devices(availability: dict[str, Any]) -> list[DeviceRow]:
    rows = []
    for device in DEVICES:
        info = availability.get(device)
        if device == "cpu":
            rows.append(DeviceRow("cpu", True, "always available (MindSpore CPU backend)"))
            continue
        if not isinstance(info, dict):
            rows.append(DeviceRow(device, False, availability.get("error", "availability probe failed")))
            continue
        if not info["available"]:
            rows.append(DeviceRow(device, False, f"{_device_reason(device, info['log'])} [{_accelerator_hint(device)}]"))
            continue
        run = run_probe(f"run:{device}")
        rows.append(DeviceRow(device, bool(run.get("ok")), "tiny graph compiled and ran" if run.get("ok")
                              else f"backend loads but a tiny graph fails: {run.get('error')}"))
    return rows


def _device_reason(device: str, log: str) -> str:
    """MindSpore's reason for one backend: its "not available" line plus the plugin-load errors that
    concern it (the loader reports every plugin's failure together)."""
    words = {"gpu": ("gpu", "cuda", "cudnn", "nvidia"), "ascend": ("ascend", "ge_runner", "hccl", "cann")}[device]
    parts = re.split(r"(?=Load dynamic library:)", log)
    head = re.sub(r"Here's error when loading plugin.*", "", parts[0]).strip()
    own = [p.strip() for p in parts[1:] if any(w in p.lower() for w in words)]
    if own:
        return f"{head} {' '.join(own)}".strip()
    return f"{head or 'MindSpore reports the backend as unavailable.'} (no {device} plugin could be loaded)"


def _accelerator_hint(device: str) -> str:
    if device == "gpu":
        return "nvidia-smi " + ("found" if shutil.which("nvidia-smi") else "not found on PATH")
    home = _ascend_home()
    return f"Ascend install {'at ' + str(home) if home else 'not found (/usr/local/Ascend, ASCEND_HOME_PATH)'}"


def collect_fusion(devices: list[DeviceRow], probe: bool) -> list[FusionRow]:
    from rlstack.runtime import DeviceError, resolve_fusion

    rows = []
    for row in devices:
        if not row.usable:
            continue
        try:
            policy_on = resolve_fusion(row.device, "on")
            policy = f"fusion: auto -> {'on' if resolve_fusion(row.device, 'auto') else 'off'}; on -> allowed"
        except DeviceError as err:
            policy_on, policy = False, f"fusion: auto -> off; on -> refused ({err})"
        if not probe:
            rows.append(FusionRow(row.device, "skipped", "--no-fusion-probe", policy, False))
            continue
        result = run_probe(f"fusion:{row.device}")
        ok = bool(result.get("ok"))
        fused = result.get("fused_kernel_files")
        if ok:
            detail = (f"tiny graph compiled with enable_graph_kernel=True and matched numpy "
                      f"(max |err| {result['max_abs_err']:.1e}); fused kernel files written: {fused}; "
                      f"output differs from the unfused graph by {result['max_abs_diff_vs_unfused']:.1e} "
                      "(train and serve with the same fusion setting)")
        else:
            detail = f"tiny graph with enable_graph_kernel=True failed: {result.get('error')}"
        rows.append(FusionRow(row.device, "works" if ok else "fails", detail, policy, ok and policy_on,
                              fused, result.get("seconds")))
    return rows


def _ascend_home() -> Path | None:
    for candidate in (os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"), "/usr/local/Ascend"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def collect_ascend() -> dict[str, str]:
    info: dict[str, str] = {}
    npu_smi = shutil.which("npu-smi")
    if npu_smi is None:
        info["npu-smi"] = "not found on PATH (no Ascend driver installed)"
    else:
        try:
            proc = subprocess.run([npu_smi, "info"], capture_output=True, text=True, timeout=20,
                                  stdin=subprocess.DEVNULL)
            text = (proc.stdout or proc.stderr).strip().splitlines()
            info["npu-smi"] = f"{npu_smi} (exit {proc.returncode})"
            info["npu-smi info"] = "\n".join(text[:20]) or "(no output)"
        except (OSError, subprocess.TimeoutExpired) as err:
            info["npu-smi"] = f"{npu_smi} failed: {err}"
    found = []
    roots = [p for p in (os.environ.get("ASCEND_TOOLKIT_HOME"), os.environ.get("ASCEND_HOME_PATH"),
                         "/usr/local/Ascend") if p]
    looked = []
    for root in roots:
        for rel in CANN_VERSION_FILES if root == "/usr/local/Ascend" else (
                "ascend_toolkit_install.info", "version.cfg", *CANN_VERSION_FILES):
            path = Path(root) / rel
            looked.append(str(path))
            if path.is_file():
                with contextlib.suppress(OSError):
                    version = re.search(r"^\s*(?:version|Version)\s*=\s*(.+)$", path.read_text(), re.M)
                    found.append(f"{version.group(1).strip() if version else '(no version= line)'} ({path})")
    info["CANN"] = "; ".join(dict.fromkeys(found)) if found else f"not found (looked in {', '.join(looked[:4])})"
    return info


def collect_threads(availability: dict[str, Any]) -> dict[str, str]:
    threads = {"os.cpu_count": str(os.cpu_count())}
    with contextlib.suppress(AttributeError):
        threads["usable cores (affinity)"] = str(len(os.sched_getaffinity(0)))
    for key in THREAD_ENV:
        threads[key] = os.environ.get(key, "unset")
    for key in ("runtime_num_threads", "inter_op_parallel_num"):
        if key in availability:
            threads[f"mindspore {key}"] = availability[key]
    try:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            threads[f"{pool.get('internal_api')} threads"] = str(pool.get("num_threads"))
    except ImportError:
        threads["BLAS threads"] = "unknown (threadpoolctl not installed)"
    return threads


def collect(fusion_probe: bool = True) -> Report:
    build, backends = _mindspore_install()
    software = {
        "python": f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})",
        "platform": platform.platform(),
        "mindspore": f"{_version('mindspore')}" + (f" ({build})" if build else ""),
        "numpy": _version("numpy"),
        "gymnasium": _version("gymnasium"),
        "rlstack": _version("rlstack"),
    }
    availability = run_probe("availability")
    if "cpu" not in availability:
        availability = {"error": f"availability probe failed: {availability.get('error')}"}
    devices = collect_devices(availability)
    return Report(software, backends, devices, collect_fusion(devices, fusion_probe), collect_ascend(),
                  collect_threads(availability))


def verdict(report: Report, device: str, fusion: str = "auto") -> dict[str, Any]:
    """Can rlstack run `device` with `fusion` here? `{"device", "fusion", "usable", "reason"}`."""
    from rlstack.runtime import DeviceError, resolve_fusion

    row = next((r for r in report.devices if r.device == device), None)
    if row is None:
        return {"device": device, "fusion": fusion, "usable": False,
                "reason": f"device '{device}' is unknown; valid: {', '.join(DEVICES)}"}
    if not row.usable:
        return {"device": device, "fusion": fusion, "usable": False,
                "reason": f"device '{device}' is not usable: {row.reason}"}
    try:
        wants_fusion = resolve_fusion(device, fusion)
    except DeviceError as err:
        return {"device": device, "fusion": fusion, "usable": False, "reason": str(err)}
    if wants_fusion:
        frow = next((f for f in report.fusion if f.device == device), None)
        if frow is not None and frow.probe == "fails":
            return {"device": device, "fusion": fusion, "usable": False,
                    "reason": f"graph-kernel fusion does not work on '{device}': {frow.detail} (set fusion: off)"}
    return {"device": device, "fusion": fusion, "usable": True, "reason": row.reason}


def format_report(report: Report) -> str:
    out = ["rlstack doctor", "", "software"]
    out += [f"  {k:<12} {v}" for k, v in report.software.items()]
    out.append(f"  {'backends':<12} {', '.join(report.backends_in_install)} (plugins in this MindSpore install)")
    out += ["", "devices"]
    out += [f"  {r.device:<7} {'usable' if r.usable else 'NOT usable':<11} {r.reason}" for r in report.devices]
    out += ["", "graph-kernel fusion (probed in a child process with a tiny graph)"]
    for f in report.fusion:
        seconds = f" in {f.seconds:.1f} s" if f.seconds is not None else ""
        out.append(f"  {f.device:<7} probe {f.probe}{seconds}: {f.detail}")
        out.append(f"  {'':<7} rlstack: {f.rlstack} -> {'usable' if f.usable else 'unavailable'} with rlstack")
    out += ["", "ascend"]
    for k, v in report.ascend.items():
        out += [f"  {k:<12} {line}" if i == 0 else f"  {'':<12} {line}" for i, line in enumerate(v.splitlines())]
    out += ["", "threads"]
    out += [f"  {k:<32} {v}" for k, v in report.threads.items()]
    if report.verdict:
        v = report.verdict
        out += ["", f"verdict: device '{v['device']}' (fusion: {v['fusion']}) is "
                    f"{'usable' if v['usable'] else 'NOT usable'}: {v['reason']}"]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlstack.doctor",
                                     description="Check this machine for rlstack: versions, devices, fusion, "
                                                 "Ascend tools, threads.")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--device", choices=DEVICES, help="exit 1 (with the reason) if this device is unusable")
    target.add_argument("--config", metavar="FILE",
                        help="exit 1 (with the reason) if the config's device/fusion cannot be used")
    parser.add_argument("--no-fusion-probe", action="store_true",
                        help="skip the fusion probe (it compiles kernels and takes ~15 s on CPU)")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.probe:
        return _probe_main(args.probe)
    device, fusion = args.device, "auto"
    if args.config:
        from rlstack.config import ConfigError, load_config

        try:
            cfg = load_config(args.config)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        device, fusion = cfg.device, cfg.fusion
    report = collect(fusion_probe=not args.no_fusion_probe)
    if device is not None:
        report.verdict = verdict(report, device, fusion)
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_report(report), flush=True)
    if report.verdict and not report.verdict["usable"]:
        print(f"error: {report.verdict['reason']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

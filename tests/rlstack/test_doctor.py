"""`python -m rlstack.doctor`: runs on this CPU-only machine, probes without crashing, exits 1 with a
reason when the asked device or fusion setting cannot be used."""

import json
import subprocess
import sys


def _doctor(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlstack.doctor", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_doctor_on_cpu_reports_every_section_and_fusion_unavailable(tmp_path):
    proc = _doctor("--json", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for key in ("python", "mindspore", "numpy", "gymnasium"):
        assert report["software"][key] and report["software"][key] != "not installed", key
    assert "cpu" in report["backends_in_install"]
    devices = {row["device"]: row for row in report["devices"]}
    assert devices["cpu"]["usable"] is True
    # No accelerator here: each probe is a row with MindSpore's reason, not a crash.
    for device in ("gpu", "ascend"):
        assert devices[device]["usable"] is False
        assert "not available" in devices[device]["reason"], devices[device]["reason"]
    # Fusion is probed on the usable backend (CPU) in a child process; rlstack does not use it on CPU.
    (cpu_fusion,) = [row for row in report["fusion"] if row["device"] == "cpu"]
    assert cpu_fusion["probe"] in ("works", "fails") and cpu_fusion["detail"]
    assert cpu_fusion["usable"] is False and "on -> refused" in cpu_fusion["rlstack"]
    assert "npu-smi" in report["ascend"] and "CANN" in report["ascend"]
    assert int(report["threads"]["os.cpu_count"]) >= 1
    assert report["verdict"] == {"device": "cpu", "fusion": "auto", "usable": True,
                                 "reason": devices["cpu"]["reason"]}
    # The probes run in a scratch directory: no compiler output is left in the caller's cwd.
    assert not list(tmp_path.iterdir())


def test_doctor_table_and_nonzero_exit_for_missing_device(tmp_path):
    proc = _doctor("--device", "ascend", "--no-fusion-probe", cwd=tmp_path)
    assert proc.returncode == 1
    assert "device 'ascend' is not usable" in proc.stderr
    for heading in ("software", "devices", "graph-kernel fusion", "ascend", "threads", "verdict"):
        assert heading in proc.stdout, heading


def test_doctor_checks_the_fusion_setting_of_a_config(tmp_path):
    config = tmp_path / "fusion_on.yaml"
    config.write_text("algo: ppo\ndevice: cpu\nfusion: \"on\"\n")
    proc = _doctor("--config", str(config), "--no-fusion-probe", cwd=tmp_path)
    assert proc.returncode == 1
    assert "graph-kernel fusion needs the Ascend or GPU backend" in proc.stderr

    missing = _doctor("--config", str(tmp_path / "nope.yaml"), "--no-fusion-probe", cwd=tmp_path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr

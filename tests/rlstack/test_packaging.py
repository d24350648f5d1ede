"""Packaging: the sibling folders install as rlstack.algorithms/envs/serving, editable and as a wheel."""

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import rlstack, rlstack.algorithms.ppo, rlstack.envs, rlstack.serving; "
         "print(rlstack.__file__); print(rlstack.envs.__file__)")


def test_editable_install_imports_from_the_checkout(tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, check=True)
    rlstack_file, envs_file = proc.stdout.split()
    assert Path(rlstack_file) == ROOT / "rlstack" / "__init__.py"
    assert Path(envs_file) == ROOT / "envs" / "__init__.py"


def _wheel(tmp_path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), "-q"], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("rlstack-*.whl")
    return wheel


def test_wheel_has_no_top_level_envs_or_serving_and_imports(tmp_path):
    wheel = _wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"rlstack"}, top
    for module in ("rlstack/algorithms/ppo.py", "rlstack/envs/make.py", "rlstack/serving/__init__.py",
                   "rlstack/network.py", "rlstack/bench/__main__.py", "rlstack/bench/seeds.py",
                   "rlstack/configs/ppo_cartpole.yaml"):
        assert module in names, module
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel), "-q"],
                   check=True, capture_output=True, timeout=300)
    # Only the wheel's copy of rlstack may be importable: drop the editable install's finder.
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONNOUSERSITE": "1"}
    code = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; " + PROBE
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rlstack_file, envs_file = proc.stdout.split()
    assert Path(rlstack_file).is_relative_to(target) and Path(envs_file).is_relative_to(target)


def test_wheel_in_a_fresh_venv_trains_a_shipped_config_by_name(tmp_path):
    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    # A fresh virtual environment that reuses the MindSpore and other dependencies installed for
    # this interpreter, with the wheel installed into it. Not `--system-site-packages`: when the
    # suite itself runs in a venv, those are the base interpreter's packages, not the venv's. A .pth
    # line adds this interpreter's site directories after the venv's own (their .pth files, the
    # editable install's finder among them, are not run).
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    venv_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (Path(venv_site) / "rlstack_test_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    subprocess.run([python, "-m", "pip", "install", "--no-deps", str(wheel), "-q"], check=True,
                   capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    where = subprocess.run([python, "-c", "import rlstack.configs, rlstack.bench; print(rlstack.configs.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr  # the wheel's copy
    helped = subprocess.run([venv / "bin" / "rlstack-train", "--help"], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=120)
    assert helped.returncode == 0 and "--config" in helped.stdout, helped.stderr[-2000:]
    bench = subprocess.run([python, "-m", "rlstack.bench", "--help"], cwd=tmp_path, capture_output=True,
                           text=True, env=env, timeout=120)
    assert bench.returncode == 0 and "seeds" in bench.stdout and "graphs" in bench.stdout, bench.stderr[-2000:]
    run = tmp_path / "run"
    trained = subprocess.run([python, "-m", "rlstack.train", "--config", "ppo_cartpole", "--out", str(run),
                              "train.total_steps=2000", "train.progress=log", "env.eval_episodes=2"],
                             cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["total_steps"] >= 2000 and summary["config"]["env"]["id"] == "CartPole-v1"

"""Packaging: the sibling folders install as rlstack.algorithms/envs/serving, editable and as a wheel."""

import os
import subprocess
import sys
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


def test_wheel_has_no_top_level_envs_or_serving_and_imports(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), "-q"], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("rlstack-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"rlstack"}, top
    for module in ("rlstack/algorithms/ppo.py", "rlstack/envs/make.py", "rlstack/serving/__init__.py",
                   "rlstack/network.py", "rlstack/bench/__main__.py", "rlstack/bench/seeds.py"):
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

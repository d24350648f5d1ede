"""Device and fusion switches: CPU works, fusion on CPU and missing backends are clear errors."""

import pytest

from rlstack.runtime import DeviceError, configure, device_available, resolve_fusion


def test_cpu_auto_means_fusion_off():
    assert resolve_fusion("cpu", "auto") is False
    assert configure("cpu", "auto").fusion is False


def test_fusion_on_cpu_is_a_clear_error():
    with pytest.raises(DeviceError, match="graph-kernel fusion needs the Ascend or GPU backend"):
        configure("cpu", "on")


def test_fusion_auto_means_on_for_accelerators():
    assert resolve_fusion("ascend", "auto") is True and resolve_fusion("gpu", "off") is False


@pytest.mark.parametrize("device", ["gpu", "ascend"])
def test_missing_accelerator_is_refused_with_reason(device):
    # This machine (and CI) has no accelerator: the probe must say so instead of crashing.
    assert device_available(device) is False
    with pytest.raises(DeviceError, match=f"device '{device}' is not usable"):
        configure(device, "auto")


def test_unknown_device():
    with pytest.raises(DeviceError, match="valid: cpu, gpu, ascend"):
        configure("tpu")


def test_a_run_does_not_print_the_harmless_adam_deprecation_but_other_warnings_still_show():
    import subprocess
    import sys

    code = ("from rlstack.runtime import configure\n"
            "configure()\n"
            "import mindspore as ms\n"
            "from mindspore import nn\n"
            "nn.Adam(nn.Dense(2, 2).trainable_params())\n"
            "ms.log.warning('another warning')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FusedSparseAdam" not in proc.stderr and "another warning" in proc.stderr, proc.stderr[-2000:]

"""`python -m rlstack.bench runtime`: every floor figure is measured (finite, positive; the figures
themselves are benchmark output, not asserted here) and a chain over the 100-kernel line is refused."""

import json
import math

import pytest

from rlstack.bench import runtime


def test_runtime_floor_figures_are_measured(capsys):
    assert runtime.main(["--calls", "20", "--repeats", "1", "--kernels", "41"]) == 0
    result = json.loads(capsys.readouterr().out)
    figures = [result[k] for k in ("call_us", "call_and_asnumpy_us", "call_and_to_numpy_us", "call_41_kernels_us")]
    figures += list(result["ppo_step_ms"].values())
    assert all(math.isfinite(x) and x > 0 for x in figures), result
    assert set(result["ppo_step_ms"]) == {"rows_256", f"rows_{runtime.SMALL_ROWS}"}


def test_a_chain_over_the_single_thread_line_is_refused(capsys):
    with pytest.raises(SystemExit):
        runtime.main(["--kernels", "101"])
    assert "--kernels must be in 2..100" in capsys.readouterr().err

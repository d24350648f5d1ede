"""`python -m rlstack.bench runtime`: what MindSpore's runtime costs per graph call and per kernel on
this device, before arithmetic, as JSON: the floor under every acting call and update step.

- `call_us`: a one-kernel graph on [8, 4] through the lean call (`rlstack.graphcall.LeanCall`);
  `call_and_asnumpy_us` / `call_and_to_numpy_us` with its output read (`rlstack.graphcall.to_numpy`);
- `us_per_kernel`: the slope over chains of 1 and `--kernels` element-wise kernels on [8, 4]
  (all under the runtime's 100-kernel single-thread line);
- `ppo_step_ms`: one PPO minibatch step of the config (two graph calls, the Adam step included) at
  its batch size and at 16 rows: the same kernels with a sixteenth of the arithmetic (CartPole's
  256), so the 16-row time is mostly the runtime's cost of running them.

Every figure is the median over `--repeats` loops of `--calls` calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

SMALL_ROWS = 16


def _median_us(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return round(statistics.median(times), 1)


def _chain(kernels: int) -> Any:
    from mindspore import nn

    class Chain(nn.Cell):
        """`kernels` element-wise multiplies in a row (each its own kernel)."""

        def __init__(self):
            super().__init__()
            self.kernels = kernels

        def construct(self, x):
            for _ in range(self.kernels):
                x = x * 1.0001
            return x

    return Chain()


def call_costs(kernels: int, calls: int, repeats: int) -> dict[str, float]:
    """Microseconds: a one-kernel call, with its output read both ways, a `kernels`-kernel call,
    and the slope between the two."""
    import numpy as np
    from mindspore import Tensor

    from rlstack.graphcall import LeanCall, to_numpy

    x = Tensor(np.ones((8, 4), np.float32))
    one, many = LeanCall(_chain(1)), LeanCall(_chain(kernels))
    for call in (one, many):
        call(x)  # compiles and checks the direct path
    call_us = _median_us(lambda: one(x), calls, repeats)
    chain_us = _median_us(lambda: many(x), calls, repeats)
    return {
        "call_us": call_us,
        "call_and_asnumpy_us": _median_us(lambda: one(x).asnumpy(), calls, repeats),
        "call_and_to_numpy_us": _median_us(lambda: to_numpy(one(x)), calls, repeats),
        f"call_{kernels}_kernels_us": chain_us,
        "us_per_kernel": round((chain_us - call_us) / (kernels - 1), 2),
    }


def ppo_step_ms(config: str | None, calls: int, repeats: int) -> dict[str, float]:
    """Milliseconds per PPO minibatch step (`PPOStep.step`) of `config` at its batch size and at
    `SMALL_ROWS` rows, on random packed minibatches."""
    import numpy as np

    from rlstack.algorithms.ppo import PPO, surrogate_inputs
    from rlstack.budget import probe_spaces
    from rlstack.config import load_config

    cfg = load_config(config or "ppo_cartpole", [])
    obs_space, action_space = probe_spaces(cfg)
    algo = PPO(cfg, obs_space, action_space)
    rng = np.random.default_rng(0)
    result = {}
    for rows in (cfg.train.batch_size, SMALL_ROWS):
        obs = np.stack([obs_space.sample() for _ in range(rows)])
        action = np.stack([action_space.sample() for _ in range(rows)])
        logp, ret, value = (rng.standard_normal(rows).astype(np.float32) for _ in range(3))
        terms = surrogate_inputs(rng.standard_normal(rows), np.ones(rows), 0.2, True)
        (inputs,) = algo.update.inputs(*(x[None] for x in (obs, action, logp, *terms, ret, value)))
        algo.update.step(*inputs).asnumpy()  # compiles this batch size
        result[f"rows_{rows}"] = round(_median_us(lambda x=inputs: algo.update.step(*x), calls, repeats) / 1e3, 3)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench runtime", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="PPO config for the step (default: configs/ppo_cartpole.yaml)")
    parser.add_argument("--kernels", type=int, default=61, help="kernels in the long chain (<= 100)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per figure (median reported)")
    args = parser.parse_args(argv)
    if not 2 <= args.kernels <= 100:
        parser.error(f"--kernels must be in 2..100 (the single-thread line), got {args.kernels}")

    from rlstack.runtime import configure

    configure()
    result = {"benchmark": "runtime", **call_costs(args.kernels, args.calls, args.repeats),
              "ppo_step_ms": ppo_step_ms(args.config, max(args.calls // 10, 1), args.repeats)}
    print(json.dumps(result, indent=2))
    return 0

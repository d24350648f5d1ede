"""`python -m rlstack.bench conv [--python VENV/bin/python]`: convolutions on this device, as JSON.

Networks (the default): Nature CNN (32x8x8/4, 64x4x4/2, 64x3x3/1, ReLU after each, flatten, dense
512 + ReLU on [B, 4, 84, 84]) and the MinAtar network (16x3x3/1 + ReLU, flatten, dense 128 + ReLU on
[B, 4, 10, 10]), each as three programs: rlstack's convolution (`rlstack.conv.ConvStack`, form
`matmul`), the same network with MindSpore's `nn.Conv2d` (form `native`), and PyTorch in the
interpreter given by `--python` (a venv with torch; its default threads, all cores, as SB3 runs).
Two calls per network: the train step at `--train-batch` (forward, the gradient of the mean square
of the features, Adam) and the acting call at `--act-batch` (forward, features read to the host).
Every program takes the same float32 observations, uint8 pixels divided by 255 beforehand (an
encoder's input: the observation after normalisation). The programs alternate within each of
`--repeats` rounds; each row gives the median and the min-max of the milliseconds per call over the
rounds, and rlstack's speed against torch's (torch ms / rlstack ms). The native `Conv2d` takes
seconds per train step: `--native-steps`.

`--layers`: each layer shape of both networks alone, forward and forward + backward (the
gradients of the input, weight and bias for a given output gradient), at both batches, for each
`Conv2dFast` method and the native `Conv2d`.

`--onednn`: runs each program twice with `ONEDNN_VERBOSE=1` in a child process and counts the
oneDNN primitives they executed (a reference kernel shows as `ref`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

# Imported before MindSpore is: the peer's environment as this command started.
from rlstack.bench.peer import peer_env

NETS: dict[str, tuple[tuple[int, int, int], tuple[tuple[int, int, int], ...], int]] = {
    "nature": ((4, 84, 84), ((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512),
    "minatar": ((4, 10, 10), ((16, 3, 1),), 128),
}
"""name -> (observation [C, H, W], convolutions (out, kernel, stride), dense width)."""

LAYERS: dict[str, tuple[int, int, int, int, int]] = {
    "nature_8x8/4": (4, 32, 8, 4, 84),
    "nature_4x4/2": (32, 64, 4, 2, 20),
    "nature_3x3/1": (64, 64, 3, 1, 9),
    "minatar_3x3/1": (4, 16, 3, 1, 10),
}
"""name -> (in channels, out channels, kernel, stride, input height = width)."""

TORCH_SCRIPT = r"""
import json, sys, time
import torch

spec = json.loads(sys.argv[1])
torch.manual_seed(0)
out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": {}}
for name, (shape, convs, hidden) in spec["nets"].items():
    layers, channels, size = [], shape[0], list(shape[1:])
    for c, k, s in convs:
        layers += [torch.nn.Conv2d(channels, c, k, s), torch.nn.ReLU()]
        channels, size = c, [(v - k) // s + 1 for v in size]
    net = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(channels * size[0] * size[1], hidden),
                              torch.nn.ReLU())
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    train_x = torch.randint(0, 256, (spec["train_batch"], *shape), dtype=torch.uint8).float() / 255.0
    act_x = torch.randint(0, 256, (spec["act_batch"], *shape), dtype=torch.uint8).float() / 255.0

    def train():
        loss = net(train_x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def act():
        with torch.no_grad():
            return net(act_x).numpy()

    for call, fn, n in (("train", train, spec["train_steps"]), ("act", act, spec["act_calls"])):
        fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        out["rows"][f"{name}/{call}"] = (time.perf_counter() - start) / n * 1e3
print(json.dumps(out))
"""


def _ms_per_call(fn: Callable[[], Any], calls: int, warm: bool = True) -> float:
    if warm:
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements, rounded to 3 decimals."""
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def build_programs(form: str, train_batch: int, act_batch: int) -> dict[str, Callable[[], Any]]:
    """name/train and name/act -> a call running that program once (compiled on first call)."""
    import numpy as np
    from mindspore import Tensor, nn, ops

    from rlstack.conv import ConvStack
    from rlstack.graphcall import LeanCall, to_numpy, written_by

    class TrainStep(nn.Cell):
        """mean(features ** 2), its gradient, one Adam step."""

        def __init__(self, net):
            super().__init__()
            self.net = net
            self.opt = nn.Adam(net.trainable_params(), learning_rate=1e-4)
            self.grad = ops.value_and_grad(self.loss, None, self.opt.parameters)

        def loss(self, obs):
            return ops.square(self.net(obs)).mean()

        def construct(self, obs):
            loss, grads = self.grad(obs)
            self.opt(grads)
            return loss

    rng = np.random.default_rng(0)
    programs = {}
    for name, (shape, convs, hidden) in NETS.items():
        net = ConvStack(shape, convs, form, dense=hidden)
        step = TrainStep(net)
        train = LeanCall(step, written_by(step))
        act = LeanCall(net)
        train_x, act_x = (Tensor(rng.integers(0, 256, (batch, *shape)).astype(np.float32) / 255.0)
                          for batch in (train_batch, act_batch))
        programs[f"{name}/train"] = lambda train=train, x=train_x: to_numpy(train(x))
        programs[f"{name}/act"] = lambda act=act, x=act_x: to_numpy(act(x))
    return programs


def run_torch(python: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = {"nets": NETS, "train_batch": args.train_batch, "act_batch": args.act_batch,
            "train_steps": args.train_steps, "act_calls": args.act_calls}
    done = subprocess.run([python, "-c", TORCH_SCRIPT, json.dumps(spec)], check=True, capture_output=True, text=True,
                          env=peer_env())
    return json.loads(done.stdout.strip().splitlines()[-1])


def networks(args: argparse.Namespace) -> dict[str, Any]:
    """The network rows: rlstack, native and torch alternating over `args.repeats` rounds."""
    forms = {"rlstack": build_programs("matmul", args.train_batch, args.act_batch)}
    if args.native_steps > 0:
        forms["native"] = build_programs("native", args.train_batch, args.act_batch)
    for programs in forms.values():
        for fn in programs.values():
            fn()  # compiles (and checks the lean call)
    times: dict[str, dict[str, list[float]]] = {}
    torch_info: dict[str, Any] = {}
    loads = []
    for _ in range(args.repeats):
        loads.append(os.getloadavg()[0])
        for form, programs in forms.items():
            for row, fn in programs.items():
                if form == "native":
                    calls = args.native_steps if row.endswith("/train") else max(args.native_steps, 1) * 10
                else:
                    calls = args.train_steps if row.endswith("/train") else args.act_calls
                # compiled above; the native train step is not run again untimed (seconds a call)
                times.setdefault(row, {}).setdefault(form, []).append(_ms_per_call(fn, calls, warm=form != "native"))
        if args.python:
            result = run_torch(args.python, args)
            torch_info = {"torch": result["torch"], "threads": result["threads"]}
            for row, ms in result["rows"].items():
                times.setdefault(row, {}).setdefault("torch", []).append(ms)
    rows = []
    for row, by_form in times.items():
        net, call = row.split("/")
        entry: dict[str, Any] = {"net": net, "call": call,
                                 "batch": args.train_batch if call == "train" else args.act_batch}
        for form, values in by_form.items():
            entry[f"{form}_ms"] = spread(values)
        if "torch" in by_form:
            entry["speed_vs_torch"] = round(statistics.median(by_form["torch"]) / statistics.median(by_form["rlstack"]),
                                            2)
        rows.append(entry)
    return {"rows": rows, **torch_info, "load_average": spread(loads)}


def layers(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Milliseconds per call of each layer shape alone, per method: forward, and forward plus
    the gradients of the input, weight and bias for a fixed output gradient."""
    import numpy as np
    from mindspore import Tensor, nn, ops

    from rlstack.conv import Conv2dFast
    from rlstack.graphcall import LeanCall

    class Backward(nn.Cell):
        def __init__(self, conv):
            super().__init__()
            self.conv = conv
            self.grad = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)
            self.params = conv.trainable_params()

        def construct(self, x, dout):
            return self.grad(self.conv, self.params)(x, dout)

    rng = np.random.default_rng(0)
    rows = []
    for name, (cin, cout, k, s, size) in LAYERS.items():
        if args.only and name not in args.only.split(","):
            continue
        for batch in (args.act_batch, args.train_batch):
            x = Tensor(rng.standard_normal((batch, cin, size, size)).astype(np.float32))
            oh = (size - k) // s + 1
            dout = Tensor(rng.standard_normal((batch, cout, oh, oh)).astype(np.float32))
            for method in args.methods.split(","):
                if method == "native":
                    conv = nn.Conv2d(cin, cout, k, s, pad_mode="valid", has_bias=True)
                else:
                    conv = Conv2dFast(cin, cout, k, s, method=method)
                row = {"layer": name, "batch": batch, "method": conv.method if method != "native" else "native"}
                for kind, cell, inputs in (("forward", conv, (x,)), ("backward", Backward(conv), (x, dout))):
                    call = LeanCall(cell)
                    big = batch >= 64
                    calls = (args.native_steps if method == "native" and big else
                             2 if big else args.act_calls // 4)
                    if calls <= 0:
                        continue
                    values = [_ms_per_call(lambda c=call, i=inputs: c(*i), calls, warm=r == 0)
                              for r in range(args.repeats)]
                    row[f"{kind}_ms"] = spread(values)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def onednn_primitives(args: argparse.Namespace) -> dict[str, dict[str, int]]:
    """form -> 'kind implementation' -> executions, from a child process run with ONEDNN_VERBOSE=1
    that calls each program of that form twice."""
    found = {}
    for form in ("matmul", "native"):
        code = ("from rlstack.runtime import configure\nfrom rlstack.bench.conv import build_programs\nconfigure()\n"
                f"for fn in build_programs({form!r}, {args.train_batch}, {args.act_batch}).values():\n"
                "    fn()\n    fn()\n")
        env = {**peer_env(), "ONEDNN_VERBOSE": "1"}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        counts: Counter[str] = Counter()
        for line in done.stdout.splitlines():
            parts = line.split(",")
            if line.startswith("onednn_verbose") and len(parts) > 6 and parts[2] == "primitive" and parts[3] == "exec":
                counts[f"{parts[5]} {parts[6]}"] += 1
        found[form] = dict(counts)
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench conv", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=None, help="interpreter of a venv with torch (the peer rows)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, the programs alternating in each")
    parser.add_argument("--train-batch", type=int, default=256)
    parser.add_argument("--act-batch", type=int, default=8)
    parser.add_argument("--train-steps", type=int, default=5, help="train steps timed per round")
    parser.add_argument("--act-calls", type=int, default=200, help="acting calls timed per round")
    parser.add_argument("--native-steps", type=int, default=1,
                        help="native Conv2d train steps per round (its acting calls: 10x); 0 leaves it out")
    parser.add_argument("--layers", action="store_true", help="time each layer shape and method instead")
    parser.add_argument("--methods", default="split,concat,gather,native", help="with --layers")
    parser.add_argument("--only", default=None, help=f"with --layers, comma-separated: {', '.join(LAYERS)}")
    parser.add_argument("--onednn", action="store_true", help="count the oneDNN primitives each form runs")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)

    from rlstack.runtime import configure

    configure()
    result: dict[str, Any] = {"benchmark": "conv", "train_batch": args.train_batch, "act_batch": args.act_batch,
                              "repeats": args.repeats}
    if args.onednn:
        result["onednn_primitives"] = onednn_primitives(args)
    elif args.layers:
        result["layers"] = layers(args)
    else:
        result.update(networks(args))
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0

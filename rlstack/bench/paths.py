"""The acting paths of `python -m rlstack.bench consistency`: the same `act(obs, noise)` computed
four ways (the exported graph, PyNative, float16, a numpy re-implementation), each an
`rlstack.acting.Acting` over its own compute function with its rollout calls timed."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor

from rlstack.acting import Acting, load_policy
from rlstack.artifact import interface
from rlstack.network import Network, copy_parameters

Outputs = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(action, logp, value) of one acting call, numpy."""

PATHS = ("exported", "pynative", "numpy", "float16")


class Recorder:
    """A path's compute function, timed: latency and recent observations of the rollout's sampling
    calls (batch == rollout batch, sampled noise; not the zero-noise bootstraps, probes or evaluations)."""

    def __init__(self, fn: Callable[[Tensor, Tensor], Outputs], batch: int, probe_rows: int):
        self.fn, self.batch = fn, batch
        self.latencies: list[float] = []
        self.recent: deque[np.ndarray] = deque(maxlen=max(1, math.ceil(probe_rows / batch)))
        self.on = True

    def __call__(self, obs: Tensor, noise: Tensor) -> Outputs:
        if not self.on or obs.shape[0] != self.batch:
            return self.fn(obs, noise)
        start = time.perf_counter()
        out = self.fn(obs, noise)
        seconds = time.perf_counter() - start
        if noise.asnumpy().any():
            self.latencies.append(seconds)
            self.recent.append(obs.asnumpy().copy())
        return out

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Calls inside are measurement or setup, not rollout: neither timed nor kept."""
        was, self.on = self.on, False
        try:
            yield
        finally:
            self.on = was


def _host(outputs: Any) -> Outputs:
    """(action, logp, value) as numpy; float16 results as float32 (int32 actions stay)."""
    arrays = [x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x) for x in outputs]
    action, logp, value = (a.astype(np.float32) if a.dtype == np.float16 else a for a in arrays)
    return action, logp, value


class ActingPath:
    """One way of computing the acting graph. `acting` is the `rlstack.acting.Acting` the trainer's
    collector calls (`trainer.train(acting=...)`), built over the path's own `compute` behind a
    `Recorder`; `refresh(trainer)` copies the learner's weights into the path (timed)."""

    name = ""
    description = ""

    def __init__(self, trainer: Any, probe_rows: int):
        self.rec = Recorder(self.compute, trainer.cfg.env.n_envs, probe_rows)
        self.acting = Acting(self.rec, interface(trainer.network, trainer.obs_space, trainer.action_space), lean=False)
        self.obs_shape = tuple(trainer.obs_space.shape)
        self.refresh_seconds: list[float] = []
        self.refresh(trainer, timed=False)  # the initial weights: setup, not a per-update cost
        self.warm_up()

    def compute(self, obs: Tensor, noise: Tensor) -> Outputs:
        raise NotImplementedError

    def load(self, trainer: Any) -> None:
        """Copy the learner's weights (and observation statistics) into the path."""
        raise NotImplementedError

    def refresh(self, trainer: Any, timed: bool = True) -> None:
        """The learner's current weights into the path; its steps are tagged with the update count."""
        start = time.perf_counter()
        self.load(trainer)
        self.acting.updates = trainer.counters.updates
        if timed:
            self.refresh_seconds.append(time.perf_counter() - start)

    def warm_up(self) -> None:
        """One call at the rollout batch so compilation is not counted as acting latency."""
        batch = self.rec.batch
        with self.rec.paused():
            self.acting(np.zeros((batch, *self.obs_shape), np.float32), self.acting.noise(batch, None))


def _learner(trainer: Any) -> Any:
    """The learner's network with the observation statistics the trainer sets before learning."""
    if trainer.obs_rms is not None:
        trainer.network.set_obs_stats(trainer.obs_rms.mean, trainer.obs_rms.var)
    return trainer.network


class ExportedPath(ActingPath):
    name = "exported"
    description = ("consistent: the project's acting module (rlstack.acting.Acting over load_policy): "
                   "nn.GraphCell on the MindIR the trainer exported, its Parameters refreshed from the learner "
                   "(Acting.sync_from) after every refresh_every updates")

    def __init__(self, trainer: Any, probe_rows: int, full_reload: bool = False):
        self.graph: Acting | None = None
        """The loaded version (`rlstack.acting.load_policy`); `compute` runs its graph call."""
        self.full_reload = full_reload
        if full_reload:
            self.description = ("consistent, publishing route: every refresh exports a new policy version "
                                "(policy/vN + manifest), loads it with rlstack.acting.load_policy and swaps it into "
                                "the actor (Acting.swap: a new GraphCell, compiled on its first call)")
        super().__init__(trainer, probe_rows)

    def load(self, trainer: Any) -> None:
        if self.graph is None:
            # What the trainer's own in-process actor starts from: the learner's acting graph (its
            # obs statistics set) exported to a private directory. Not `Trainer.export()`: that
            # publishes a version and logs it, which needs the logger that `train()` opens.
            _learner(trainer)
            self.graph = load_policy(trainer.publisher.private_graph(trainer.counters.updates),
                                     obs_shape=self.obs_shape)
        elif self.full_reload:
            self.graph.swap(load_policy(trainer.export(), obs_shape=self.obs_shape))
            self.warm_up()  # a new GraphCell compiles on its first call: part of a full reload's cost
        else:
            self.graph.sync_from(_learner(trainer), trainer.counters.updates)

    def compute(self, obs: Tensor, noise: Tensor) -> Outputs:
        return _host(self.graph.call(obs, noise))


class CopyPath(ActingPath):
    """A second Network of the learner's architecture, the learner's weights copied into it. A copy
    rather than the learner's own Cell, so that every path acts on weights of the same age (with
    `refresh_every` > 1 as well) and only the way of computing differs."""

    dtype: Any = None
    """The copy's compute type (`Cell.to_float`); None: float32, as the learner."""

    def __init__(self, trainer: Any, probe_rows: int):
        self.network = Network(trainer.obs_space, trainer.action_space, trainer.network.spec)
        if self.dtype is not None:
            self.network.to_float(self.dtype)
        super().__init__(trainer, probe_rows)

    def load(self, trainer: Any) -> None:
        copy_parameters(_learner(trainer), self.network)

    def compute(self, obs: Tensor, noise: Tensor) -> Outputs:
        return _host(self.network(obs, noise))


class PyNativePath(CopyPath):
    name = "pynative"
    description = ("the network run in PyNative (eager) mode: the context is switched to PYNATIVE_MODE around "
                   "each acting call and back to GRAPH_MODE for the update; a copy of the learner's Cell, "
                   "weights copied after every refresh_every updates")

    def __init__(self, trainer: Any, probe_rows: int):
        self.modes_seen: set[int] = set()
        super().__init__(trainer, probe_rows)

    def compute(self, obs: Tensor, noise: Tensor) -> Outputs:
        previous = ms.get_context("mode")
        ms.set_context(mode=ms.PYNATIVE_MODE)
        try:
            self.modes_seen.add(ms.get_context("mode"))
            return super().compute(obs, noise)
        finally:
            ms.set_context(mode=previous)


class Float16Path(CopyPath):
    name = "float16"
    description = ("a separate copy of the network with to_float(ms.float16) (float16 compute, graph mode), "
                   "float32 weights copied from the learner after every refresh_every updates")
    dtype = ms.float16


class NumpyPath(ActingPath):
    name = "numpy"
    description = ("a separately maintained float32 numpy implementation of Network.act "
                   "(no MindSpore call), weights copied from the learner after every refresh_every updates")

    def __init__(self, trainer: Any, probe_rows: int):
        self.forward = NumpyNetwork.like(trainer.network)
        super().__init__(trainer, probe_rows)

    def load(self, trainer: Any) -> None:
        self.forward.load(_learner(trainer))

    def compute(self, obs: Tensor, noise: Tensor) -> Outputs:
        return self.forward.act(obs.asnumpy(), noise.asnumpy())


PATH_CLASSES: dict[str, type[ActingPath]] = {
    "exported": ExportedPath, "pynative": PyNativePath, "numpy": NumpyPath, "float16": Float16Path}


def make_path(name: str, trainer: Any, probe_rows: int = 128, full_reload: bool = False) -> ActingPath:
    """The acting path `name` for `trainer`, holding the learner's current weights."""
    if name not in PATH_CLASSES:
        raise ValueError(f"unknown acting path '{name}'; valid: {', '.join(PATHS)}")
    options = {"full_reload": full_reload} if name == "exported" else {}
    return PATH_CLASSES[name](trainer, probe_rows, **options)


_ACTIVATIONS = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    # nn.GELU() defaults to the tanh approximation.
    "gelu": lambda x: 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x ** 3))),
}
_HALF_LOG_2PI = np.float32(0.5 * math.log(2.0 * math.pi))


@dataclass
class NumpyNetwork:
    """`Network.act` written again in numpy float32: a genuinely separate code path."""

    kind: str
    activation: str
    action_dim: int
    normalize_obs: bool
    obs_clip: float
    mask_start: int
    masked: bool
    has_value: bool
    n_critics: int
    action_mid: np.ndarray | None
    action_half: np.ndarray | None
    params: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def like(cls, net: Any) -> NumpyNetwork:
        if net.kind not in ("categorical", "gaussian", "squashed_gaussian"):
            raise ValueError(f"the numpy acting path covers policy heads categorical, gaussian and "
                             f"squashed_gaussian; this network's head is '{net.kind}'")
        box = not net.discrete
        return cls(kind=net.kind, activation=net.spec.activation, action_dim=net.action_dim,
                   normalize_obs=bool(net.spec.normalize_obs), obs_clip=float(net.spec.obs_clip),
                   mask_start=int(getattr(net, "mask_start", net.obs_dim)), masked=bool(getattr(net, "masked", False)),
                   has_value=bool(net.has_value), n_critics=int(net.spec.n_critics) if net.qkind == "continuous" else 0,
                   action_mid=net.action_mid.asnumpy() if box else None,
                   action_half=net.action_half.asnumpy() if box else None)

    def load(self, net: Any) -> None:
        """Copy every parameter out of the live network (the obs statistics are parameters too)."""
        self.params = {name: p.asnumpy().astype(np.float32, copy=True) for name, p in net.parameters_and_names()}

    def _mlp(self, prefix: str, x: np.ndarray) -> np.ndarray:
        layer = 0
        while f"{prefix}.{layer}.weight" in self.params:
            x = x @ self.params[f"{prefix}.{layer}.weight"].T + self.params[f"{prefix}.{layer}.bias"]
            layer += 2  # Dense at even indices, the activation between them
            if f"{prefix}.{layer}.weight" in self.params:
                x = _ACTIVATIONS[self.activation](x).astype(np.float32)
        return x

    def act(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        flat = obs.reshape(len(obs), -1).astype(np.float32)
        x = flat
        if self.normalize_obs:
            x = np.clip((flat - self.params["normalizer.mean"]) / np.sqrt(self.params["normalizer.var"] + 1e-8),
                        -self.obs_clip, self.obs_clip).astype(np.float32)
        if self.kind == "categorical":
            logits = self._mlp("pi", x)
            if self.masked:
                logits = logits + (flat[:, self.mask_start:] - 1.0) * np.float32(1e9)
            shifted = logits - logits.max(-1, keepdims=True)
            logp_all = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            action = np.argmax(logits + noise, -1).astype(np.int32)
            logp = np.take_along_axis(logp_all, action[:, None], 1)[:, 0]
            return action, logp.astype(np.float32), self._value(x, action)
        elif self.kind == "gaussian":
            log_std = self.params["pi.log_std"]
            action = self._mlp("pi", x) + np.exp(log_std) * noise
            logp = (-0.5 * noise * noise - log_std - _HALF_LOG_2PI).sum(-1)
        else:
            out = self._mlp("pi", x)
            mean, log_std = out[:, : self.action_dim], np.clip(out[:, self.action_dim:], -20.0, 2.0)
            u = mean + np.exp(log_std) * noise
            logp = (-0.5 * noise * noise - log_std - _HALF_LOG_2PI).sum(-1)
            softplus = np.logaddexp(np.float32(0.0), -2.0 * u)
            logp = logp - (2.0 * (np.float32(math.log(2.0)) - u - softplus)).sum(-1)
            action = np.tanh(u) * self.action_half + self.action_mid
        action = action.astype(np.float32)
        return action, logp.astype(np.float32), self._value(x, action)

    def _value(self, x: np.ndarray, action: np.ndarray) -> np.ndarray:
        if self.has_value:
            return self._mlp("vf", x)[:, 0].astype(np.float32)
        if self.n_critics:
            xa = np.concatenate([x, (action - self.action_mid) / self.action_half], -1).astype(np.float32)
            return np.min([self._mlp(f"critics.{i}", xa)[:, 0] for i in range(self.n_critics)], 0).astype(np.float32)
        return np.zeros(len(x), np.float32)

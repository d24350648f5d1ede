"""The acting module: every call of a policy graph, live or exported, goes through `Acting`.

One class for every caller: the trainer's in-process actor and the actor processes (the
exported graph, weights refreshed from the learner), evaluation and parity probes (the live
network), the server's batcher, the self-play opponents and the benchmarks. It owns what each
of them would otherwise write for itself:

- the call: numpy in, numpy out, one graph call per batch, through `rlstack.graphcall.LeanCall`
  for exported graphs (no compile-key work per call);
- padding: zero rows up to a compiled batch size (`rows=`) and, for `parity: strict` graphs,
  up to whole blocks of the manifest's `batch_rows`, results cut back (rows are independent);
- noise (sampled, or zeros for the deterministic action), Box clipping (`to_env`), uniformly
  random actions (off-policy warm-up);
- the observation forms users have (`act`): one observation, a batch, a PettingZoo-style dict
  `{"observation", "action_mask"}` or a batch (or list) of such dicts;
- weights: `load_weights`, `sync_from` a live network, `follow` one (refresh when its update
  count changes), `swap` to another loaded version; `PolicyWatcher` follows `LATEST`.

The in-process actor refreshes weights in place instead of reloading: an export and a new
GraphCell cost far more than a refresh (docs/PERFORMANCE.md#actors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from mindspore import Tensor

from rlstack.artifact import ArtifactError, LoadedGraph, interface, latest_name, load_graph
from rlstack.graphcall import LeanCall, ParameterCopy, to_numpy
from rlstack.network import NoiseKind, OUNoise, PriorsGraph, sample_noise
from rlstack.spaces import MASK_KEY, OBS_KEY

Layout = tuple[tuple[str, tuple[int, ...]], ...]
"""(name, shape) of every parameter of a graph, in a fixed order."""


class ActResult(NamedTuple):
    action: np.ndarray  # [B] int32 or [B, d] float32 (raw graph output; `logp` refers to it)
    logp: np.ndarray  # [B] float32
    value: np.ndarray  # [B] float32


class Acting:
    """A policy graph with everything needed to act with it: numpy in, numpy out.

    `cell` is a loaded `nn.GraphCell` (`load_policy`), the live `Network` (`of_network`), or any
    function of (obs, noise) Tensors returning (action, logp, value) (benchmarks compare other
    ways of computing the same graph); `manifest` describes its interface (spaces, noise,
    `batch_rows`) as an artifact manifest does. `updates` is the learner-update count of the
    weights it runs (tagged on every transition an actor collects).
    """

    def __init__(self, cell: Any, manifest: dict[str, Any], path: Path | None = None, *,
                 lean: bool = True, updates: int | None = None, priors: Any = None):
        self._source: Any = None
        self._key: Callable[[], tuple] | None = None
        self._seen: tuple | None = None
        self._copies: tuple[Callable[[], None], Callable[[], None]] | None = None
        self.refreshes = 0
        self._install(cell, manifest, path, lean, priors)
        if updates is not None:
            self.updates = updates

    def _install(self, cell: Any, manifest: dict[str, Any], path: Path | None, lean: bool, priors: Any) -> None:
        self.cell, self.manifest, self.path = cell, manifest, path
        self.call = LeanCall(cell) if lean else cell
        # A game's priors entry point (`rlstack.network.PriorsGraph`): the same parameters, by name.
        self.priors_cell = priors
        self._priors_call = None if priors is None else LeanCall(priors) if lean else priors
        self.obs_shape: tuple[int, ...] = tuple(int(d) for d in manifest["observation_space"]["shape"])
        # uint8 frames for a conv encoder, float32 otherwise (artifacts before it: float32)
        self.obs_dtype = np.dtype(manifest["inputs"].get("obs_dtype", "float32"))
        self.noise_kind = NoiseKind(manifest["noise"]["kind"])
        self.noise_dim = int(manifest["noise"]["dim"])
        # Temporally correlated noise keeps its state here, one row per env of the caller's batch
        # (and across a swap to another version of the graph).
        process = getattr(self, "noise_process", None)
        self.noise_process = (process or OUNoise()) if self.noise_kind == NoiseKind.ORNSTEIN_UHLENBECK else None
        self.batch_rows = int(manifest.get("batch_rows", 1))
        space = manifest["action_space"]
        self.box = space["type"] == "Box"
        if self.box:
            self.low = np.asarray(space["low"], np.float32).reshape(space["shape"])
            self.high = np.asarray(space["high"], np.float32).reshape(space["shape"])
        # The learner's update count recorded at export, else the version number (artifacts made
        # elsewhere), else 0 (a live network).
        updates = manifest.get("updates")
        self.updates = int(updates) if updates is not None else int(manifest.get("version", "v0")[1:])
        # A Cell's parameters (weights can be loaded); a plain function has none.
        self._params = dict(cell.parameters_and_names()) if hasattr(cell, "parameters_and_names") else {}
        self._priors_params = dict(priors.parameters_and_names()) if hasattr(priors, "parameters_and_names") else {}

    @classmethod
    def of_network(cls, network: Any, obs_space: gym.Space, action_space: gym.Space, updates: int = 0) -> Acting:
        """The live network's acting graph (Cell.__call__: the learner changes its weights in place)."""
        return cls(network, interface(network, obs_space, action_space), lean=False, updates=updates,
                   priors=PriorsGraph(network) if network.has_priors else None)

    @property
    def version(self) -> str | None:
        """The artifact version name (`v000003`), None for a live network."""
        return self.manifest.get("version")

    @property
    def graph(self) -> Any:
        return self.cell

    # ----- the call ---------------------------------------------------------------------------

    def run(self, obs: np.ndarray, noise: np.ndarray, rows: int | None = None) -> ActResult:
        """The raw graph call: obs [B, *obs_shape], noise [B, noise_dim] -> B rows of (action, logp, value).

        Zero rows are appended up to `rows` (a compiled batch size) and, for a `parity: strict`
        graph, up to whole blocks of `batch_rows`, so every row is bitwise independent of the
        batch it was computed in; the results are cut back to B rows.
        """
        if self._key is not None:
            self._follow()
        n = len(obs)
        obs, noise = self._padded(rows, (obs, self.obs_dtype), (noise, np.float32))
        # from_numpy: the graph reads the arrays in place (the call returns after it ran)
        action, logp, value = (_numpy(x)[:n] for x in self.call(Tensor.from_numpy(obs), Tensor.from_numpy(noise)))
        return ActResult(action, logp, value)

    def _padded(self, rows: int | None, *arrays: tuple[np.ndarray, Any]) -> list[np.ndarray]:
        """Each (array, dtype) contiguous in its dtype, zero rows appended up to `rows` and to whole
        blocks of `batch_rows`."""
        n = len(arrays[0][0])
        size = max(n, rows or 0)
        size += -size % self.batch_rows
        out = []
        for array, dtype in arrays:
            array = np.ascontiguousarray(array, dtype)
            if size > n:
                array = np.concatenate([array, np.zeros((size - n, *array.shape[1:]), dtype)])
            out.append(array)
        return out

    __call__ = run

    @property
    def has_priors(self) -> bool:
        return self.priors_cell is not None

    def priors(self, obs: np.ndarray, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The priors entry point: obs [B, D] -> (log-probabilities of every move [B, n], -1e9 on
        illegal moves; V(s) [B]), one row per position; padded as `run` pads."""
        if self._priors_call is None:
            raise ArtifactError("this policy has no priors entry point (exported before it, or not a masked "
                                "categorical policy with a value head)")
        if self._key is not None:
            self._follow()
        n = len(obs)
        (obs,) = self._padded(rows, (obs, self.obs_dtype))
        logp_all, value = (_numpy(x)[:n] for x in self._priors_call(Tensor.from_numpy(obs)))
        return logp_all, value

    def noise(self, batch: int, rng: np.random.Generator | None) -> np.ndarray:
        """Sampling noise [batch, noise_dim], or zeros (the deterministic action) when rng is None."""
        if rng is None:
            return np.zeros((batch, self.noise_dim), np.float32)
        if self.noise_process is not None:
            return self.noise_process(batch, self.noise_dim, rng)
        return sample_noise(self.noise_kind, self.noise_dim, batch, rng)

    def episodes_ended(self, done: np.ndarray) -> None:
        """The envs of a batch whose episodes ended (a boolean mask): a noise process restarts them."""
        if self.noise_process is not None:
            self.noise_process.restart(done)

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """The action the env receives: Gaussian samples are clipped to the Box (as SB3)."""
        return np.clip(action, self.low, self.high) if self.box else action

    def random_actions(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Uniformly random actions [n] int32 or [n, d] float32 (off-policy warm-up)."""
        space = self.manifest["action_space"]
        if space["type"] == "Discrete":
            return rng.integers(0, int(space["n"]), size=n).astype(np.int32)  # an index, as the graph's action
        return rng.uniform(self.low, self.high, size=(n, *self.low.shape)).astype(np.float32)

    def act(self, obs: Any, deterministic: bool = False, seed: int | None = None,
            rng: np.random.Generator | None = None, clip: bool = True) -> ActResult:
        """numpy in, numpy out, for users of an exported policy.

        `obs` is one observation, a batch [B, *obs_shape], or for masked games a PettingZoo-style
        dict `{"observation": ..., "action_mask": ...}` (one, with batched arrays, or a list of
        them). `seed` fixes the noise, so a stochastic action is reproducible. Box actions are
        clipped to the action space unless `clip=False` (the raw sample is what `logp` refers to).
        """
        obs = np.asarray(self._flat(obs)).astype(self.obs_dtype, copy=False)
        single = obs.shape == self.obs_shape
        batch = obs[None] if single else obs
        if batch.ndim != len(self.obs_shape) + 1 or batch.shape[1:] != self.obs_shape:
            raise ArtifactError(f"observation shape {obs.shape} does not match the policy: expected "
                                f"{self.obs_shape} or a batch [B, {', '.join(map(str, self.obs_shape))}]")
        if rng is None:
            rng = np.random.default_rng(seed)
        result = self.run(batch, self.noise(len(batch), None if deterministic else rng))
        action = self.to_env(result.action) if clip else result.action
        if single:
            return ActResult(action[0], result.logp[0], result.value[0])
        return ActResult(action, result.logp, result.value)

    def _flat(self, obs: Any) -> Any:
        """A masked-game dict observation (or a list of them) as the graph's flat vector."""
        if isinstance(obs, Sequence) and not isinstance(obs, str) and obs and isinstance(obs[0], dict):
            return np.stack([self._flat(o) for o in obs])
        if not isinstance(obs, dict):
            return obs
        layout = {part["key"]: part for part in self.manifest["observation_space"].get("flat_layout", [])}
        if set(obs) != {OBS_KEY, MASK_KEY} or set(layout) != {OBS_KEY, MASK_KEY}:
            raise ArtifactError(f"a dict observation needs the keys '{OBS_KEY}' and '{MASK_KEY}' and a policy of a "
                                f"masked game; got keys {sorted(obs)} for observations of shape {self.obs_shape}")
        planes = np.asarray(obs[OBS_KEY], np.float32)
        mask = np.asarray(obs[MASK_KEY], np.float32)
        size, mask_dim = layout[OBS_KEY]["size"], layout[MASK_KEY]["size"]
        lead = planes.shape[:planes.ndim - len(layout[OBS_KEY]["shape"])]
        if planes.shape[len(lead):] != tuple(layout[OBS_KEY]["shape"]) or mask.shape != (*lead, mask_dim):
            raise ArtifactError(f"dict observation: '{OBS_KEY}' {planes.shape} and '{MASK_KEY}' {mask.shape} do not "
                                f"match the policy's {tuple(layout[OBS_KEY]['shape'])} and ({mask_dim},)")
        return np.concatenate([planes.reshape(*lead, size), mask.reshape(*lead, mask_dim)], -1)

    # ----- weights ----------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        """(name, shape) of every parameter of the graph, in a fixed order."""
        return tuple((name, tuple(int(d) for d in p.shape)) for name, p in sorted(self._params.items()))

    def load_weights(self, weights: dict[str, np.ndarray], updates: int) -> None:
        """Overwrite the graph's parameters (copies; every parameter of `layout` must be given)."""
        missing = sorted(set(self._params) - set(weights))
        if missing:
            raise ArtifactError(f"weights for the acting graph lack {', '.join(missing[:5])}")
        self._load(weights)
        self.updates = updates
        self.refreshes += 1

    def _load(self, weights: dict[str, np.ndarray]) -> None:
        for name, value in weights.items():
            param = self._params[name]
            value = np.array(value, np.float32)  # a private copy: the graph must not alias it
            if value.shape != tuple(param.shape):
                raise ArtifactError(f"weight '{name}' has shape {value.shape}, the graph expects {tuple(param.shape)}")
            param.set_data(Tensor(value))
            if name in self._priors_params:
                self._priors_params[name].set_data(Tensor(value.copy()))

    def sync_from(self, network: Any, updates: int) -> None:
        """Copy the live network's values of the graph's parameters (same names as exported)."""
        self.load_weights(weights_of(network, self.layout), updates)

    def follow(self, network: Any, key: Callable[[], tuple]) -> None:
        """Refresh from `network` whenever `key()` changes (checked before each call). The key's
        first item is the learner's update count: when only the rest changed (e.g. DQN's epsilon),
        only the network's non-trainable parameters are copied."""
        self._source, self._key, self._seen = network, key, None
        self._copies = None

    def refresh(self) -> None:
        """Copy the followed network's weights now (e.g. after its parameters were replaced)."""
        if self._key is not None:
            self._seen = None
            self._follow()

    def _follow(self) -> None:
        seen = self._key()
        if seen != self._seen:
            if self._copies is None:
                self._copies = self._copy_graphs()
            everything, frozen = self._copies
            if self._seen is not None and seen[0] == self._seen[0]:
                frozen()
            else:
                everything()
                self.updates = int(seen[0])
                self.refreshes += 1
            self._seen = seen

    def _copy_graphs(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """The followed network's parameters copied into the graph's (and the priors graph's),
        every one of the layout and only the non-trainable ones (the statistics, DQN's epsilon),
        as compiled graphs."""
        sources = live_parameters(self._source, self.layout)
        frozen = {i for i, p in enumerate(sources) if not p.requires_grad}
        copies = []
        for params in (self._params, self._priors_params):  # (one name once per copy graph)
            every = [i for i, (name, _) in enumerate(self.layout) if name in params]
            copies.append([ParameterCopy([params[self.layout[i][0]] for i in chosen], [sources[i] for i in chosen])
                           for chosen in (every, [i for i in every if i in frozen])])
        return (lambda: [c[0]() for c in copies]), (lambda: [c[1]() for c in copies])

    def swap(self, other: Acting) -> None:
        """Run another loaded version's graph from now on (its own weights and update count)."""
        self._install(other.cell, other.manifest, other.path, lean=False, priors=other.priors_cell)
        self.call, self._priors_call = other.call, other._priors_call
        self._seen, self._copies = None, None


def _numpy(x: Any) -> np.ndarray:
    return to_numpy(x) if isinstance(x, Tensor) else np.asarray(x)


def live_parameters(network: Any, layout: Layout) -> list[Any]:
    """The live network's parameters named in `layout`, in its order."""
    live = {p.name: p for p in network.get_parameters()}
    missing = [name for name, _ in layout if name not in live]
    if missing:
        raise ArtifactError(f"the live network has no parameter {', '.join(missing[:5])} of the acting graph")
    return [live[name] for name, _ in layout]


def weights_of(network: Any, layout: Layout) -> dict[str, np.ndarray]:
    """The live network's values of the named parameters (numpy copies)."""
    return {name: p.asnumpy().copy() for (name, _), p in zip(layout, live_parameters(network, layout), strict=True)}


class FlatWeights:
    """A graph's weights as one float32 vector in `layout` order: how actors receive them (shared
    memory, Ray's object store)."""

    def __init__(self, layout: Layout):
        self.layout: Layout = tuple((name, tuple(shape)) for name, shape in layout)
        self.sizes = [int(np.prod(shape, dtype=np.int64)) for _, shape in self.layout]
        self.size = max(1, sum(self.sizes))

    def pack(self, weights: dict[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Every weight of the layout into `out` (or a new vector)."""
        flat = np.empty(self.size, np.float32) if out is None else out
        start = 0
        for (name, shape), size in zip(self.layout, self.sizes, strict=True):
            value = np.asarray(weights[name], np.float32)
            if value.shape != shape:
                raise ValueError(f"weight '{name}' has shape {value.shape}, the actors' graph expects {shape}")
            flat[start:start + size] = value.reshape(-1)
            start += size
        return flat

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """name -> weight, as views of `flat`."""
        weights, start = {}, 0
        for (name, shape), size in zip(self.layout, self.sizes, strict=True):
            weights[name] = flat[start:start + size].reshape(shape)
            start += size
        return weights


def load_policy(path: str | Path, *, obs_shape: tuple[int, ...] | None = None,
                device: str | None = None, fusion: bool | None = None) -> Policy:
    """Load and verify a policy from a run dir, a `policy/` dir or a version dir (see
    `rlstack.artifact.load_graph`: manifest, sha256 and observation shape are checked before
    anything is built) and return it ready to act."""
    loaded: LoadedGraph = load_graph(path, obs_shape=obs_shape, device=device, fusion=fusion)
    return Acting(loaded.graph, loaded.manifest, loaded.path, priors=loaded.entry_points.get("priors"))


Policy = Acting
"""What `load_policy` returns: an `Acting` over a loaded version (the name users know)."""


class PolicyWatcher:
    """Follows `<policy_dir>/LATEST`: `poll()` loads a newly published version, else returns None.

    Publishing is atomic (a version directory appears whole, LATEST is replaced), and
    `load_graph` follows LATEST again when the version it read is pruned while loading, so a
    poll never sees a half-written version; a poll that loses a race returns None and the next
    one succeeds.
    """

    def __init__(self, policy_dir: str | Path, *, obs_shape: tuple[int, ...] | None = None,
                 device: str | None = None, fusion: bool | None = None):
        self.policy_dir = Path(policy_dir)
        self.obs_shape, self.device, self.fusion = obs_shape, device, fusion
        self.current: str | None = None
        self.loads = 0

    def latest_name(self) -> str | None:
        return latest_name(self.policy_dir)

    def changed(self) -> bool:
        """LATEST names a version other than the one loaded last."""
        name = self.latest_name()
        return name is not None and name != self.current

    def poll(self) -> Acting | None:
        if not self.changed():
            return None
        policy = load_policy(self.policy_dir, obs_shape=self.obs_shape, device=self.device, fusion=self.fusion)
        self.current = policy.version
        self.loads += 1
        return policy

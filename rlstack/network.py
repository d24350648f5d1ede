"""The one network module every algorithm trains and every actor and server runs
(docs/DESIGN.md, contracts 1-2).

`Network` is built from the gymnasium spaces and a `NetSpec` naming the heads an algorithm needs:

| head                | used by | output                                   |
|---------------------|---------|------------------------------------------|
| categorical policy  | PPO     | logits [B, n]                            |
| Gaussian policy     | PPO     | mean [B, d], state-independent log_std   |
| squashed Gaussian   | SAC     | tanh(mean + std * noise) rescaled to Box  |
| state value         | PPO     | V(s) [B]                                 |
| Q-values, discrete  | DQN     | Q(s, .) [B, n] (optionally dueling)      |
| Q(s, a), continuous | SAC     | n_critics twin critics [n_critics, B]    |

Observation normalisation (running mean/variance, clipped) lives inside the graph, so every
exported graph carries it. `act(obs, noise) -> (action, logp, value)` is the acting graph of all
algorithms: randomness enters only through `noise`, so the graph is a pure function of its
inputs, and all-zero noise is the deterministic action.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Orthogonal, Zero

from rlstack.kernels import LogSoftmax, column, columns
from rlstack.spaces import flat_masked_space, mask_dim_of

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC's clamp (Haarnoja et al. reference code)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class PolicyKind(StrEnum):
    NONE = "none"
    CATEGORICAL = "categorical"
    GAUSSIAN = "gaussian"
    SQUASHED_GAUSSIAN = "squashed_gaussian"


class QKind(StrEnum):
    NONE = "none"
    DISCRETE = "discrete"
    CONTINUOUS = "continuous"


class NoiseKind(StrEnum):
    """What the `noise` input of `act` holds; zero noise is always the deterministic action."""

    GUMBEL = "gumbel"
    """Standard Gumbel [B, n]: Gumbel-max sampling from the categorical policy."""
    NORMAL = "normal"
    """Standard normal [B, d]: reparameterised Gaussian."""
    EPSILON_GREEDY = "epsilon_greedy"
    """[B, 1 + n]: column 0 uniform in [0, 1) (explore when it exceeds 1 - epsilon), then
    standard Gumbel for the uniformly random action."""


@dataclass(frozen=True)
class NetSpec:
    """Which heads to build and how; algorithms fill this from `net:` config plus their needs."""

    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    policy: PolicyKind = PolicyKind.CATEGORICAL
    value: bool = True
    q: QKind = QKind.NONE
    n_critics: int = 2
    dueling: bool = False
    normalize_obs: bool = False
    obs_clip: float = 10.0
    log_std_init: float = 0.0
    ortho_init: bool = True
    batch_invariant: bool = False
    """`parity: strict`: every row's output is bitwise independent of the batch it is computed in,
    provided every call has a whole number of `BLOCK_ROWS` rows (see `BatchInvariantDense`)."""
    act_value: bool = True
    """`act` returns a value: V(s), max_a Q(s, a) or min_i Q_i(s, a). False: zeros. SAC acts
    without it: its twin critics at [256, 256] cost more than the actor at every env step
    (5 ms of a 5.3 ms acting call, measured) and no consumer of an off-policy rollout reads it.
    The manifest's `value` says which it is."""


    @classmethod
    def of(cls, net: Any, **heads: Any) -> NetSpec:
        """The `net:` config section's settings (`rlstack.config.NetConfig`) plus an algorithm's heads."""
        return cls(hidden=tuple(net.hidden), activation=net.activation, normalize_obs=net.normalize_obs,
                   obs_clip=net.obs_clip, log_std_init=net.log_std_init, ortho_init=net.ortho_init, **heads)


def copy_parameters(source: nn.Cell, destination: nn.Cell) -> None:
    """Copy every parameter value of `source` into `destination` (same architecture): target networks."""
    for src, dst in zip(source.get_parameters(), destination.get_parameters(), strict=True):
        dst.set_data(Tensor(src.asnumpy()))


_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU}


BLOCK_ROWS = 16
"""`parity: strict` runs every graph call on a whole number of blocks of this many rows: the
acting wrappers pad a batch with zero rows on the host (`rlstack.acting.Acting.run`; the
manifest records `batch_rows`) and the learner's minibatches are multiples of it (checked in
the config). Element-wise kernels (tanh, exp, log, softplus) round the last partial SIMD vector
of a tensor differently from the full ones; a tensor of whole 16-row blocks never has one on
AVX2 (8 floats) or AVX-512 (16 floats) kernels; 1-row calls were measured to differ."""


class RowWiseMatMul(nn.Cell):
    """x [B, K] @ w.T for w [N, K], computed as (w @ x.T).T: the batch runs along the columns.

    Measured on MindSpore 2.10's CPU MatMul: a [B, K] x [K, N] product splits its B rows into
    tiles (and threads) whose boundaries depend on B, and a row in a tail tile is summed in
    another order (~1e-7 apart); neither fixed 64-row blocks nor a batched product of 64-row
    blocks was invariant for every block count. With the batch as the column dimension of
    [N, K] x [K, B], every column was bitwise the same for every B that is a multiple of 16, at
    the cost of the plain product; one [1, K] x [K, N] product per row (batched GEMV) was
    invariant too but 2-3x slower at B >= 256.
    w @ x.T is one MatMul with `transpose_b` (bitwise the same invariance; a Transpose kernel of x
    per layer less), and the weight gradient dout.T @ x one with `transpose_a`. The backward pass is
    the ordinary matrix product (gradients need not be batch-invariant)."""

    def __init__(self):
        super().__init__()
        self.matmul_nt = ops.MatMul(transpose_b=True)
        self.matmul_tn = ops.MatMul(transpose_a=True)

    def construct(self, x, w):
        return self.matmul_nt(w, x).T

    def bprop(self, x, w, out, dout):
        return ops.matmul(dout, w), self.matmul_tn(dout, x)


class BatchInvariantDense(nn.Dense):
    """`parity: strict` Dense: the same parameters as `nn.Dense`, the product taken with the batch
    along the columns (`RowWiseMatMul`) so every output row is bitwise independent of the batch
    it is in (given whole `BLOCK_ROWS` blocks)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.row_matmul = RowWiseMatMul()

    def construct(self, x):
        return self.row_matmul(x, self.weight) + self.bias


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str,
        ortho: bool, out_gain: float, batch_invariant: bool = False) -> nn.SequentialCell:
    """Dense layers with `activation` between them; orthogonal init as in SB3/CleanRL.

    `batch_invariant` builds the `parity: strict` variant (same parameters, same names).
    """
    dense = BatchInvariantDense if batch_invariant else nn.Dense
    layers: list[nn.Cell] = []
    sizes = [in_dim, *hidden]
    for fan_in, fan_out in zip(sizes, sizes[1:], strict=False):
        init = Orthogonal(gain=math.sqrt(2.0)) if ortho else "normal"
        layers += [dense(fan_in, fan_out, weight_init=init, bias_init=Zero()), _ACTIVATIONS[activation]()]
    init = Orthogonal(gain=out_gain) if ortho else "normal"
    layers.append(dense(sizes[-1], out_dim, weight_init=init, bias_init=Zero()))
    return nn.SequentialCell(layers)


def obs_dim_of(space: gym.Space) -> int:
    """Width of the flat float32 observation the graph takes; a masked Dict (PettingZoo classic)
    enters flattened as `[observation.ravel(), action_mask]` (see rlstack/spaces.py)."""
    space = flat_masked_space(space)
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise TypeError(f"observation space {space} is not supported (Box, or Dict with "
                    "'observation' and 'action_mask')")


class ObsNormalizer(nn.Cell):
    """(obs - mean) / sqrt(var + eps), clipped; the statistics are non-trainable Parameters
    that the trainer overwrites from its running estimate, so export carries them."""

    def __init__(self, obs_dim: int, clip: float, enabled: bool):
        super().__init__()
        self.enabled = enabled
        self.clip = clip
        self.mean = Parameter(Tensor(np.zeros(obs_dim, np.float32)), name="obs_mean", requires_grad=False)
        self.var = Parameter(Tensor(np.ones(obs_dim, np.float32)), name="obs_var", requires_grad=False)

    def construct(self, obs):
        if not self.enabled:
            return obs
        return ops.clamp((obs - self.mean) / ops.sqrt(self.var + 1e-8), -self.clip, self.clip)

    def set_stats(self, mean: np.ndarray, var: np.ndarray) -> None:
        self.mean.set_data(Tensor(np.asarray(mean, np.float32)))
        self.var.set_data(Tensor(np.asarray(var, np.float32)))


class Network(nn.Cell):
    """The one network module. Calling it runs `act` (the graph that is exported)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, spec: NetSpec):
        super().__init__()
        self.spec = spec
        self.obs_dim = obs_dim_of(obs_space)
        # Masked observations: the last mask_dim entries of the flat obs are the legal-move mask.
        self.mask_dim = mask_dim_of(obs_space)
        self.masked = self.mask_dim > 0
        self.mask_start = self.obs_dim - self.mask_dim
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete and not isinstance(action_space, gym.spaces.Box):
            raise TypeError(f"action space {action_space} is not supported (Discrete or Box)")
        self.action_dim = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.policy_kind = PolicyKind(spec.policy)
        self.q_kind = QKind(spec.q)
        self._check_heads()
        # Plain constants for the graph compiler to branch on (it folds them at compile time).
        self.kind = self.policy_kind.value
        self.qkind = self.q_kind.value
        self.has_value = bool(spec.value)
        self.dueling = bool(spec.dueling)
        self.act_value = bool(spec.act_value)
        hidden, act, ortho = tuple(spec.hidden), spec.activation, spec.ortho_init
        invariant = bool(spec.batch_invariant)

        self.normalizer = ObsNormalizer(self.obs_dim, spec.obs_clip, spec.normalize_obs)
        # int32 indices straight from the kernel: `ops.argmax` returns int64, and a Cast is one more kernel
        self.argmax = ops.Argmax(-1, ms.int32)
        if self.policy_kind == PolicyKind.SQUASHED_GAUSSIAN:
            # SAC: state-dependent std, mean and log_std from one torso.
            self.pi = mlp(self.obs_dim, hidden, 2 * self.action_dim, act, ortho, 0.01, invariant)
        elif self.policy_kind != PolicyKind.NONE:
            self.pi = mlp(self.obs_dim, hidden, self.action_dim, act, ortho, 0.01, invariant)
        if self.policy_kind == PolicyKind.CATEGORICAL:
            self.log_softmax = LogSoftmax()
        if self.policy_kind == PolicyKind.GAUSSIAN:
            self.log_std = Parameter(Tensor(np.full(self.action_dim, spec.log_std_init, np.float32)), name="log_std")
        if spec.value:
            self.vf = mlp(self.obs_dim, hidden, 1, act, ortho, 1.0, invariant)
        if self.q_kind == QKind.DISCRETE:
            out = self.action_dim + (1 if spec.dueling else 0)
            self.qf = mlp(self.obs_dim, hidden, out, act, ortho, 1.0, invariant)
        elif self.q_kind == QKind.CONTINUOUS:
            self.critics = nn.CellList([mlp(self.obs_dim + self.action_dim, hidden, 1, act, ortho, 1.0, invariant)
                                        for _ in range(spec.n_critics)])
        if not self.discrete:
            low = np.asarray(action_space.low, np.float32).reshape(-1)
            high = np.asarray(action_space.high, np.float32).reshape(-1)
            bounded = np.all(np.isfinite(low)) and np.all(np.isfinite(high))
            self.action_mid = Tensor((high + low) / 2 if bounded else np.zeros_like(low))
            self.action_half = Tensor((high - low) / 2 if bounded else np.ones_like(low))
        # DQN's exploration rate, overwritten by the trainer's schedule (a graph input in effect).
        self.epsilon = Parameter(Tensor(0.0, ms.float32), name="epsilon", requires_grad=False)

    def _check_heads(self) -> None:
        if self.masked and (self.policy_kind != PolicyKind.CATEGORICAL or self.mask_dim != self.action_dim):
            raise ValueError(f"an action mask of length {self.mask_dim} needs a categorical policy over "
                             f"as many actions; got policy '{self.policy_kind.value}' over {self.action_dim}")
        if self.policy_kind == PolicyKind.CATEGORICAL and not self.discrete:
            raise ValueError("a categorical policy needs a Discrete action space")
        if self.policy_kind in (PolicyKind.GAUSSIAN, PolicyKind.SQUASHED_GAUSSIAN) and self.discrete:
            raise ValueError("a Gaussian policy needs a Box action space")
        if self.q_kind == QKind.DISCRETE and not self.discrete:
            raise ValueError("discrete Q-values need a Discrete action space")
        if self.q_kind == QKind.CONTINUOUS and self.discrete:
            raise ValueError("Q(s, a) critics need a Box action space")
        if self.policy_kind == PolicyKind.NONE and self.q_kind != QKind.DISCRETE:
            raise ValueError("a network without a policy head acts greedily and needs discrete Q-values")

    # ----- what callers outside the graph need to know --------------------------------------

    @property
    def noise_kind(self) -> NoiseKind:
        if self.policy_kind == PolicyKind.NONE:
            return NoiseKind.EPSILON_GREEDY
        return NoiseKind.GUMBEL if self.policy_kind == PolicyKind.CATEGORICAL else NoiseKind.NORMAL

    @property
    def value_kind(self) -> str:
        """What the `value` output of `act` holds (the manifest's `value`)."""
        if not self.act_value:
            return "none"
        if self.has_value:
            return "state_value"
        return {"continuous": "min_q", "discrete": "max_q"}.get(self.qkind, "none")

    @property
    def noise_dim(self) -> int:
        return self.action_dim + (1 if self.noise_kind == NoiseKind.EPSILON_GREEDY else 0)

    def set_obs_stats(self, mean: np.ndarray, var: np.ndarray) -> None:
        self.normalizer.set_stats(mean, var)

    def set_epsilon(self, epsilon: float) -> None:
        self.epsilon.set_data(Tensor(epsilon, ms.float32))

    # ----- graph pieces ------------------------------------------------------------------------

    def features(self, obs):
        """[B, *obs_shape] -> normalised, flattened [B, obs_dim] float32."""
        return self.normalizer(obs.reshape(obs.shape[0], -1).astype(ms.float32))

    def state_value(self, x):
        """x: normalised obs [B, obs_dim] -> V(s) [B]."""
        return self.vf(x).squeeze(-1)

    def q_values_of(self, x):
        """x: normalised obs -> Q(s, .) [B, n]; dueling combines V + A - mean(A)."""
        out = self.qf(x)
        if self.dueling:
            value, adv = columns(out, 0, 1), columns(out, 1, out.shape[1])
            return value + adv - adv.mean(axis=-1, keep_dims=True)
        return out

    def q_values(self, obs):
        """obs [B, ...] -> Q(s, .) [B, n] (DQN)."""
        return self.q_values_of(self.features(obs))

    def q_sa(self, obs, action):
        """obs [B, ...], action [B, d] in env units -> Q_i(s, a) for every critic, [n_critics, B]."""
        x = self.features(obs)
        a = (action - self.action_mid) / self.action_half
        xa = ops.concat((x, a), axis=-1)
        return self._critics(xa)

    def _critics(self, xa):
        values = ()
        for critic in self.critics:
            values = values + (critic(xa).squeeze(-1),)
        return ops.stack(values)

    def _squashed(self, x, noise):
        """Reparameterised tanh-Gaussian: (action in env units [B, d], logp [B], pre-tanh mean)."""
        out = self.pi(x)
        d = self.action_dim
        mean, log_std = columns(out, 0, d), columns(out, d, 2 * d)
        log_std = ops.clamp(log_std, LOG_STD_MIN, LOG_STD_MAX)
        u = mean + ops.exp(log_std) * noise
        squashed = ops.tanh(u)
        logp = (-0.5 * noise * noise - log_std - _HALF_LOG_2PI).sum(-1)
        # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)): stable for large |u|
        # (the form used by SpinningUp and CleanRL instead of log(1 - tanh^2 + eps)).
        logp = logp - (2.0 * (math.log(2.0) - u - ops.softplus(-2.0 * u))).sum(-1)
        # Rescaling to the Box adds a constant -sum(log half) to logp; omitted, as in SB3.
        return squashed * self.action_half + self.action_mid, logp

    def sample_action(self, obs, noise):
        """SAC actor: obs, standard-normal noise [B, d] -> (action in env units, logp), differentiable."""
        return self._squashed(self.features(obs), noise)

    def _categorical(self, x, obs):
        logits = self.pi(x)
        if self.masked:
            # Illegal moves get -1e9: exp() underflows to exactly 0 probability, Gumbel noise
            # (|g| < 40 in float32) cannot lift them over a legal move, and logp/entropy stay
            # finite (0 * -1e9 = 0). Legal logits are unchanged (x + 0).
            mask = columns(obs.reshape(obs.shape[0], -1), self.mask_start, self.obs_dim).astype(ms.float32)
            logits = logits + (mask - 1.0) * 1e9
        return logits, self.log_softmax(logits)

    def _value_for_act(self, x, action):
        if not self.act_value:
            return ops.zeros((x.shape[0],), ms.float32)
        if self.has_value:
            return self.state_value(x)
        if self.qkind == "continuous":
            a = (action - self.action_mid) / self.action_half
            return ops.amin(self._critics(ops.concat((x, a), axis=-1)), axis=0)
        if self.qkind == "discrete":
            return ops.amax(self.q_values_of(x), axis=-1)
        return ops.zeros((x.shape[0],), ms.float32)

    # ----- the two public graphs ---------------------------------------------------------------

    def act(self, obs, noise):
        """The acting graph: obs [B, ...] float32, noise [B, noise_dim] float32 ->
        (action [B] int32 or [B, d] float32, logp [B] float32, value [B] float32).

        Zero noise gives the deterministic action (argmax, mean, or greedy).
        """
        x = self.features(obs)
        kind = self.kind
        if kind == "categorical":
            logits, logp_all = self._categorical(x, obs)
            action = self.argmax(logits + noise)  # Gumbel-max
            logp = ops.gather_elements(logp_all, 1, action.reshape(-1, 1)).squeeze(-1)
        elif kind == "gaussian":
            mean = self.pi(x)
            action = mean + ops.exp(self.log_std) * noise
            logp = (-0.5 * noise * noise - self.log_std - _HALF_LOG_2PI).sum(-1)
        elif kind == "squashed_gaussian":
            action, logp = self._squashed(x, noise)
        else:
            q = self.q_values_of(x)
            greedy = self.argmax(q)
            random = self.argmax(columns(noise, 1, 1 + self.action_dim))
            explore = column(noise, 0) > 1.0 - self.epsilon
            action = ops.select(explore, random, greedy)
            prob = self.epsilon / self.action_dim + (1.0 - self.epsilon) * (action == greedy).astype(ms.float32)
            logp = ops.log(prob)
        return action, logp, self._value_for_act(x, action)

    def construct(self, obs, noise):
        return self.act(obs, noise)

    def evaluate(self, obs, action):
        """For the losses: obs [B, ...], action [B] int32 or [B, d] float32 ->
        (logp [B], entropy [B], value [B]) under the current parameters."""
        logp, entropy = self.policy_logp_entropy(obs, action)
        value = self.state_value(self.features(obs)) if self.has_value else ops.zeros_like(logp)
        return logp, entropy, value

    def policy_logp_entropy(self, obs, action):
        """The policy head alone (PPO's policy-loss graph): (logp [B], entropy [B])."""
        x = self.features(obs)
        if self.kind == "categorical":
            _, logp_all = self._categorical(x, obs)
            logp = ops.gather_elements(logp_all, 1, action.astype(ms.int32).reshape(-1, 1)).squeeze(-1)
            entropy = -(ops.exp(logp_all) * logp_all).sum(-1)
        elif self.kind == "gaussian":
            mean = self.pi(x)
            z = (action - mean) / ops.exp(self.log_std)
            logp = (-0.5 * z * z - self.log_std - _HALF_LOG_2PI).sum(-1)
            entropy = (self.log_std + 0.5 + _HALF_LOG_2PI).sum(-1) * ops.ones_like(logp)
        else:
            raise ValueError("evaluate() needs a categorical or Gaussian policy head")
        return logp, entropy


def sample_noise(kind: NoiseKind, dim: int, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Noise for `act` [batch, dim] float32, drawn on the host from a seeded generator."""
    if kind == NoiseKind.NORMAL:
        return rng.standard_normal((batch, dim), dtype=np.float32)
    if kind == NoiseKind.GUMBEL:
        return rng.gumbel(size=(batch, dim)).astype(np.float32)
    noise = rng.gumbel(size=(batch, dim)).astype(np.float32)
    noise[:, 0] = rng.random(batch, dtype=np.float32)
    return noise

"""Heads of the network module (`rlstack.network`): each reads the encoder's features and owns its
part of the acting graph, its log-probability and entropy, and the noise it samples with.

A head is its MLP (`MLPHead`, whose layers are its own children), so its parameters are named
`<attribute>.<layer>.weight` in checkpoints. A new head is a class here and an entry in
`POLICY_HEADS`; `Network` builds it by the `NetSpec`'s `policy`.

| head                        | used by | output                                   |
|-----------------------------|---------|------------------------------------------|
| `CategoricalHead`           | PPO, AlphaZero | logits [B, n], legal-move mask    |
| `GaussianHead`              | PPO     | mean [B, d], state-independent log_std   |
| `SquashedGaussianHead`      | SAC     | tanh(mean + std * noise) rescaled to Box |
| `DeterministicHead`         | TD3     | tanh(mu) + noise_std * noise, clipped, rescaled to Box |
| `ValueHead`                 | PPO, AlphaZero | V(s) [B]                          |
| `QHead`                     | DQN     | Q(s, .) [B, n] (optionally dueling), ε-greedy acting |
| `twin_critics`              | SAC, TD3 | Q_i(s, a) for n critics [n, B]          |
"""

from __future__ import annotations

import math
from enum import StrEnum

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rlstack.kernels import LogSoftmax, column, columns
from rlstack.layers import mlp_layers

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC's clamp (Haarnoja et al. reference code)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class NoiseKind(StrEnum):
    """What the `noise` input of `act` holds; zero noise is always the deterministic action."""

    GUMBEL = "gumbel"
    """Standard Gumbel [B, n]: Gumbel-max sampling from the categorical policy."""
    NORMAL = "normal"
    """Standard normal [B, d]: reparameterised Gaussian."""
    EPSILON_GREEDY = "epsilon_greedy"
    """[B, 1 + n]: column 0 uniform in [0, 1) (explore when it exceeds 1 - epsilon), then
    standard Gumbel for the uniformly random action."""
    ORNSTEIN_UHLENBECK = "ornstein_uhlenbeck"
    """[B, d]: a unit Ornstein-Uhlenbeck process per row (`rlstack.network.OUNoise`), one step per
    call, restarted at the row's episode ends; the head scales it (TD3's temporally correlated
    exploration)."""


class MLPHead(nn.Cell):
    """An MLP from the features to `out_dim` outputs: the base of every head. Its layers are its
    children `0`, `1`, ... (parameters `<attribute>.0.weight`, as a `SequentialCell`'s), and the
    other Cells a head holds are not layers."""

    def __init__(self, in_dim: int, out_dim: int, spec, out_gain: float):
        super().__init__()
        layers = mlp_layers(in_dim, tuple(spec.hidden), out_dim, spec.activation, spec.ortho_init, out_gain,
                            bool(spec.batch_invariant))
        for index, layer in enumerate(layers):
            self.insert_child_to_cell(str(index), layer)
        self.layers = tuple(layers)

    def __getitem__(self, index: int) -> nn.Cell:
        return self.layers[index]

    def forward(self, x):
        """x [B, in_dim] -> [B, out_dim]."""
        for layer in self.layers:
            x = layer(x)
        return x

    def construct(self, x):
        return self.forward(x)


class PolicyHead(MLPHead):
    """A policy: `act(x, obs, noise) -> (action, logp)` for the acting graph and, for the losses,
    `logp_entropy(x, obs, action) -> (logp, entropy)`; `noise_kind` and `noise_dim` say what `act`'s
    noise is. `x` is the encoder's features, `obs` the flat observation (for a legal-move mask)."""

    noise_kind = NoiseKind.NORMAL

    def __init__(self, in_dim: int, out_dim: int, spec, action_dim: int):
        super().__init__(in_dim, out_dim, spec, 0.01)
        self.action_dim = action_dim

    @property
    def noise_dim(self) -> int:
        return self.action_dim

    def act(self, x, obs, noise):
        raise NotImplementedError

    def logp_entropy(self, x, obs, action):
        raise ValueError(f"{type(self).__name__} gives no log-probability of a given action "
                         "(the losses need a categorical or Gaussian policy head)")


class CategoricalHead(PolicyHead):
    """Logits over `action_dim` moves; with a legal-move mask (the last `action_dim` entries of the
    flat observation, rlstack/spaces.py) illegal moves get probability 0."""

    noise_kind = NoiseKind.GUMBEL

    def __init__(self, in_dim: int, spec, action_dim: int, mask_start: int | None):
        super().__init__(in_dim, action_dim, spec, action_dim)
        self.masked = mask_start is not None
        self.mask_start = mask_start if mask_start is not None else 0
        self.log_softmax = LogSoftmax()
        # int32 indices straight from the kernel: `ops.argmax` returns int64, and a Cast is one more kernel
        self.argmax = ops.Argmax(-1, ms.int32)

    def logits(self, x, obs):
        """(logits [B, n], log-probabilities [B, n])."""
        logits = self.forward(x)
        if self.masked:
            # Illegal moves get -1e9: exp() underflows to exactly 0 probability, Gumbel noise
            # (|g| < 40 in float32) cannot lift them over a legal move, and logp/entropy stay
            # finite (0 * -1e9 = 0). Legal logits are unchanged (x + 0).
            flat = obs.reshape(obs.shape[0], -1)
            mask = columns(flat, self.mask_start, self.mask_start + self.action_dim).astype(ms.float32)
            logits = logits + (mask - 1.0) * 1e9
        return logits, self.log_softmax(logits)

    def act(self, x, obs, noise):
        logits, logp_all = self.logits(x, obs)
        action = self.argmax(logits + noise)  # Gumbel-max
        logp = ops.gather_elements(logp_all, 1, action.reshape(-1, 1)).squeeze(-1)
        return action, logp

    def logp_entropy(self, x, obs, action):
        _, logp_all = self.logits(x, obs)
        logp = ops.gather_elements(logp_all, 1, action.astype(ms.int32).reshape(-1, 1)).squeeze(-1)
        entropy = -(ops.exp(logp_all) * logp_all).sum(-1)
        return logp, entropy


class GaussianHead(PolicyHead):
    """A diagonal Gaussian with a state-independent log std (PPO's continuous policy); actions are
    not squashed (the acting module clips them to the Box)."""

    def __init__(self, in_dim: int, spec, action_dim: int):
        super().__init__(in_dim, action_dim, spec, action_dim)
        self.log_std = Parameter(Tensor(np.full(action_dim, spec.log_std_init, np.float32)), name="log_std")

    def act(self, x, obs, noise):
        action = self.forward(x) + ops.exp(self.log_std) * noise
        logp = (-0.5 * noise * noise - self.log_std - _HALF_LOG_2PI).sum(-1)
        return action, logp

    def logp_entropy(self, x, obs, action):
        z = (action - self.forward(x)) / ops.exp(self.log_std)
        logp = (-0.5 * z * z - self.log_std - _HALF_LOG_2PI).sum(-1)
        entropy = (self.log_std + 0.5 + _HALF_LOG_2PI).sum(-1) * ops.ones_like(logp)
        return logp, entropy


class SquashedGaussianHead(PolicyHead):
    """SAC's actor: state-dependent mean and log std from one MLP, a reparameterised sample squashed
    by tanh and rescaled to the Box."""

    def __init__(self, in_dim: int, spec, action_dim: int, action_mid: Tensor, action_half: Tensor):
        super().__init__(in_dim, 2 * action_dim, spec, action_dim)
        self.action_mid, self.action_half = action_mid, action_half

    def act(self, x, obs, noise):
        """(action in env units [B, d], logp [B]), differentiable (the actor loss uses it)."""
        out = self.forward(x)
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


class DeterministicHead(PolicyHead):
    """TD3's actor: the deterministic action tanh(mu(x)) in [-1, 1]. Acting adds the exploration
    noise `noise_std * noise` and clips to [-1, 1] before rescaling to the Box, as Stable-Baselines3
    adds its action noise to the scaled action; zero noise is the deterministic action. `noise_std`
    [d] is a parameter the optimizers do not train, so checkpoints and exported graphs carry it. The
    noise is standard normal, or an Ornstein-Uhlenbeck process with `noise_kind` set to it."""

    def __init__(self, in_dim: int, spec, action_dim: int, action_mid: Tensor, action_half: Tensor):
        super().__init__(in_dim, action_dim, spec, action_dim)
        self.noise_kind = NoiseKind.NORMAL
        self.action_mid, self.action_half = action_mid, action_half
        self.noise_std = Parameter(Tensor(np.zeros(action_dim, np.float32)), name="noise_std", requires_grad=False)

    def scaled(self, x):
        """The deterministic action in [-1, 1] [B, d], differentiable (the actor loss uses it)."""
        return ops.tanh(self.forward(x))

    def act(self, x, obs, noise):
        """(action in env units [B, d], zeros [B]: a deterministic policy has no log-probability)."""
        action = ops.clamp(self.scaled(x) + self.noise_std * noise, -1.0, 1.0)
        return action * self.action_half + self.action_mid, ops.zeros((x.shape[0],), ms.float32)


POLICY_HEADS = {"categorical": CategoricalHead, "gaussian": GaussianHead,
                "squashed_gaussian": SquashedGaussianHead, "deterministic": DeterministicHead}
"""`NetSpec.policy` -> its head class."""


class ValueHead(MLPHead):
    """V(s) [B]."""

    def __init__(self, in_dim: int, spec):
        super().__init__(in_dim, 1, spec, 1.0)

    def value(self, x):
        return self.forward(x).squeeze(-1)


class QHead(MLPHead):
    """Q(s, .) [B, n] over discrete actions (dueling: V + A - mean(A)); acts ε-greedily."""

    noise_kind = NoiseKind.EPSILON_GREEDY

    def __init__(self, in_dim: int, spec, action_dim: int, dueling: bool):
        super().__init__(in_dim, action_dim + (1 if dueling else 0), spec, 1.0)
        self.action_dim = action_dim
        self.dueling = dueling
        self.argmax = ops.Argmax(-1, ms.int32)

    @property
    def noise_dim(self) -> int:
        return 1 + self.action_dim

    def q_values(self, x):
        out = self.forward(x)
        if self.dueling:
            value, adv = columns(out, 0, 1), columns(out, 1, out.shape[1])
            return value + adv - adv.mean(axis=-1, keep_dims=True)
        return out

    def act(self, x, noise, epsilon):
        """(action [B] int32, logp [B]): greedy, or with probability `epsilon` the Gumbel-max of
        noise columns 1.. (a uniformly random action)."""
        greedy = self.argmax(self.q_values(x))
        random = self.argmax(columns(noise, 1, 1 + self.action_dim))
        explore = column(noise, 0) > 1.0 - epsilon
        action = ops.select(explore, random, greedy)
        prob = epsilon / self.action_dim + (1.0 - epsilon) * (action == greedy).astype(ms.float32)
        return action, ops.log(prob)


def twin_critics(in_dim: int, spec, action_dim: int, n: int) -> nn.CellList:
    """`n` independent Q(s, a) MLPs over [features, action scaled to [-1, 1]] (SAC's critics);
    `critic_values` evaluates them. (A CellList becomes a tuple inside a graph, so its evaluation
    is a function of it, not a method.)"""
    return nn.CellList([MLPHead(in_dim + action_dim, 1, spec, 1.0) for _ in range(n)])


def critic_values(critics, x, action_scaled):
    """x [B, features], action [B, d] scaled to [-1, 1] -> Q_i(s, a) of every critic [n, B]."""
    xa = ops.concat((x, action_scaled), axis=-1)
    values = ()
    for critic in critics:
        values = values + (critic.forward(xa).squeeze(-1),)
    return ops.stack(values)

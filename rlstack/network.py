"""The one network module every algorithm trains and every actor and server runs
(docs/DESIGN.md, contracts 1-2).

`Network` = an encoder (`rlstack.encoders`: the observation to a feature vector, shared by every
head) + heads (`rlstack.heads`: a policy, a state value, Q-values, twin critics), chosen by a
`NetSpec`. Each head owns its acting, its log-probability and entropy, and its noise; `Network`
composes them into the graphs:

- `act(obs, noise) -> (action, logp, value)`, the acting graph of every algorithm: randomness
  enters only through `noise`, so the graph is a pure function of its inputs, and all-zero noise
  is the deterministic action;
- `evaluate(obs, action) -> (logp, entropy, value)` and the pieces the losses use.

Observation normalisation (running mean/variance, clipped) lives inside the graph, before the
encoder, so every exported graph carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rlstack.encoders import ENCODERS, ObsNormalizer, obs_dim_of, resolve_encoder
from rlstack.heads import (
    CategoricalHead,
    DeterministicHead,
    GaussianHead,
    NoiseKind,
    PolicyHead,
    QHead,
    SquashedGaussianHead,
    ValueHead,
    critic_values,
    twin_critics,
)
from rlstack.layers import BLOCK_ROWS, mlp
from rlstack.spaces import mask_dim_of

__all__ = ["BLOCK_ROWS", "NetSpec", "Network", "NoiseKind", "OUNoise", "PolicyKind", "QKind", "copy_parameters", "mlp",
           "obs_dim_of", "sample_noise"]


class PolicyKind(StrEnum):
    NONE = "none"
    CATEGORICAL = "categorical"
    GAUSSIAN = "gaussian"
    SQUASHED_GAUSSIAN = "squashed_gaussian"
    DETERMINISTIC = "deterministic"


class QKind(StrEnum):
    NONE = "none"
    DISCRETE = "discrete"
    CONTINUOUS = "continuous"


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
    encoder: str = "auto"
    """The encoder before the heads (`rlstack.encoders.ENCODERS`); `mlp`: the flat observation;
    `auto`: chosen by the observation space (`rlstack.encoders.resolve_encoder`)."""
    conv_form: str = "auto"
    """A conv encoder's convolutions (`rlstack.conv.FORMS`): `auto` is the fast CPU form on the CPU
    and MindSpore's `nn.Conv2d` on Ascend and GPU."""
    blocks: int = 6
    """`encoder: resnet`: residual blocks of the tower (`rlstack.encoders.BoardResNet`)."""
    channels: int = 64
    """`encoder: resnet`: channels of the tower's 3x3 convolutions."""
    act_value: bool = True
    """`act` returns a value: V(s), max_a Q(s, a) or min_i Q_i(s, a). False: zeros. SAC acts
    without it: its twin critics cost most of its acting call (docs/PERFORMANCE.md#sac-acting)
    and no consumer of an off-policy rollout reads it. The manifest's `value` says which it is."""

    @classmethod
    def of(cls, net: Any, **heads: Any) -> NetSpec:
        """The `net:` config section's settings (`rlstack.config.NetConfig`) plus an algorithm's heads."""
        return cls(hidden=tuple(net.hidden), activation=net.activation, normalize_obs=net.normalize_obs,
                   obs_clip=net.obs_clip, log_std_init=net.log_std_init, ortho_init=net.ortho_init,
                   encoder=net.encoder, conv_form=net.conv_form, blocks=net.blocks, channels=net.channels, **heads)


def copy_parameters(source: nn.Cell, destination: nn.Cell) -> None:
    """Copy every parameter value of `source` into `destination` (same architecture): target networks."""
    for src, dst in zip(source.get_parameters(), destination.get_parameters(), strict=True):
        dst.set_data(Tensor(src.asnumpy()))


class Network(nn.Cell):
    """The one network module: an encoder and the heads its `NetSpec` names. Calling it runs `act`
    (the graph that is exported). Heads are attributes by role, so checkpoints name their
    parameters `pi.*` (policy), `vf.*` (state value), `qf.*` (Q-values) and `critics.*`."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, spec: NetSpec):
        super().__init__()
        self.spec = spec
        self.obs_dim = obs_dim_of(obs_space)
        self.obs_shape = tuple(int(d) for d in obs_space.shape) if obs_space.shape else (self.obs_dim,)
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
        self.encoder_name = resolve_encoder(spec.encoder, obs_space)
        self._check_heads()
        # Plain constants for the graph compiler to branch on (it folds them at compile time).
        self.kind = self.policy_kind.value
        self.qkind = self.q_kind.value
        self.has_policy = self.policy_kind != PolicyKind.NONE
        self.has_value = bool(spec.value)
        self.act_value = bool(spec.act_value)
        if not self.discrete:
            low = np.asarray(action_space.low, np.float32).reshape(-1)
            high = np.asarray(action_space.high, np.float32).reshape(-1)
            bounded = np.all(np.isfinite(low)) and np.all(np.isfinite(high))
            self.action_mid = Tensor((high + low) / 2 if bounded else np.zeros_like(low))
            self.action_half = Tensor((high - low) / 2 if bounded else np.ones_like(low))

        self.normalizer = ObsNormalizer(self.obs_dim, spec.obs_clip, spec.normalize_obs)
        self.encoder = ENCODERS[self.encoder_name](obs_space, spec)
        # Frames enter the encoder as the env gives them (it scales them); flat observations
        # after their statistics. A constant the graph compiler folds.
        self.frames = bool(self.encoder.frames)
        features = self.encoder.out_dim
        # (built in this order: the layers' initial values are drawn in it)
        if self.policy_kind == PolicyKind.CATEGORICAL:
            self.pi = CategoricalHead(features, spec, self.action_dim, self.mask_start if self.masked else None)
        elif self.policy_kind == PolicyKind.GAUSSIAN:
            self.pi = GaussianHead(features, spec, self.action_dim)
        elif self.policy_kind == PolicyKind.SQUASHED_GAUSSIAN:
            self.pi = SquashedGaussianHead(features, spec, self.action_dim, self.action_mid, self.action_half)
        elif self.policy_kind == PolicyKind.DETERMINISTIC:
            self.pi = DeterministicHead(features, spec, self.action_dim, self.action_mid, self.action_half)
        if spec.value:
            self.vf = ValueHead(features, spec)
        if self.q_kind == QKind.DISCRETE:
            self.qf = QHead(features, spec, self.action_dim, bool(spec.dueling))
        elif self.q_kind == QKind.CONTINUOUS:
            self.critics = twin_critics(features, spec, self.action_dim, spec.n_critics)
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
        if self.policy_kind == PolicyKind.DETERMINISTIC and self.discrete:
            raise ValueError("a deterministic policy needs a Box action space")
        if self.q_kind == QKind.DISCRETE and not self.discrete:
            raise ValueError("discrete Q-values need a Discrete action space")
        if self.q_kind == QKind.CONTINUOUS and self.discrete:
            raise ValueError("Q(s, a) critics need a Box action space")
        if self.policy_kind == PolicyKind.NONE and self.q_kind != QKind.DISCRETE:
            raise ValueError("a network without a policy head acts greedily and needs discrete Q-values")
        if self.encoder_name not in ENCODERS:
            raise ValueError(f"unknown encoder '{self.encoder_name}'; valid: auto, {', '.join(ENCODERS)}")
        if self.spec.normalize_obs and ENCODERS[self.encoder_name].frames:
            raise ValueError(f"net.normalize_obs normalises flat observations; encoder '{self.encoder_name}' "
                             "scales its frames itself (set net.normalize_obs: false)")

    # ----- what callers outside the graph need to know --------------------------------------

    @property
    def acting_head(self) -> PolicyHead | QHead:
        """The head `act` samples actions from: the policy, or the Q-values (ε-greedy)."""
        return self.pi if self.has_policy else self.qf

    @property
    def noise_kind(self) -> NoiseKind:
        return self.acting_head.noise_kind

    @property
    def noise_dim(self) -> int:
        return self.acting_head.noise_dim

    @property
    def value_kind(self) -> str:
        """What the `value` output of `act` holds (the manifest's `value`)."""
        if not self.act_value:
            return "none"
        if self.has_value:
            return "state_value"
        return {"continuous": "min_q", "discrete": "max_q"}.get(self.qkind, "none")

    @property
    def has_priors(self) -> bool:
        """A masked categorical policy with V(s) (the games' networks): `PriorsGraph` is exported
        beside the acting graph."""
        return self.masked and self.has_policy and self.has_value and self.policy_kind == PolicyKind.CATEGORICAL

    def encoder_params(self) -> list[Parameter]:
        """The encoder's trainable parameters: shared by every head, so every loss reaches them."""
        return list(self.encoder.trainable_params())

    def set_obs_stats(self, mean: np.ndarray, var: np.ndarray) -> None:
        self.normalizer.set_stats(mean, var)

    def set_epsilon(self, epsilon: float) -> None:
        self.epsilon.set_data(Tensor(epsilon, ms.float32))

    # ----- graph pieces ------------------------------------------------------------------------

    def features(self, obs):
        """[B, *obs_shape] -> the encoder's features [B, encoder.out_dim] float32 (frames as they
        are, flat observations after their statistics)."""
        if self.frames:  # (as the env gives them, or flat)
            return self.encoder(obs.reshape(obs.shape[0], *self.obs_shape))
        return self.encoder(self.normalizer(obs.reshape(obs.shape[0], -1).astype(ms.float32)))

    def state_value(self, x):
        """x: features [B, ...] -> V(s) [B]."""
        return self.vf.value(x)

    def q_values_of(self, x):
        """x: features -> Q(s, .) [B, n]."""
        return self.qf.q_values(x)

    def q_values(self, obs):
        """obs [B, ...] -> Q(s, .) [B, n] (DQN)."""
        return self.qf.q_values(self.features(obs))

    def q_sa(self, obs, action):
        """obs [B, ...], action [B, d] in env units -> Q_i(s, a) for every critic, [n_critics, B]."""
        return self._q_sa(self.features(obs), action)

    def _q_sa(self, x, action):
        return critic_values(self.critics, x, (action - self.action_mid) / self.action_half)

    def sample_action(self, obs, noise):
        """SAC actor: obs, standard-normal noise [B, d] -> (action in env units, logp), differentiable."""
        return self.pi.act(self.features(obs), obs, noise)

    def policy_action(self, obs):
        """TD3's actor: obs -> the deterministic action scaled to [-1, 1] [B, d], differentiable."""
        return self.pi.scaled(self.features(obs))

    def q_scaled(self, obs, action_scaled):
        """obs [B, ...], action [B, d] scaled to [-1, 1] -> Q_i(s, a) for every critic, [n_critics, B]."""
        return critic_values(self.critics, self.features(obs), action_scaled)

    def _value_for_act(self, x, action):
        if not self.act_value:
            return ops.zeros((x.shape[0],), ms.float32)
        if self.has_value:
            return self.vf.value(x)
        if self.qkind == "continuous":
            return ops.amin(self._q_sa(x, action), axis=0)
        if self.qkind == "discrete":
            return ops.amax(self.qf.q_values(x), axis=-1)
        return ops.zeros((x.shape[0],), ms.float32)

    # ----- the two public graphs ---------------------------------------------------------------

    def act(self, obs, noise):
        """The acting graph: obs [B, ...] float32 (uint8 frames for a conv encoder), noise [B, noise_dim] float32 ->
        (action [B] int32 or [B, d] float32, logp [B] float32, value [B] float32).

        Zero noise gives the deterministic action (argmax, mean, or greedy).
        """
        x = self.features(obs)
        if self.has_policy:
            action, logp = self.pi.act(x, obs, noise)
        else:
            action, logp = self.qf.act(x, noise, self.epsilon)
        return action, logp, self._value_for_act(x, action)

    def construct(self, obs, noise):
        return self.act(obs, noise)

    def evaluate(self, obs, action):
        """For the losses: obs [B, ...], action [B] int32 or [B, d] float32 ->
        (logp [B], entropy [B], value [B]) under the current parameters."""
        logp, entropy = self.policy_logp_entropy(obs, action)
        value = self.vf.value(self.features(obs)) if self.has_value else ops.zeros_like(logp)
        return logp, entropy, value

    def policy_logp_entropy(self, obs, action):
        """The policy head alone (PPO's policy-loss graph): (logp [B], entropy [B])."""
        return self.pi.logp_entropy(self.features(obs), obs, action)


class PriorsGraph(nn.Cell):
    """The priors entry point of a game's network: obs [B, D] -> (log-probabilities of every move
    [B, n], -1e9-masked as in acting (0 probability for an illegal move), V(s) [B]): one row per
    position where the acting graph needs one row per move (the search, rlstack/search.py).

    It computes the same kernels as the acting graph up to the log-softmax, on the same parameters:
    `auto_prefix=False` keeps their names (a prefixed name would also rename the live network's)."""

    def __init__(self, network: Network):
        super().__init__(auto_prefix=False)
        self.network = network

    def construct(self, obs):
        x = self.network.features(obs)
        _, logp_all = self.network.pi.logits(x, obs)
        return logp_all, self.network.state_value(x)


class OUNoise:
    """A unit Ornstein-Uhlenbeck process per row, as Stable-Baselines3's
    `OrnsteinUhlenbeckActionNoise` with sigma 1 (the acting graph multiplies by its std):
    x <- x - theta * x * dt + sqrt(dt) * N(0, 1), from 0, in float64; a row restarts at 0 when its
    episode ends."""

    THETA, DT = 0.15, 1e-2

    def __init__(self):
        self.state: np.ndarray | None = None

    def __call__(self, batch: int, dim: int, rng: np.random.Generator) -> np.ndarray:
        if self.state is None or self.state.shape != (batch, dim):
            self.state = np.zeros((batch, dim))
        self.state = self.state - self.THETA * self.state * self.DT + np.sqrt(self.DT) * rng.standard_normal(
            (batch, dim))
        return self.state.astype(np.float32)

    def restart(self, rows: np.ndarray) -> None:
        """Rows (a boolean mask or indices) whose episode ended start again from 0."""
        if self.state is not None:
            self.state[rows] = 0.0


def sample_noise(kind: NoiseKind, dim: int, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Noise for `act` [batch, dim] float32, drawn on the host from a seeded generator."""
    if kind == NoiseKind.NORMAL:
        return rng.standard_normal((batch, dim), dtype=np.float32)
    if kind == NoiseKind.GUMBEL:
        return rng.gumbel(size=(batch, dim)).astype(np.float32)
    noise = rng.gumbel(size=(batch, dim)).astype(np.float32)
    noise[:, 0] = rng.random(batch, dtype=np.float32)
    return noise

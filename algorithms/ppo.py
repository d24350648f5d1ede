"""Proximal Policy Optimization (Schulman et al. 2017, https://arxiv.org/abs/1707.06347).

Follows Stable-Baselines3's PPO (and CleanRL's `ppo.py`) rather than the paper where they differ:
- advantages normalised per minibatch; value loss is plain MSE (no 0.5), optionally clipped
  around the old value as in OpenAI baselines;
- global gradient-norm clipping and Adam with eps=1e-5;
- learning rate and clip range may be linear schedules (`lin_1e-3`, RL Baselines3 Zoo);
- a truncated episode is bootstrapped with V(final_obs) (the trainer folds it into the reward);
- for an MLP, one minibatch step is two compiled graph calls (`PPOStep`), each under
  MindSpore's 100-kernel single-thread limit: the policy loss's gradient, then the value loss's
  gradient with global-norm clipping and Adam over both (one graph for the whole step would be
  over the line: docs/PERFORMANCE.md#the-100-kernel-line). An encoder with parameters (a conv
  encoder) is shared by both heads and trained by both losses, as SB3's `CnnPolicy` trains its
  features extractor: its step is one graph, so the encoder runs forward and backward once.
  Minibatch rows are gathered on the host, and the advantage terms of the clipped surrogate,
  which do not depend on the parameters, are computed there (`surrogate_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rlstack import registry
from rlstack.buffers import RolloutBatch, pack_columns, rollout_batch
from rlstack.collector import RewardScaler, Trajectory
from rlstack.config import Config, ConfigError, TrainConfig, mlp_params
from rlstack.distributed import GradMean
from rlstack.graphcall import LeanCall, ParameterWrite, host_tensors, to_numpy, written_by
from rlstack.kernels import column, columns, rows
from rlstack.network import NetSpec, Network, PolicyKind
from rlstack.optim import clip_coef, flatten, unflatten
from rlstack.registry import Progress
from rlstack.schedules import parse_schedule

REWARD_SCALER_FILE = "reward_scaler.json"
"""The checkpoint file of `RewardScaler`'s statistics (`train.normalize_reward`)."""


@dataclass
class PPOConfig(TrainConfig):
    n_steps: int = 2048
    """Steps per env per rollout (rollout size = n_steps * env.n_envs)."""
    batch_size: int = 64
    """Minibatch size; must divide the rollout size."""
    n_epochs: int = 10
    """Passes over each rollout."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (bias/variance trade-off of the advantage)."""
    lr: str = "3e-4"
    """Adam learning rate: a number, or `lin_X` for a linear decay from X to 0."""
    clip_range: str = "0.2"
    """Surrogate clipping epsilon: a number or `lin_X`."""
    clip_range_vf: float | None = None
    """Clip the value prediction to old_value +- this (None: no value clipping)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clipping threshold."""
    normalize_advantage: bool = True
    """Normalise advantages to zero mean and unit std within each minibatch."""
    normalize_reward: bool = False
    """Scale the learner's rewards by the running std of the discounted return and clip them to
    +-`clip_reward`, as Stable-Baselines3's `VecNormalize(norm_reward=True)` (`gamma` its discount);
    the episode returns logged and evaluated stay the env's own."""
    clip_reward: float = 10.0
    """The clip of scaled rewards (`normalize_reward`)."""
    is_clip: float | None = None
    """Truncated importance sampling for stale samples (`actors` >= 1): the clipped ratio is taken
    against the learner's policy at the start of the update and each sample is weighted by
    min(pi_learner / pi_behaviour, is_clip) (decoupled PPO, Hilton et al. 2022, with IMPALA's
    truncation). None: plain PPO, the ratio against the actor's recorded logp."""

    data_parallel = True  # the update all-reduces its gradients (`learner.workers` >= 2)

    def network_params(self, hidden: Sequence[int], obs_dim: int, action_dim: int) -> tuple[int, int]:
        """A policy and a value MLP, a Gaussian's log_std; no target."""
        return mlp_params(obs_dim, hidden, action_dim) + mlp_params(obs_dim, hidden, 1) + action_dim, 0

    def validate(self, cfg: Config) -> None:
        rollout = self.n_steps * cfg.env.n_envs
        if self.batch_size < 2 or rollout % self.batch_size:
            raise ConfigError(f"'train.batch_size' ({self.batch_size}) must be >= 2 and divide the rollout "
                              f"size train.n_steps * env.n_envs = {rollout}")
        for key in ("lr", "clip_range"):
            try:
                parse_schedule(getattr(self, key), f"train.{key}")
            except ValueError as err:
                raise ConfigError(str(err)) from None
        if self.clip_reward <= 0:
            raise ConfigError(f"'train.clip_reward' must be > 0, got {self.clip_reward}")
        if self.is_clip is not None and self.is_clip <= 0:
            raise ConfigError(f"'train.is_clip' must be > 0 (or null for no correction), got {self.is_clip}")


def surrogate_inputs(adv: np.ndarray, is_weight: np.ndarray, clip_range: float,
                     normalize: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minibatch advantages [..., B] -> (weight, sign, bound) [..., B] float32, the host's part of
    the clipped surrogate (they do not depend on the parameters, so the graph need not compute
    them; every minibatch of an update is done in one pass).

    SB3's min(A r, A clip(r, 1 - eps, 1 + eps)) is A min(r, 1 + eps) for A >= 0 and
    A max(r, 1 - eps) for A < 0, that is |A| min(s r, b) with s = sign(A) (+1 at 0) and
    b = s (1 + s eps): the graph computes `weight * min(sign * ratio, bound)` with
    weight = |A| * is_weight. A is normalised per minibatch (the last axis; unbiased std, as
    torch.std in SB3) when `normalize`.
    """
    adv = adv.astype(np.float64)
    if normalize:
        centred = adv - adv.mean(-1, keepdims=True)
        std = np.sqrt((centred * centred).sum(-1, keepdims=True) / (adv.shape[-1] - 1))
        adv = centred / (std + 1e-8)
    sign = np.where(adv >= 0, 1.0, -1.0)
    weight = np.abs(adv) * is_weight
    bound = sign * (1.0 + sign * clip_range)
    return weight.astype(np.float32), sign.astype(np.float32), bound.astype(np.float32)


class PolicyLoss(nn.Cell):
    """Clipped surrogate minus the entropy bonus of one minibatch [B] (advantage terms from
    `surrogate_inputs`); returns (loss, [policy_loss, entropy, approx_kl, clip_fraction,
    max |ratio - 1|])."""

    def __init__(self, network: Network, cfg: PPOConfig):
        super().__init__()
        self.network = network
        self.ent_coef = cfg.ent_coef

    def construct(self, obs, action, old_logp, weight, sign, bound, clip_range):
        return self.of_features(self.network.features(obs), obs, action, old_logp, weight, sign, bound, clip_range)

    def of_features(self, x, obs, action, old_logp, weight, sign, bound, clip_range):
        """The same from the encoder's features `x` of `obs`."""
        logp, entropy = self.network.pi.logp_entropy(x, obs, action)  # [B] each
        log_ratio = logp - old_logp
        ratio = ops.exp(log_ratio)
        policy_loss = -(weight * ops.minimum(sign * ratio, bound)).mean()
        entropy_mean = entropy.mean()
        # ent_coef 0 (the default): the entropy is reported but has no gradient kernels
        loss = policy_loss - self.ent_coef * entropy_mean if self.ent_coef else policy_loss
        # Schulman's low-variance KL estimator, as SB3 logs it.
        deviation = ratio - 1.0
        approx_kl = (deviation - log_ratio).mean()
        deviation = ops.abs(deviation)
        clip_fraction = (deviation > clip_range).astype(ms.float32).mean()
        # Parity: on the first minibatch of an update this is 0 exactly when the learner
        # recomputes the actor's logp bit for bit (`parity: strict`, fresh weights).
        return loss, ops.stack((policy_loss, entropy_mean, approx_kl, clip_fraction, deviation.max()))


class ValueLoss(nn.Cell):
    """vf_coef * MSE(ret, V(s)) of one minibatch, V optionally clipped around the old value;
    returns (loss, the unweighted MSE)."""

    def __init__(self, network: Network, cfg: PPOConfig):
        super().__init__()
        self.network = network
        self.vf_coef = cfg.vf_coef
        self.clip_vf = cfg.clip_range_vf is not None
        self.clip_range_vf = cfg.clip_range_vf if cfg.clip_range_vf is not None else 0.0

    def construct(self, obs, ret, old_value):
        return self.of_features(self.network.features(obs), ret, old_value)

    def of_features(self, x, ret, old_value):
        """The same from the encoder's features `x`."""
        value = self.network.state_value(x)  # [B]
        if self.clip_vf:
            value = old_value + ops.clamp(value - old_value, -self.clip_range_vf, self.clip_range_vf)
        error = ret - value
        value_loss = (error * error).mean()
        return self.vf_coef * value_loss, value_loss


class PPOLoss(nn.Cell):
    """The whole PPO loss of one minibatch (the sum the update's graphs differentiate in two
    parts); returns (loss, [policy_loss, value_loss, entropy, approx_kl, clip_fraction, ratio_dev])."""

    def __init__(self, network: Network, cfg: PPOConfig):
        super().__init__()
        self.policy = PolicyLoss(network, cfg)
        self.value = ValueLoss(network, cfg)

    def parts(self, obs, action, old_logp, weight, sign, bound, clip_range, ret, old_value):
        """(policy part of the loss, its info, value part of the loss, mse), the encoder's features
        computed once for both heads."""
        x = self.policy.network.features(obs)
        policy_loss, info = self.policy.of_features(x, obs, action, old_logp, weight, sign, bound, clip_range)
        value_loss, mse = self.value.of_features(x, ret, old_value)
        return policy_loss, info, value_loss, mse

    def construct(self, obs, action, old_logp, weight, sign, bound, clip_range, ret, old_value):
        policy_loss, info, value_loss, mse = self.parts(obs, action, old_logp, weight, sign, bound, clip_range,
                                                        ret, old_value)
        return policy_loss + value_loss, ops.concat((info[:1], mse.reshape(1), info[1:]))


class Columns:
    """Where each minibatch column sits in the packed float32 array [B, width] that the step graphs
    take (`pack`, with `rlstack.buffers.pack_columns`): obs (flattened), action (an index for a
    categorical policy), old_logp, weight, sign, bound, ret, old_value: one input instead of eight."""

    def __init__(self, obs_dim: int, action_dim: int):
        self.obs = (0, obs_dim)
        self.action = (obs_dim, obs_dim + action_dim)
        first = obs_dim + action_dim
        self.old_logp, self.weight, self.sign, self.bound, self.ret, self.value = range(first, first + 6)

    @staticmethod
    def pack(obs: np.ndarray, action: np.ndarray, old_logp: np.ndarray, weight: np.ndarray, sign: np.ndarray,
             bound: np.ndarray, ret: np.ndarray, value: np.ndarray) -> np.ndarray:
        """Columns [..., B, ...] of any number of minibatches -> float32 [..., B, width]."""
        return pack_columns(weight.shape, obs, action, old_logp, weight, sign, bound, ret, value)


class PolicyGrad(nn.Cell):
    """A packed minibatch (`Columns`) -> one flat vector: the policy loss's gradients with respect
    to the policy head's parameters (`rlstack.optim.flatten`), then [loss, policy_loss, entropy,
    approx_kl, clip_fraction, ratio_dev]. One input, one output: a graph without side effects.
    The clip range is a parameter the host sets once per update."""

    def __init__(self, network: Network, cfg: PPOConfig, params: list, columns: Columns):
        super().__init__()
        self.grad = ops.value_and_grad(PolicyLoss(network, cfg), None, ms.ParameterTuple(params), has_aux=True)
        # (plain ints: the graph compiler folds them)
        self.obs, self.action, self.old_logp = columns.obs, columns.action, columns.old_logp
        self.weight, self.sign, self.bound = columns.weight, columns.sign, columns.bound
        self.clip_range = Parameter(Tensor(0.2, ms.float32), name="clip_range", requires_grad=False)

    def construct(self, batch):
        (loss, info), grads = self.grad(columns(batch, *self.obs), columns(batch, *self.action),
                                        column(batch, self.old_logp), column(batch, self.weight),
                                        column(batch, self.sign), column(batch, self.bound), self.clip_range)
        return ops.concat((flatten(grads), loss.reshape(1), info))


class ValueGradAndStep(nn.Cell):
    """A packed minibatch and `PolicyGrad`'s vector -> the value loss's gradient (the heads share
    no parameters: `PPOStep`), global-norm
    clipping of it together with the policy gradient, one Adam step over both; returns the
    metrics [loss, policy_loss, entropy, approx_kl, clip_fraction, ratio_dev, value_loss, mse]
    as one vector (one output to read).

    `workers` >= 2 (`learner.workers`, data-parallel): both gradients, packed into one vector,
    are averaged over the ranks by one all-reduce before the clipping, so every rank clips and
    steps with the same gradient. With 1 worker the graph has no collective at all."""

    def __init__(self, network: Network, optimizer: nn.Optimizer, cfg: PPOConfig,
                 policy_params: list, value_params: list, columns: Columns, workers: int = 1):
        super().__init__()
        self.grad = ops.value_and_grad(ValueLoss(network, cfg), None, ms.ParameterTuple(value_params), has_aux=True)
        self.optimizer = optimizer
        self.max_grad_norm = cfg.max_grad_norm
        self.policy_shapes = tuple(tuple(p.shape) for p in policy_params)
        self.policy_size = sum(int(np.prod(shape)) for shape in self.policy_shapes)
        self.value_shapes = tuple(tuple(p.shape) for p in value_params)
        self.obs, self.ret, self.value = columns.obs, columns.ret, columns.value
        self.grad_mean = GradMean(workers) if workers > 1 else None

    def construct(self, batch, policy_out):
        (value_loss, mse), grads = self.grad(columns(batch, *self.obs), column(batch, self.ret),
                                             column(batch, self.value))
        policy_grad = rows(policy_out, 0, self.policy_size)
        value_grads = grads
        if self.grad_mean is not None:  # (a constant: the 1-worker graph is compiled without this)
            both = self.grad_mean(ops.concat((policy_grad, flatten(value_grads))))
            policy_grad = rows(both, 0, self.policy_size)
            value_grads = unflatten(rows(both, self.policy_size, both.shape[0]), self.value_shapes)
        coef = clip_coef((policy_grad, flatten(value_grads)), self.max_grad_norm)
        policy_grads = unflatten(policy_grad * coef, self.policy_shapes)
        self.optimizer(policy_grads + tuple(g * coef for g in value_grads))
        return ops.concat((rows(policy_out, self.policy_size, policy_out.shape[0]), ops.stack((value_loss, mse))))


class WholeLoss(PPOLoss):
    """`PPOLoss` with the step's metrics as its second output: (loss, [policy part of the loss,
    policy_loss, entropy, approx_kl, clip_fraction, ratio_dev, value part of the loss, mse]), the
    two-graph step's order."""

    def construct(self, obs, action, old_logp, weight, sign, bound, clip_range, ret, old_value):
        policy_loss, info, value_loss, mse = self.parts(obs, action, old_logp, weight, sign, bound, clip_range,
                                                        ret, old_value)
        return policy_loss + value_loss, ops.concat((policy_loss.reshape(1), info, ops.stack((value_loss, mse))))


class WholeGradAndStep(nn.Cell):
    """A packed minibatch -> the whole loss's gradient (the encoder's forward and backward pass
    once, for both heads), global-norm clipping, one Adam step; returns `ValueGradAndStep`'s
    metrics. One graph over the 100-kernel line: for an encoder with parameters (a conv encoder),
    whose arithmetic outweighs the runtime's per-kernel cost, where two graphs would run it twice
    (docs/PERFORMANCE.md#pixels). The observations come as their own input in their own dtype
    (uint8 frames: a quarter of float32's bytes, and no conversion on the host), the other columns
    packed (`Columns` with no obs). `workers` as `ValueGradAndStep`."""

    def __init__(self, network: Network, optimizer: nn.Optimizer, cfg: PPOConfig, params: list,
                 columns: Columns, workers: int = 1):
        super().__init__()
        self.grad = ops.value_and_grad(WholeLoss(network, cfg), None, ms.ParameterTuple(params), has_aux=True)
        self.optimizer = optimizer
        self.max_grad_norm = cfg.max_grad_norm
        self.shapes = tuple(tuple(p.shape) for p in params)
        self.action, self.old_logp = columns.action, columns.old_logp
        self.weight, self.sign, self.bound = columns.weight, columns.sign, columns.bound
        self.ret, self.value = columns.ret, columns.value
        self.clip_range = Parameter(Tensor(0.2, ms.float32), name="clip_range", requires_grad=False)
        self.grad_mean = GradMean(workers) if workers > 1 else None

    def construct(self, batch, obs):
        (_, metrics), grads = self.grad(obs, columns(batch, *self.action),
                                        column(batch, self.old_logp), column(batch, self.weight),
                                        column(batch, self.sign), column(batch, self.bound), self.clip_range,
                                        column(batch, self.ret), column(batch, self.value))
        flat = flatten(grads)
        if self.grad_mean is not None:  # (a constant: the 1-worker graph is compiled without this)
            flat = self.grad_mean(flat)
        self.optimizer(unflatten(flat * clip_coef((flat,), self.max_grad_norm), self.shapes))
        return metrics


class PPOStep(nn.Cell):
    """One minibatch step. Without encoder parameters, two graph calls, each under 100 kernels:
    the policy gradient, then the value gradient with clipping and Adam. With them (a conv
    encoder shared by both heads), one call (`WholeGradAndStep`). A Cell for the checkpoint
    (network and optimizer state); called on the host, not compiled as a whole. The calls are
    lean (`rlstack.graphcall.LeanCall`); the one that steps names the state it writes."""

    def __init__(self, network: Network, optimizer: nn.Optimizer, cfg: PPOConfig,
                 policy_params: list, value_params: list, columns: Columns, workers: int = 1,
                 shared_params: tuple = ()):
        super().__init__()
        self.network = network
        self.optimizer = optimizer
        # (held by the LeanCalls, not as Cell attributes: the clip range is no checkpoint state)
        self.whole = bool(shared_params)
        if self.whole:
            step = WholeGradAndStep(network, optimizer, cfg, policy_params + value_params, columns, workers)
            self.policy_grad, clip_range = None, step.clip_range
        else:
            self.policy_grad = LeanCall(PolicyGrad(network, cfg, policy_params, columns))
            step = ValueGradAndStep(network, optimizer, cfg, policy_params, value_params, columns, workers)
            clip_range = self.policy_grad.cell.clip_range
        self.value_step = LeanCall(step, state=written_by(step))
        self._schedule = ParameterWrite([optimizer.learning_rate, clip_range])

    def set_schedule(self, lr: float, clip_range: float) -> None:
        """The update's learning rate and clip range (written in place: `ParameterWrite`)."""
        self._schedule(lr, clip_range)

    def inputs(self, obs: np.ndarray, *rest: np.ndarray) -> list[tuple[Tensor, ...]]:
        """Minibatches [K, B, ...] of the obs and the other columns (`Columns.pack`'s, after obs) ->
        each one's `step` inputs: with one graph (`whole`) the packed columns without obs and the
        obs apart in their own dtype (uint8 frames: no float32 copy on the host), else all packed."""
        if not self.whole:
            return [host_tensors(minibatch) for minibatch in Columns.pack(obs, *rest)]
        packed = Columns.pack(np.zeros((*obs.shape[:2], 0), np.float32), *rest)
        return [host_tensors(minibatch, o) for minibatch, o in zip(packed, obs, strict=True)]

    def step(self, batch: Tensor, obs: Tensor | None = None) -> Tensor:
        """A packed minibatch [B, width] (`Columns.pack`) -> its metrics as a Tensor, after the Adam
        step (`metrics` turns them into numbers: read once per update, not per step). With one
        graph (`whole`), `obs` [B, ...] comes apart in its own dtype and `batch` has no obs columns."""
        if self.whole:
            return self.value_step(batch, obs)
        return self.value_step(batch, self.policy_grad(batch))

    @staticmethod
    def metrics(out: Tensor) -> np.ndarray:
        """`step`'s Tensor -> [loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction, ratio_dev]."""
        loss, policy_loss, entropy, approx_kl, clip_fraction, ratio_dev, value_loss, mse = to_numpy(out)
        return np.array([loss + value_loss, policy_loss, mse, entropy, approx_kl, clip_fraction, ratio_dev])


class LearnerLogp(nn.Cell):
    """log pi(action | obs) under the current parameters, for `train.is_clip` (one graph call).

    A Cell on purpose: `ms.jit(network.evaluate)` keeps the parameter values it was compiled
    with on MindSpore 2.10 (neither optimizer steps nor `set_data` reach it; measured).
    """

    def __init__(self, network: Network):
        super().__init__()
        self.network = network

    def construct(self, obs, action):
        return self.network.evaluate(obs, action)[0]


class PPO(registry.Algorithm):
    """PPO on the shared network module: categorical or Gaussian policy plus a value head."""

    data_path = registry.DataPath.ROLLOUT

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space):
        self.cfg: PPOConfig = cfg.train
        discrete = isinstance(action_space, gym.spaces.Discrete)
        self.network = Network(obs_space, action_space, NetSpec.of(
            cfg.net, policy=PolicyKind.CATEGORICAL if discrete else PolicyKind.GAUSSIAN, value=True,
            batch_invariant=cfg.parity == "strict"))
        self.lr = parse_schedule(self.cfg.lr, "train.lr")
        self.clip_range = parse_schedule(self.cfg.clip_range, "train.clip_range")
        # The encoder's parameters (shared by both heads: trained by both losses), the policy
        # head's (with a Gaussian's log_std), then the value head's: the order of the gradients
        # the step graphs hand to Adam.
        shared_params = self.network.encoder_params()
        value_params = self.network.vf.trainable_params()
        policy_params = shared_params + self.network.pi.trainable_params()
        self.optimizer = nn.Adam(policy_params + value_params, learning_rate=Tensor(self.lr(1.0), ms.float32),
                                 eps=1e-5)
        self.chunk_steps = self.cfg.n_steps
        self.rollout_size = self.cfg.n_steps * cfg.env.n_envs
        self.n_minibatches = self.rollout_size // self.cfg.batch_size
        action_dim = 1 if discrete else int(np.prod(action_space.shape))
        # (one step graph with encoder parameters: the obs then go to it apart, `WholeGradAndStep`)
        self.columns = Columns(0 if shared_params else self.network.obs_dim, action_dim)
        self.update = PPOStep(self.network, self.optimizer, self.cfg, policy_params, value_params, self.columns,
                              cfg.learner.workers, tuple(shared_params))
        self.learner_logp = LearnerLogp(self.network) if self.cfg.is_clip is not None else None
        self.reward_scaler = RewardScaler(self.cfg.gamma, self.cfg.clip_reward) if self.cfg.normalize_reward else None

    def state_cell(self) -> nn.Cell:
        """Everything a checkpoint must hold: network and optimizer state."""
        return self.update

    def checkpoint_extras(self) -> dict[str, Any]:
        """The reward scaler's statistics (`normalize_reward`)."""
        return {REWARD_SCALER_FILE: self.reward_scaler} if self.reward_scaler is not None else {}

    def learn(self, rollout: Trajectory, progress: Progress, rng: np.random.Generator) -> dict[str, float]:
        """One PPO update from one rollout (a collector chunk of `n_steps` vector steps); returns
        `train/...` metrics."""
        if self.reward_scaler is not None:
            rollout = self.reward_scaler(rollout)
        return self.learn_batch(rollout_batch(rollout, self.cfg.gamma, self.cfg.gae_lambda), progress.remaining, rng)

    def learn_batch(self, batch: RolloutBatch, progress_remaining: float, rng: np.random.Generator) -> dict[str, float]:
        """The update on a rollout already flattened with its advantages (`rlstack.buffers.rollout_batch`)."""
        lr, clip = self.lr(progress_remaining), self.clip_range(progress_remaining)
        self.update.set_schedule(lr, clip)
        index = np.concatenate([rng.permutation(self.rollout_size).reshape(self.n_minibatches, -1)
                                for _ in range(self.cfg.n_epochs)]).astype(np.int32)
        old_logp, is_weight, is_metrics = batch.logp, np.ones_like(batch.logp), {}
        if self.learner_logp is not None:
            # Decoupled PPO: clip against the learner's policy now, correct for the actor's
            # (possibly older) behaviour policy with a truncated importance weight.
            old_logp = self.learner_logp(Tensor(batch.obs), Tensor(batch.action)).asnumpy()
            rho = np.exp(old_logp.astype(np.float64) - batch.logp)
            is_weight = np.minimum(rho, self.cfg.is_clip).astype(np.float32)
            is_metrics = {"train/is_weight_mean": float(is_weight.mean()),
                          "train/is_truncated_fraction": float((rho > self.cfg.is_clip).mean())}
        # Every minibatch of the update gathered and packed at once, [n_epochs * n_minibatches, B,
        # width]: each step then hands one contiguous view to its graphs.
        terms = surrogate_inputs(batch.adv[index], is_weight[index], clip, self.cfg.normalize_advantage)
        inputs = self.update.inputs(batch.obs[index], batch.action[index], old_logp[index], *terms, batch.ret[index],
                                    batch.value[index])
        outputs = [self.update.step(*minibatch) for minibatch in inputs]
        outputs = [self.update.metrics(out) for out in outputs]
        loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction, _ = (float(x) for x in np.mean(outputs, 0))
        var_ret = float(np.var(batch.ret))
        explained = float("nan") if var_ret == 0 else 1.0 - float(np.var(batch.ret - batch.value)) / var_ret
        return {
            "train/loss": loss, "train/policy_loss": policy_loss, "train/value_loss": value_loss,
            "train/entropy": entropy, "train/approx_kl": approx_kl, "train/clip_fraction": clip_fraction,
            "train/explained_variance": explained, "train/learning_rate": lr, "train/clip_range": clip,
            "parity/ppo_ratio_dev": float(outputs[0][6]), **is_metrics,
        }


registry.register("ppo", PPOConfig, PPO)

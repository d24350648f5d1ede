"""Soft Actor-Critic (Haarnoja et al. 2018, https://arxiv.org/abs/1812.05905) on the shared network module.

The version with twin Q critics, Polyak-averaged target critics, no separate V network, and
automatic entropy tuning (target entropy -|A|). Follows Stable-Baselines3's SAC:
- the actor is a tanh-squashed Gaussian with state-dependent std, log_std clamped to [-20, 2],
  actions rescaled to the Box bounds (`Network.sample_action`; the log-probability carries the
  tanh correction in its numerically stable form);
- the temperature is learned as log(alpha) with the loss -log(alpha) * (logp + target_entropy),
  and each gradient step uses alpha from *before* that step's temperature update;
- the critic loss is 0.5 * sum_i MSE(Q_i, y); the actor loss uses the critics just updated;
- random uniform actions before `learning_starts` (the trainer's off-policy loop).
Differences from SB3:
- the whole gradient step (critics, actor, temperature, target critics) is *one* compiled graph
  call (`SACUpdate`), and all `gradient_steps` of an update share that call (a graph `while`
  loop over minibatches stacked [K, B, ...] on the host); it is over the 100-kernel line and
  multi-threaded, which is faster for it than split graphs (docs/PERFORMANCE.md#sac-update-graph);
- the sampling noise of the actor is drawn on the host from the trainer's seeded generator;
- `target_update_interval` counts gradient steps over the whole run (SB3 counts within one
  `train` call, which makes intervals > 1 with gradient_steps = 1 update every step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rlstack import registry
from rlstack.actor_critic import CriticLoss, TwinCriticAlgorithm
from rlstack.config import Config, ConfigError, OffPolicyConfig, mlp_params
from rlstack.graphcall import LeanCall, host_tensors, to_numpy, written_by
from rlstack.network import Network, PolicyKind
from rlstack.registry import Progress
from rlstack.replay import Replay


@dataclass
class SACConfig(OffPolicyConfig):
    tau: float = 0.005
    """Polyak rate of the target critics."""
    target_update_interval: int = 1
    """Gradient steps between target-critic updates."""
    ent_coef: str = "auto"
    """Entropy coefficient alpha: `auto` (learned, starting at 1), `auto_X` (learned, starting at X)
    or a number (fixed)."""
    target_entropy: str = "auto"
    """Entropy target of the learned alpha: `auto` is -dim(A), or a number."""
    n_critics: int = 2
    """Number of Q critics (the minimum over them is used: clipped double-Q)."""

    def network_params(self, hidden: Sequence[int], obs_dim: int, action_dim: int) -> tuple[int, int]:
        """The actor and `n_critics` critics, log(alpha); the target is a whole network (its unused
        actor is allocated too)."""
        networks = mlp_params(obs_dim, hidden, 2 * action_dim) + self.n_critics * mlp_params(
            obs_dim + action_dim, hidden, 1)
        return networks + 1, networks

    def validate(self, cfg: Config) -> None:
        super().validate(cfg)
        if self.target_update_interval < 1:
            raise ConfigError(f"'train.target_update_interval' must be >= 1, got {self.target_update_interval}")
        try:
            parse_ent_coef(self.ent_coef)
            if self.target_entropy != "auto":
                float(self.target_entropy)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if self.n_critics < 1:
            raise ConfigError(f"'train.n_critics' must be >= 1, got {self.n_critics}")


def parse_ent_coef(value: str) -> tuple[bool, float]:
    """`auto` / `auto_X` / `X` -> (learned?, initial alpha)."""
    text = str(value).strip()
    try:
        if text == "auto":
            learned, alpha = True, 1.0
        elif text.startswith("auto_"):
            learned, alpha = True, float(text[5:])
        else:
            learned, alpha = False, float(text)
    except ValueError:
        raise ValueError(f"'train.ent_coef' is {value!r}: expected auto, auto_X or a number") from None
    if alpha <= 0:
        raise ValueError(f"'train.ent_coef' is {value!r}: alpha must be > 0")
    return learned, alpha


class ActorLoss(nn.Cell):
    """E[alpha * logp(a|s) - min_i Q_i(s, a)], a reparameterised; returns (loss, logp [B])."""

    def __init__(self, network: Network):
        super().__init__()
        self.network = network

    def construct(self, obs, noise, alpha):
        action, logp = self.network.sample_action(obs, noise)  # [B, d], [B]
        q = ops.amin(self.network.q_sa(obs, action), axis=0)  # [B]
        return (alpha * logp - q).mean(), logp


def _only(x):
    """The one entry of a [1, ...] tensor: [...]."""
    return x.reshape(x.shape[1:])


class SACUpdate(nn.Cell):
    """K complete SAC gradient steps in one graph call.

    Inputs: K minibatches stacked [K, B, ...], standard-normal noise [K, B, d] for
    the actor on obs and on next_obs, and `polyak` [K] (1.0 where a target update is due).
    Each step: target y from the target critics and the current actor -> critic Adam step ->
    actor Adam step (through the updated critics) -> temperature Adam step -> Polyak.
    Returns [critic_loss, actor_loss, alpha, alpha_loss, q_mean, logp_mean] averaged over K.
    """

    def __init__(self, network: Network, target: Network, cfg: SACConfig, lr: float, target_entropy: float):
        super().__init__()
        self.network = network
        self.target = target
        learned, alpha = parse_ent_coef(cfg.ent_coef)
        self.learn_alpha = learned
        self.log_alpha = Parameter(Tensor(math.log(alpha), ms.float32), name="log_alpha", requires_grad=learned)
        self.critic_optimizer = nn.Adam(network.critics.trainable_params(), learning_rate=Tensor(lr, ms.float32))
        self.actor_optimizer = nn.Adam(network.pi.trainable_params(), learning_rate=Tensor(lr, ms.float32))
        if learned:
            self.alpha_optimizer = nn.Adam([self.log_alpha], learning_rate=Tensor(lr, ms.float32))
        self.critic_loss = CriticLoss(network, 0.5)
        self.actor_loss = ActorLoss(network)
        self.critic_grad = ops.value_and_grad(self.critic_loss, None, self.critic_optimizer.parameters,
                                              has_aux=True)
        self.actor_grad = ops.value_and_grad(self.actor_loss, None, self.actor_optimizer.parameters,
                                             has_aux=True)
        self.critic_params = ms.ParameterTuple(network.critics.trainable_params())
        self.target_params = ms.ParameterTuple(target.critics.trainable_params())
        self.gamma, self.tau = cfg.gamma, cfg.tau
        self.target_entropy = target_entropy
        # Gradient steps done so far (for target_update_interval); a Parameter so checkpoints carry it.
        self.n_gradient_steps = Parameter(Tensor(0, ms.int64), name="n_gradient_steps", requires_grad=False)

    def construct(self, obs, action, reward, next_obs, terminated, noise, next_noise, polyak):
        n_steps = obs.shape[0]
        if n_steps == 1:
            # One step (SB3's train_freq 1 / gradient_steps 1): no graph loop, whose iteration and
            # tensor-indexed slices cost a share of the step (docs/PERFORMANCE.md#sac-update-graph);
            # the minibatch taken by reshapes, not `x[0]` (a slow `StridedSlice` kernel each:
            # docs/PERFORMANCE.md#slices).
            total = self._step(_only(obs), _only(action), _only(reward), _only(next_obs), _only(terminated),
                               _only(noise), _only(next_noise), _only(polyak))
        else:
            total = ops.zeros((6,), ms.float32)
            i = Tensor(0, ms.int32)
            while i < n_steps:  # a tensor condition: a graph loop, not unrolled at compile time
                total = total + self._step(obs[i], action[i], reward[i], next_obs[i], terminated[i], noise[i],
                                           next_noise[i], polyak[i])
                i = i + 1
        ops.assign_add(self.n_gradient_steps, Tensor(n_steps, ms.int64))
        return total / n_steps

    def _step(self, obs, action, reward, next_obs, terminated, noise, next_noise, polyak):
        """One gradient step on one minibatch; returns the six statistics of `construct`."""
        # alpha as it was before this step's temperature update (SB3 detaches it the same way)
        alpha = ops.stop_gradient(ops.exp(self.log_alpha))
        next_action, next_logp = self.network.sample_action(next_obs, next_noise)
        next_q = ops.amin(self.target.q_sa(next_obs, next_action), axis=0) - alpha * next_logp
        # only termination stops the bootstrap; time-limit truncation is bootstrapped
        y = ops.stop_gradient(reward + self.gamma * (1.0 - terminated) * next_q)  # [B]
        (critic_loss, q_mean), critic_grads = self.critic_grad(obs, action, y)
        self.critic_optimizer(critic_grads)
        (actor_loss, logp), actor_grads = self.actor_grad(obs, noise, alpha)
        self.actor_optimizer(actor_grads)
        logp = ops.stop_gradient(logp)
        alpha_loss = -(self.log_alpha * (logp + self.target_entropy)).mean()
        if self.learn_alpha:
            # d alpha_loss / d log_alpha, written out: one scalar, no second autodiff pass
            self.alpha_optimizer((-(logp + self.target_entropy).mean(),))
        mix = polyak * self.tau
        for j in range(len(self.target_params)):
            # target += mix * (critic - target), in place: three cheap kernels, not one slow CPU
            # Lerp kernel per parameter (docs/PERFORMANCE.md#polyak).
            ops.assign_add(self.target_params[j], (self.critic_params[j] - self.target_params[j]) * mix)
        return ops.stack((critic_loss, actor_loss, alpha, alpha_loss, q_mean, logp.mean()))


class SAC(TwinCriticAlgorithm):
    """SAC: squashed-Gaussian policy and twin Q critics on the shared network, plus target critics."""

    policy = PolicyKind.SQUASHED_GAUSSIAN

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space):
        super().__init__(cfg, obs_space, action_space)
        self.cfg: SACConfig
        self.target_entropy = (-float(self.action_dim) if self.cfg.target_entropy == "auto"
                               else float(self.cfg.target_entropy))
        self.update = SACUpdate(self.network, self.target, self.cfg, self.current_lr, self.target_entropy)
        # The lean call (`Cell.__call__` re-sets the compile phase of every sub-cell on each call:
        # docs/PERFORMANCE.md#sac-update-graph).
        self._update = LeanCall(self.update, state=written_by(self.update))
        self.optimizers = [self.update.critic_optimizer, self.update.actor_optimizer]
        if self.update.learn_alpha:
            self.optimizers.append(self.update.alpha_optimizer)

    @property
    def alpha(self) -> float:
        return float(np.exp(self.update.log_alpha.asnumpy()))

    def learn(self, replay: Replay, progress: Progress, rng: np.random.Generator) -> dict[str, float]:
        """`gradient_steps` SAC gradient steps on minibatches from `replay`; the target critics
        are updated every `target_update_interval` gradient steps. Returns `train/...` metrics."""
        lr = self.scheduled_lr(progress)
        k, b, d = self.cfg.gradient_steps, self.cfg.batch_size, self.action_dim
        batch = replay.sample((k, b), rng)  # [K, B, ...]
        noise = rng.standard_normal((2, k, b, d), dtype=np.float32)  # actor noise on obs, next_obs
        polyak = (self._gradient_steps + np.arange(k)) % self.cfg.target_update_interval == 0
        self._gradient_steps += k
        stats = self._update(*host_tensors(batch.obs, batch.action, batch.reward, batch.next_obs, batch.terminated,
                                           noise[0], noise[1], polyak.astype(np.float32)))
        critic_loss, actor_loss, alpha, alpha_loss, q_mean, logp_mean = (float(x) for x in to_numpy(stats))
        return {"train/critic_loss": critic_loss, "train/actor_loss": actor_loss, "train/alpha": alpha,
                "train/alpha_loss": alpha_loss, "train/q_mean": q_mean, "train/entropy": -logp_mean,
                "train/learning_rate": lr}


registry.register("sac", SACConfig, SAC)

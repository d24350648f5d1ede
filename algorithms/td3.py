"""Twin Delayed DDPG (Fujimoto et al. 2018, https://arxiv.org/abs/1802.09477) on the shared network module.

Follows Stable-Baselines3's TD3:
- a deterministic actor tanh(mu(s)) (`rlstack.heads.DeterministicHead`) and `n_critics` Q critics
  with target copies of both, Polyak-averaged with `tau`;
- clipped double-Q with target policy smoothing: the target action is
  clip(mu'(s') + clip(N(0, target_policy_noise), -target_noise_clip, target_noise_clip), -1, 1)
  and y = r + gamma * (1 - terminated) * min_i Q'_i(s', a');
- the critic loss is sum_i MSE(Q_i, y) (no factor 0.5, as SB3's TD3);
- every `policy_delay`-th gradient step (counted over the whole run, from 1) also takes an actor
  step on -mean Q_1(s, mu(s)) through the critics just updated, then updates both targets;
- exploration: Gaussian noise N(0, noise_std) (the Zoo's `noise_type: normal`) or an
  Ornstein-Uhlenbeck process of that sigma (`ornstein-uhlenbeck`, its state in the acting module)
  added to the scaled action and clipped to [-1, 1], in the acting graph (`noise_std` is a parameter of the
  actor head, so the exported graph acts as training did); random uniform actions before
  `learning_starts` (the trainer's off-policy loop).
Differences from SB3:
- each gradient step is one compiled graph call: the critic step alone, or the critic step, the
  actor step and both target updates (two graphs, chosen on the host, no control flow);
- the noise of the actor and of target smoothing is drawn on the host from the trainer's seeded
  generator;
- by default the layers start as every rlstack network's do (`net.ortho_init`: orthogonal, the
  actor's last layer with gain 0.01), where SB3's TD3 keeps PyTorch's default initialisation; the
  MuJoCo configs set `net.ortho_init: false`, which starts them as SB3's (it ended higher on
  HalfCheetah: docs/PERFORMANCE.md#mujoco).
The acting graph computes only the actor: the critics are not in it (`act_value: False`).
"""

from __future__ import annotations

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
from rlstack.network import Network, NoiseKind, PolicyKind
from rlstack.registry import Progress
from rlstack.replay import Replay

NOISE_TYPES = ("normal", "ornstein-uhlenbeck", "none")
"""`train.noise_type` (the Zoo's names): exploration noise of std `noise_std` on the scaled action,
Gaussian or an Ornstein-Uhlenbeck process (theta 0.15, dt 0.01, restarted at episode ends, as
SB3's), or none (the deterministic action; SB3's default)."""


@dataclass
class TD3Config(OffPolicyConfig):
    lr: str = "1e-3"
    """Adam learning rate of the actor and the critics: a number, or `lin_X` for a linear decay
    from X to 0."""
    tau: float = 0.005
    """Polyak rate of the target actor and critics."""
    policy_delay: int = 2
    """Critic gradient steps per actor step (and target update)."""
    target_policy_noise: float = 0.2
    """Std of the Gaussian noise on the target action (target policy smoothing)."""
    target_noise_clip: float = 0.5
    """That noise is clipped to [-target_noise_clip, target_noise_clip]."""
    noise_type: str = "normal"
    """Exploration noise on the action scaled to [-1, 1]: `normal` (Gaussian, std `noise_std`),
    `ornstein-uhlenbeck` (temporally correlated, as SB3's `OrnsteinUhlenbeckActionNoise` with sigma
    `noise_std`, theta 0.15, dt 0.01, restarted at episode ends) or `none`."""
    noise_std: float = 0.1
    """Std of the exploration noise on the scaled action."""
    n_critics: int = 2
    """Number of Q critics (the minimum over them is the target: clipped double-Q)."""

    def network_params(self, hidden: Sequence[int], obs_dim: int, action_dim: int) -> tuple[int, int]:
        """The actor and `n_critics` critics, and a target copy of all of them."""
        networks = mlp_params(obs_dim, hidden, action_dim) + self.n_critics * mlp_params(
            obs_dim + action_dim, hidden, 1)
        return networks, networks

    def validate(self, cfg: Config) -> None:
        super().validate(cfg)
        if self.policy_delay < 1:
            raise ConfigError(f"'train.policy_delay' must be >= 1, got {self.policy_delay}")
        for key in ("target_policy_noise", "target_noise_clip", "noise_std"):
            if getattr(self, key) < 0:
                raise ConfigError(f"'train.{key}' must be >= 0, got {getattr(self, key)}")
        if self.noise_type not in NOISE_TYPES:
            raise ConfigError(f"'train.noise_type' is {self.noise_type!r}: expected one of {', '.join(NOISE_TYPES)}")
        if self.n_critics < 1:
            raise ConfigError(f"'train.n_critics' must be >= 1, got {self.n_critics}")


def smoothed_target_action(target: Network, next_obs, target_noise, noise_std: float, noise_clip: float):
    """Target policy smoothing: clip(mu'(s') + clip(noise_std * target_noise, -c, c), -1, 1), scaled
    to [-1, 1]; `target_noise` is standard normal [B, d]."""
    noise = ops.clamp(target_noise * noise_std, -noise_clip, noise_clip)
    return ops.clamp(target.policy_action(next_obs) + noise, -1.0, 1.0)


class ActorLoss(nn.Cell):
    """-mean Q_1(s, mu(s)): the first critic only, as SB3's TD3."""

    def __init__(self, network: Network):
        super().__init__()
        self.network = network

    def construct(self, obs):
        x = self.network.features(obs)
        q = self.network.critics[0].forward(ops.concat((x, self.network.pi.scaled(x)), axis=-1))  # [B, 1]
        return -q.mean()


class TD3Step(nn.Cell):
    """One TD3 gradient step in one graph call: the critic step, and with `delayed` also the actor
    step and both target updates.

    Inputs: one minibatch (obs, action in env units, reward, next_obs, terminated) and standard-normal
    target-smoothing noise [B, d]. Returns [critic_loss, actor_loss, q_mean] (actor_loss 0 without
    `delayed`). Both graphs share the network, the targets, the optimizers and the step counter.
    The delayed step is one graph over the 100-kernel line: split under it, it measured slower on two
    threads (docs/PERFORMANCE.md#td3-update-graph).
    """

    def __init__(self, network: Network, target: Network, critic_optimizer: nn.Adam, actor_optimizer: nn.Adam,
                 n_gradient_steps: Parameter, cfg: TD3Config, delayed: bool):
        super().__init__()
        self.network, self.target = network, target
        self.critic_optimizer, self.actor_optimizer = critic_optimizer, actor_optimizer
        self.n_gradient_steps = n_gradient_steps
        self.delayed = delayed
        self.critic_grad = ops.value_and_grad(CriticLoss(network, 1.0), None, critic_optimizer.parameters, has_aux=True)
        self.actor_grad = ops.value_and_grad(ActorLoss(network), None, actor_optimizer.parameters)
        online = network.critics.trainable_params() + network.pi.trainable_params()
        targets = target.critics.trainable_params() + target.pi.trainable_params()
        self.online_params, self.target_params = ms.ParameterTuple(online), ms.ParameterTuple(targets)
        self.gamma, self.tau = cfg.gamma, cfg.tau
        self.noise_std, self.noise_clip = cfg.target_policy_noise, cfg.target_noise_clip

    def construct(self, obs, action, reward, next_obs, terminated, target_noise):
        next_action = smoothed_target_action(self.target, next_obs, target_noise, self.noise_std, self.noise_clip)
        next_q = ops.amin(self.target.q_scaled(next_obs, next_action), axis=0)
        # only termination stops the bootstrap; time-limit truncation is bootstrapped
        y = ops.stop_gradient(reward + self.gamma * (1.0 - terminated) * next_q)  # [B]
        (critic_loss, q_mean), critic_grads = self.critic_grad(obs, action, y)
        self.critic_optimizer(critic_grads)
        actor_loss = ops.zeros((), ms.float32)
        if self.delayed:
            actor_loss, actor_grads = self.actor_grad(obs)
            self.actor_optimizer(actor_grads)
            for j in range(len(self.target_params)):
                # target += tau * (online - target), in place (docs/PERFORMANCE.md#polyak)
                ops.assign_add(self.target_params[j], (self.online_params[j] - self.target_params[j]) * self.tau)
        ops.assign_add(self.n_gradient_steps, Tensor(1, ms.int64))
        return ops.stack((critic_loss, actor_loss, q_mean))


class TD3Update(nn.Cell):
    """Everything a checkpoint holds (network, targets, optimizers, gradient-step count) and the
    two step graphs (`critic_step`, `full_step`) over it."""

    def __init__(self, network: Network, target: Network, cfg: TD3Config, lr: float):
        super().__init__()
        self.network, self.target = network, target
        self.critic_optimizer = nn.Adam(network.critics.trainable_params(), learning_rate=Tensor(lr, ms.float32))
        self.actor_optimizer = nn.Adam(network.pi.trainable_params(), learning_rate=Tensor(lr, ms.float32))
        # Gradient steps done so far (the actor's delay counts them); a Parameter so checkpoints carry it.
        self.n_gradient_steps = Parameter(Tensor(0, ms.int64), name="n_gradient_steps", requires_grad=False)
        parts = (network, target, self.critic_optimizer, self.actor_optimizer, self.n_gradient_steps, cfg)
        self.critic_step = TD3Step(*parts, delayed=False)
        self.full_step = TD3Step(*parts, delayed=True)


class TD3(TwinCriticAlgorithm):
    """TD3: a deterministic actor and twin Q critics on the shared network, plus target copies."""

    policy = PolicyKind.DETERMINISTIC

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space):
        super().__init__(cfg, obs_space, action_space)
        self.cfg: TD3Config
        std = 0.0 if self.cfg.noise_type == "none" else self.cfg.noise_std
        self.network.pi.noise_std.set_data(Tensor(np.full(self.action_dim, std, np.float32)))
        if self.cfg.noise_type == "ornstein-uhlenbeck":  # the acting module keeps the process
            self.network.pi.noise_kind = NoiseKind.ORNSTEIN_UHLENBECK
        self.update = TD3Update(self.network, self.target, self.cfg, self.current_lr)
        state = written_by(self.update)
        self._steps = {False: LeanCall(self.update.critic_step, state),
                       True: LeanCall(self.update.full_step, state)}
        self.optimizers = [self.update.critic_optimizer, self.update.actor_optimizer]

    def delayed(self, step: int) -> bool:
        """Whether gradient step `step` (0-based over the run) also steps the actor and the targets:
        every `policy_delay`-th, counted from 1 (SB3's `_n_updates % policy_delay == 0`)."""
        return (step + 1) % self.cfg.policy_delay == 0

    def learn(self, replay: Replay, progress: Progress, rng: np.random.Generator) -> dict[str, float]:
        """`gradient_steps` TD3 gradient steps on minibatches from `replay`. Returns `train/...` metrics."""
        lr = self.scheduled_lr(progress)
        k, b, d = self.cfg.gradient_steps, self.cfg.batch_size, self.action_dim
        batch = replay.sample((k, b), rng)  # [K, B, ...]
        noise = rng.standard_normal((k, b, d), dtype=np.float32)  # target policy smoothing
        critic_loss = q_mean = 0.0
        actor_losses = []
        for i in range(k):
            delayed = self.delayed(self._gradient_steps)
            self._gradient_steps += 1
            stats = self._steps[delayed](*host_tensors(*(x[i] for x in (
                batch.obs, batch.action, batch.reward, batch.next_obs, batch.terminated, noise))))
            losses = to_numpy(stats)
            critic_loss += float(losses[0]) / k
            q_mean += float(losses[2]) / k
            if delayed:
                actor_losses.append(float(losses[1]))
        metrics = {"train/critic_loss": critic_loss, "train/q_mean": q_mean, "train/learning_rate": lr}
        if actor_losses:
            metrics["train/actor_loss"] = float(np.mean(actor_losses))
        return metrics


registry.register("td3", TD3Config, TD3)

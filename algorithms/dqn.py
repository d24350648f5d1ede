"""Double DQN (van Hasselt et al. 2016, https://arxiv.org/abs/1509.06461) on the shared network module.

DQN (Mnih et al. 2015) with the Double-DQN target: the online network picks the next action,
the target network values it. Follows Stable-Baselines3's DQN where the paper leaves a choice:
Huber (smooth-L1) loss, gradient-norm clipping at 10, a linear epsilon schedule over
`exploration_fraction` of training, `train_freq` / `gradient_steps` / `learning_starts` as in
RL Baselines3 Zoo. Differences from SB3:
- the target is Double DQN (SB3 takes the max of the target network; `double_q: false` does that);
- epsilon-greedy runs inside the acting graph from the noise input (`Network.act`), so the
  exported policy is the same graph; the trainer sets epsilon with `network.set_epsilon`;
- one compiled graph call per gradient step (`DQNStep`), its minibatch sampled on the host.
  The step stays under MindSpore's 100-kernel single-thread limit (fused smooth-L1 loss, the
  online network run once on obs and next_obs together, clipping in few kernels); a graph
  `while` loop over all K steps of an update would run in the slower multi-thread actor runtime
  (control flow; docs/PERFORMANCE.md#the-100-kernel-line);
- the target network is updated when the environment-step counter crosses a multiple of
  `target_update_interval`. The online network only changes inside `learn`, so the updates due
  since the previous `learn` are applied at its start in one step: n Polyak steps towards an
  unchanged online network are `target <- lerp(target, online, 1 - (1 - tau)^n)` exactly
  (a hard copy when tau = 1), which is what SB3's per-step updates compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rlstack import registry
from rlstack.buffers import pack_columns
from rlstack.config import Config, ConfigError, OffPolicyConfig, mlp_params
from rlstack.graphcall import LeanCall, ParameterWrite, host_tensors, to_numpy, written_by
from rlstack.kernels import column, columns, rows
from rlstack.network import NetSpec, Network, PolicyKind, QKind, copy_parameters
from rlstack.optim import clip_by_global_norm
from rlstack.registry import Progress
from rlstack.replay import Replay, ReplayBatch
from rlstack.schedules import parse_schedule


@dataclass
class DQNConfig(OffPolicyConfig):
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (the oldest are overwritten)."""
    learning_starts: int = 100
    """Environment steps of uniformly random actions before the first update."""
    batch_size: int = 32
    """Transitions per gradient step."""
    train_freq: int = 4
    """Update every this many vector-env steps (each vector step is env.n_envs transitions)."""
    gradient_steps: int = 1
    """Gradient steps per update (each on a fresh minibatch)."""
    target_update_interval: int = 10_000
    """Environment steps between target-network updates."""
    lr: str = "1e-4"
    """Adam learning rate: a number, or `lin_X` for a linear decay from X to 0."""
    exploration_fraction: float = 0.1
    """Fraction of `total_steps` over which epsilon decays linearly from its initial to its final value."""
    exploration_initial_eps: float = 1.0
    """Epsilon at the start of training."""
    exploration_final_eps: float = 0.05
    """Epsilon after `exploration_fraction` of training."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clipping threshold."""
    double_q: bool = True
    """Double-DQN target (online argmax, target value); False: max of the target network."""
    dueling: bool = False
    """Dueling Q head: Q = V + A - mean(A) (Wang et al. 2016)."""

    def network_params(self, hidden: Sequence[int], obs_dim: int, action_dim: int) -> tuple[int, int]:
        """The Q MLP (+ 1 output: a dueling head's V) and its target copy."""
        q = mlp_params(obs_dim, hidden, action_dim + 1)
        return q, q

    def validate(self, cfg: Config) -> None:
        super().validate(cfg)
        if self.target_update_interval < 1:
            raise ConfigError(f"'train.target_update_interval' must be >= 1, got {self.target_update_interval}")
        if not 0.0 < self.exploration_fraction <= 1.0:
            raise ConfigError(f"'train.exploration_fraction' must be in (0, 1], got {self.exploration_fraction}")
        for key in ("exploration_initial_eps", "exploration_final_eps"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"'train.{key}' must be in [0, 1], got {getattr(self, key)}")


def linear_epsilon(progress_remaining: float, initial: float, final: float, fraction: float) -> float:
    """SB3's `get_linear_fn`: initial -> final over the first `fraction` of training, then final."""
    progress = 1.0 - progress_remaining
    if progress > fraction:
        return final
    return initial + progress * (final - initial) / fraction


def target_update_count(prev_steps: int, steps: int, interval: int) -> int:
    """How many multiples of `interval` lie in (prev_steps, steps]: the target updates due when
    the step counter moved from `prev_steps` to `steps`."""
    return steps // interval - prev_steps // interval


def td_target(q_next_online, q_next_target, reward, terminated, gamma: float, double_q: bool):
    """The bootstrapped target, [B]. q_next_*: Q(next_obs, .) [B, n]; reward, terminated: [B] float.

    Double DQN: a* = argmax_a Q_online(s', a), y = r + gamma * (1 - terminated) * Q_target(s', a*).
    Only termination stops the bootstrap; a time-limit truncation is bootstrapped.
    """
    if double_q:
        best = ops.argmax(q_next_online, -1).astype(ms.int32)
        next_q = ops.gather_elements(q_next_target, 1, best.reshape(-1, 1)).squeeze(-1)
    else:
        next_q = ops.amax(q_next_target, axis=-1)
    return reward + gamma * (1.0 - terminated) * next_q


FRAMES_APART = 4096
"""Frames of at least this many values (Atari's 28,224) reach the step graph apart, as uint8;
smaller ones (MinAtar's 400) in the float32 columns, where their two `Cast`s would put the step over
the 100-kernel line (docs/PERFORMANCE.md#pixels)."""


class DQNStep(nn.Cell):
    """One gradient step: Huber TD loss on one minibatch, gradient-norm clipping, Adam.

    Takes a minibatch as `inputs` makes it: packed float32 columns [B, 2 * obs_dim + 3], or for
    frames of `FRAMES_APART` values or more the columns [B, 3] and the frames (obs, next_obs) apart
    in their own dtype (uint8: a quarter of float32's bytes, and no conversion on the host).
    Returns [td_loss, mean Q(s, a), mean target].
    """

    def __init__(self, network: Network, target: Network, optimizer: nn.Optimizer, cfg: DQNConfig):
        super().__init__()
        self.frames = network.frames and network.obs_dim >= FRAMES_APART
        self.obs_dim = 0 if self.frames else network.obs_dim  # (the packed columns' obs width)
        self.network = network
        self.target = target
        self.optimizer = optimizer
        self.grad = ops.value_and_grad(self.loss, None, optimizer.parameters, has_aux=True)
        self.gamma = cfg.gamma
        self.double_q = cfg.double_q
        self.max_grad_norm = cfg.max_grad_norm
        # Environment step of the last target update; a Parameter so checkpoints carry it.
        self.target_synced_at = Parameter(Tensor(0, ms.int64), name="target_synced_at", requires_grad=False)

    def loss(self, obs, next_obs, action, reward, terminated):
        batch = obs.shape[0]
        q_next_target = self.target.q_values(next_obs)
        if self.double_q:
            # One pass of the online network over obs and next_obs: half the kernels of two.
            q_both = self.network.q_values(ops.concat((obs, next_obs)))
            q, q_next_online = rows(q_both, 0, batch), ops.stop_gradient(rows(q_both, batch, 2 * batch))
        else:
            q, q_next_online = self.network.q_values(obs), q_next_target
        target = ops.stop_gradient(td_target(q_next_online, q_next_target, reward, terminated,
                                             self.gamma, self.double_q))
        q_taken = ops.gather_elements(q, 1, action.reshape(-1, 1)).squeeze(-1)  # [B]
        # smooth-L1 with beta 1 is Huber with delta 1 (torch's smooth_l1_loss, as SB3): one kernel.
        loss = ops.smooth_l1_loss(q_taken, target, beta=1.0, reduction="mean")
        return loss, (q_taken.mean(), target.mean())

    def inputs(self, b: ReplayBatch) -> list[tuple[Tensor, ...]]:
        """Replay minibatches [K, B, ...] -> each one's graph inputs: float32 columns [B, 2 * obs_dim +
        3] (`rlstack.buffers.pack_columns`) in the order `construct` slices them (obs, next_obs,
        action, reward, terminated); with frames apart, columns [B, 3] (action, reward,
        terminated), obs and next_obs."""
        if not self.frames:
            packed = pack_columns(b.reward.shape, b.obs, b.next_obs, b.action, b.reward, b.terminated)
            return [host_tensors(minibatch) for minibatch in packed]
        packed = pack_columns(b.reward.shape, b.action, b.reward, b.terminated)
        return [host_tensors(minibatch, obs, next_obs)
                for minibatch, obs, next_obs in zip(packed, b.obs, b.next_obs, strict=True)]

    def construct(self, batch, obs=None, next_obs=None):
        d = self.obs_dim
        if not self.frames:
            obs, next_obs = columns(batch, 0, d), columns(batch, d, 2 * d)
        (loss, (q_mean, target_mean)), grads = self.grad(obs, next_obs,
                                         column(batch, 2 * d).astype(ms.int32), column(batch, 2 * d + 1),
                                         column(batch, 2 * d + 2))
        self.optimizer(clip_by_global_norm(grads, self.max_grad_norm))
        # one Stack of the three scalars (a Stack and a Concat were one kernel more: with MinAtar's
        # conv encoder 101, over the 100-kernel line: docs/PERFORMANCE.md#the-100-kernel-line)
        return ops.stack((loss, q_mean, target_mean))


class TargetUpdate(nn.Cell):
    """target <- target * (1 - mix) + online * mix for every parameter (mix 1: an exact copy)."""

    def __init__(self, network: Network, target: Network):
        super().__init__()
        self.online_params = ms.ParameterTuple(network.trainable_params())
        self.target_params = ms.ParameterTuple(target.trainable_params())

    def construct(self, mix):
        for i in range(len(self.target_params)):
            ops.assign(self.target_params[i], self.target_params[i] * (1.0 - mix) + self.online_params[i] * mix)
        return mix


class DQN(registry.Algorithm):
    """Double DQN: a Q head (optionally dueling) on the shared network, plus a target copy."""

    data_path = registry.DataPath.REPLAY

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"dqn needs a Discrete action space; {cfg.env.id} has {action_space}")
        self.cfg: DQNConfig = cfg.train
        spec = NetSpec.of(cfg.net, policy=PolicyKind.NONE, value=False, q=QKind.DISCRETE, dueling=self.cfg.dueling)
        self.network = Network(obs_space, action_space, spec)
        self.target = Network(obs_space, action_space, spec)
        copy_parameters(self.network, self.target)
        self.lr = parse_schedule(self.cfg.lr, "train.lr")
        self.optimizer = nn.Adam(self.network.trainable_params(), learning_rate=Tensor(self.lr(1.0), ms.float32))
        self.step = DQNStep(self.network, self.target, self.optimizer, self.cfg)
        # The lean call (no compile-key work per call) of a graph that writes parameters.
        self._step = LeanCall(self.step, state=written_by(self.step))
        self._lr = ParameterWrite([self.optimizer.learning_rate])
        self.target_update = TargetUpdate(self.network, self.target)
        self.epsilon = self.cfg.exploration_initial_eps
        self.network.set_epsilon(self.epsilon)
        self.chunk_steps = self.cfg.train_freq

    def state_cell(self) -> nn.Cell:
        """Everything a checkpoint must hold: network, target network, optimizer, target-sync step."""
        return self.step

    def target_networks(self) -> tuple:
        return (self.target,)

    def explore(self, progress_remaining: float) -> None:
        """Set the acting graph's epsilon for the coming vector step."""
        c = self.cfg
        epsilon = linear_epsilon(progress_remaining, c.exploration_initial_eps, c.exploration_final_eps,
                                 c.exploration_fraction)
        if epsilon != self.epsilon:
            self.epsilon = epsilon
            self.network.set_epsilon(epsilon)

    def acting_key(self) -> tuple:
        return (self.epsilon,)

    def learn(self, replay: Replay, progress: Progress, rng: np.random.Generator) -> dict[str, float]:
        """`gradient_steps` gradient steps on minibatches from `replay`; the target network is
        updated every `target_update_interval` environment steps. Returns `train/...` metrics."""
        lr, steps = self.lr(progress.remaining), progress.steps
        self._lr(lr)
        synced_at = int(self.step.target_synced_at.asnumpy())
        n_due = target_update_count(synced_at, steps, self.cfg.target_update_interval)
        if n_due:
            self.target_update(Tensor(1.0 - (1.0 - self.cfg.tau) ** n_due, ms.float32))
            self.step.target_synced_at.set_data(Tensor(steps, ms.int64))
        b = replay.sample((self.cfg.gradient_steps, self.cfg.batch_size), rng)  # [K, B, ...]
        stats = [self._step(*inputs) for inputs in self.step.inputs(b)]
        td_loss, q_mean, target_mean = np.mean([to_numpy(s) for s in stats], axis=0)
        return {"train/td_loss": float(td_loss), "train/q_mean": float(q_mean),
                "train/target_mean": float(target_mean), "train/learning_rate": lr,
                "rollout/epsilon": self.epsilon}


registry.register("dqn", DQNConfig, DQN)

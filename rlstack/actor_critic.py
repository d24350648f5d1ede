"""The base of the off-policy actor-critic algorithms on continuous actions (SAC, TD3).

`TwinCriticAlgorithm` owns what they share: the Box check, the network (the subclass's policy head,
`n_critics` Q critics, an acting graph without the critics) and its target copy, the learning-rate
schedule applied to every optimizer, and the host copy of the gradient-step count their schedules
(SAC's target interval, TD3's policy delay) read. A subclass sets `policy`, builds `update` (the
Cell a checkpoint holds, with an `n_gradient_steps` parameter) and `optimizers`, and writes `learn`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import mindspore as ms
from mindspore import Tensor, nn

from rlstack import registry
from rlstack.config import Config, ConfigError
from rlstack.network import NetSpec, Network, PolicyKind, QKind, copy_parameters
from rlstack.registry import Progress
from rlstack.schedules import parse_schedule


class CriticLoss(nn.Cell):
    """`scale` * sum over critics of MSE(Q_i(s, a), y) (SAC's 0.5, TD3's 1 as SB3 has them); returns
    (loss, mean Q)."""

    def __init__(self, network: Network, scale: float):
        super().__init__()
        self.network, self.scale = network, scale

    def construct(self, obs, action, target):
        q = self.network.q_sa(obs, action)  # [n_critics, B]
        err = q - target
        loss = (err * err).mean(axis=1).sum()
        if self.scale != 1.0:
            loss = self.scale * loss
        return loss, q.mean()


class TwinCriticAlgorithm(registry.Algorithm):
    """An actor and `train.n_critics` Q critics on the shared network, plus a target copy of both."""

    data_path = registry.DataPath.REPLAY
    policy: ClassVar[PolicyKind]
    update: Any
    """The Cell a checkpoint holds; its `n_gradient_steps` parameter counts gradient steps."""
    optimizers: list

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space):
        if not isinstance(action_space, gym.spaces.Box):
            raise ConfigError(f"{cfg.algo} needs a Box action space; {cfg.env.id} has {action_space}")
        self.cfg = cfg.train
        spec = NetSpec.of(cfg.net, policy=self.policy, value=False, q=QKind.CONTINUOUS,
                          n_critics=self.cfg.n_critics, act_value=False)
        self.network = Network(obs_space, action_space, spec)
        self.target = Network(obs_space, action_space, spec)
        copy_parameters(self.network, self.target)
        self.action_dim = self.network.action_dim
        self.lr = parse_schedule(self.cfg.lr, "train.lr")
        self.current_lr = self.lr(1.0)
        self.chunk_steps = self.cfg.train_freq
        self._gradient_steps: int | None = None  # host copy of update.n_gradient_steps

    def state_cell(self) -> Any:
        """Everything a checkpoint must hold: network, targets, optimizers, the algorithm's own state."""
        return self.update

    def target_networks(self) -> tuple:
        return (self.target,)

    def scheduled_lr(self, progress: Progress) -> float:
        """The learning rate at `progress`, written into every optimizer when it changed; on the
        first call (possibly after a checkpoint was loaded) the gradient-step count is read."""
        lr = self.lr(progress.remaining)
        if lr != self.current_lr:
            self.current_lr = lr
            for optimizer in self.optimizers:
                optimizer.learning_rate.set_data(Tensor(lr, ms.float32))
        if self._gradient_steps is None:
            self._gradient_steps = int(self.update.n_gradient_steps.asnumpy())
        return lr

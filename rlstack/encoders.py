"""Encoders of the network module (`rlstack.network`): what turns an observation into the feature
vector every head reads. The observation statistics (`ObsNormalizer`) sit before the encoder, inside
the graph, so every exported graph carries them."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rlstack.spaces import flat_masked_space


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


class FlatEncoder(nn.Cell):
    """The flat (normalised) observation is the feature vector: no parameters, no kernels. An
    encoder takes the normalised flat observation [B, obs_dim] and returns features [B, out_dim];
    one with parameters is shared by every head (`Network.encoder_params`)."""

    def __init__(self, obs_dim: int):
        super().__init__()
        self.out_dim = obs_dim

    def construct(self, x):
        return x


ENCODERS = {"mlp": FlatEncoder}
"""`net.encoder` -> the encoder class, built as `cls(obs_dim)` (the heads' MLPs follow it)."""

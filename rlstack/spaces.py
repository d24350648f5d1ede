"""Masked observations as one float32 vector: the layout the env, the network and the artifact share.

Two-player games observe a PettingZoo-style dict `{"observation": Box(rows, cols, 2),
"action_mask": Box(n)}`. The acting graph keeps its single signature `act(obs[B, D], noise)`,
so the dict enters the graph flattened: `[observation.ravel() (C order), action_mask]`, float32.
`MaskedBox` is the Box of that vector; it remembers the dict it flattens, so the network knows
where the mask starts (and masks illegal moves inside the graph) and the manifest can record the
layout. Everything that treats observations as a Box (buffers, export, `load_policy`, the server
and actors) works on it unchanged.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

OBS_KEY = "observation"
MASK_KEY = "action_mask"


def is_masked_dict(space: gym.Space) -> bool:
    """True for a Dict space with exactly the keys `observation` and `action_mask` (PettingZoo classic)."""
    return isinstance(space, gym.spaces.Dict) and set(space.spaces) == {OBS_KEY, MASK_KEY}


class MaskedBox(gym.spaces.Box):
    """Box over `[observation.ravel(), action_mask]` (float32) that remembers the Dict it flattens."""

    def __init__(self, dict_space: gym.spaces.Dict, seed: int | None = None):
        if not is_masked_dict(dict_space):
            raise TypeError(f"MaskedBox needs a Dict with keys '{OBS_KEY}' and '{MASK_KEY}', got {dict_space}")
        obs, mask = dict_space[OBS_KEY], dict_space[MASK_KEY]
        if not isinstance(obs, gym.spaces.Box):
            raise TypeError(f"'{OBS_KEY}' must be a Box, got {obs}")
        if not isinstance(mask, gym.spaces.Box | gym.spaces.MultiBinary) or len(mask.shape) != 1:
            raise TypeError(f"'{MASK_KEY}' must be a 1-d Box or MultiBinary, got {mask}")
        self.dict_space = dict_space
        self.obs_shape = tuple(int(d) for d in obs.shape)
        self.obs_size = int(np.prod(self.obs_shape))
        self.mask_dim = int(mask.shape[0])
        low = np.concatenate([np.broadcast_to(obs.low, obs.shape).reshape(-1), np.zeros(self.mask_dim)])
        high = np.concatenate([np.broadcast_to(obs.high, obs.shape).reshape(-1), np.ones(self.mask_dim)])
        super().__init__(low.astype(np.float32), high.astype(np.float32), dtype=np.float32, seed=seed)

    def flatten(self, obs: dict[str, Any]) -> np.ndarray:
        """One dict observation (or a batch of them, leading axis B) -> [D] or [B, D] float32."""
        planes = np.asarray(obs[OBS_KEY], np.float32)
        mask = np.asarray(obs[MASK_KEY], np.float32)
        batch = planes.shape[:-len(self.obs_shape)] if planes.ndim > len(self.obs_shape) else ()
        return np.concatenate([planes.reshape(*batch, self.obs_size), mask.reshape(*batch, self.mask_dim)], -1)

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """[D] or [B, D] -> the dict (planes as float32, mask as bool)."""
        flat = np.asarray(flat, np.float32)
        batch = flat.shape[:-1]
        return {OBS_KEY: flat[..., : self.obs_size].reshape(*batch, *self.obs_shape),
                MASK_KEY: flat[..., self.obs_size:] > 0.5}

    def layout(self) -> list[dict[str, Any]]:
        """Where each key sits in the flat vector (recorded in the manifest)."""
        return [{"key": OBS_KEY, "shape": list(self.obs_shape), "offset": 0, "size": self.obs_size},
                {"key": MASK_KEY, "shape": [self.mask_dim], "offset": self.obs_size, "size": self.mask_dim}]

    def __repr__(self) -> str:
        return f"MaskedBox(observation={self.obs_shape}, action_mask=({self.mask_dim},))"


def flat_masked_space(space: gym.Space) -> gym.Space:
    """A masked Dict as its MaskedBox; any other space unchanged."""
    return MaskedBox(space) if is_masked_dict(space) else space


def mask_dim_of(space: gym.Space) -> int:
    """Length of the action mask carried by an observation space (0: no mask)."""
    space = flat_masked_space(space)
    return space.mask_dim if isinstance(space, MaskedBox) else 0


def is_image_space(space: gym.Space) -> bool:
    """A Box of 3-d frames: uint8 pixels ([H, W, C] or [C, H, W], Atari's stacked frames) or bool
    planes (MinAtar's [10, 10, C])."""
    return (isinstance(space, gym.spaces.Box) and len(space.shape) == 3
            and np.dtype(space.dtype) in (np.dtype(np.uint8), np.dtype(np.bool_)))


def image_layout(space: gym.Space) -> tuple[tuple[int, int, int], bool]:
    """((C, H, W), channels_last) of an image space: the smallest axis holds the channels, first or
    last (Stable-Baselines3's `is_image_space_channels_first` rule)."""
    if not is_image_space(space):
        raise TypeError(f"{space} is not an image space (a 3-d Box of uint8 or bool)")
    shape = tuple(int(d) for d in space.shape)
    channels_last = int(np.argmin(shape)) != 0
    c, h, w = (shape[2], shape[0], shape[1]) if channels_last else shape
    return (c, h, w), channels_last


def obs_dtype_of(space: gym.Space) -> np.dtype:
    """The dtype observations are stored in and enter the acting graph as: uint8 for image spaces
    (bool planes as 0/1), float32 for every other space (the graph scales frames itself)."""
    return np.dtype(np.uint8) if is_image_space(space) else np.dtype(np.float32)

"""Encoders of the network module (`rlstack.network`): what turns an observation into the feature
vector every head reads, shared by all of them.

- `FlatEncoder` (`mlp`): the flat observation after its running statistics (`ObsNormalizer`,
  inside the graph, so every exported graph carries them) is the feature vector.
- `ConvEncoder` (`nature_cnn`, `minatar_cnn`): frames (uint8 pixels, or MinAtar's bool planes
  stored as uint8) scaled inside the graph, then convolutions and a dense layer with ReLU
  (`rlstack.conv.ConvStack`: the fast CPU form, MindSpore's `nn.Conv2d` on Ascend and GPU). The
  exported graph takes the environment's own frames.
- `BoardResNet` (`resnet`): AlphaZero's residual tower on a board game's planes, from the same conv
  layers (`rlstack.conv.conv_layer`).

`net.encoder: auto` (`resolve_encoder`) takes a conv encoder for image observations, `mlp` for
every other.
"""

from __future__ import annotations

import math

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Orthogonal, Zero

from rlstack.conv import ConvStack, conv_layer, resolve_form
from rlstack.kernels import columns
from rlstack.spaces import flat_masked_space, image_layout, is_image_space


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
    """The flat (normalised) observation is the feature vector: no parameters, no kernels.

    Every encoder is built as `cls(obs_space, spec)` and has `out_dim`, the width of its features.
    One with `frames = False` takes the normalised flat observation [B, obs_dim] float32; one with
    `frames = True` the observation as the environment gives it, [B, *obs_shape] uint8. One with
    parameters is shared by every head (`Network.encoder_params`)."""

    frames = False
    form = None
    """A conv encoder's convolutions as built (`rlstack.conv.FORMS`); None: no convolutions."""

    def __init__(self, obs_space: gym.Space, spec=None):
        super().__init__()
        self.out_dim = obs_dim_of(obs_space)

    def construct(self, x):
        return x


class ConvEncoder(nn.Cell):
    """Frames [B, *obs_shape] uint8 -> float32 scaled to [0, 1] (pixels / 255; bool planes as they
    are) -> `ConvStack` (ReLU after every layer, the dense layer included) -> [B, dense]. Channels
    first or last as the space has them (`rlstack.spaces.image_layout`); the first convolution
    reads either layout. With `spec.ortho_init`, orthogonal weights of gain sqrt(2) and zero
    biases, as Stable-Baselines3 initialises its `NatureCNN` in `CnnPolicy`."""

    frames = True
    LAYERS: tuple[tuple[int, int, int], ...] = ()
    """(out_channels, kernel, stride) of each convolution."""
    DENSE = 0
    """Width of the dense layer after them: the features' width."""

    def __init__(self, obs_space: gym.Space, spec=None):
        super().__init__()
        if not is_image_space(obs_space):
            raise ValueError(f"encoder '{self.NAME}' needs image observations (a 3-d Box of uint8 or bool, "
                             f"[H, W, C] or [C, H, W]); got {obs_space}")
        (c, h, w), channels_last = image_layout(obs_space)
        self.scale = 1.0 / 255.0 if np.dtype(obs_space.dtype) == np.uint8 else 1.0
        ortho = spec is None or spec.ortho_init
        weight_init = Orthogonal(gain=math.sqrt(2.0)) if ortho else None
        self.stack = ConvStack((c, h, w), self.LAYERS, getattr(spec, "conv_form", "auto"), weight_init,
                               Zero() if ortho else None, dense=self.DENSE,
                               in_format="NHWC" if channels_last else "NCHW",
                               batch_invariant=bool(getattr(spec, "batch_invariant", False)))
        self.out_dim = self.stack.out_dim
        self.form = self.stack.form

    def construct(self, obs):
        x = obs.astype(ms.float32)
        if self.scale != 1.0:
            x = x * self.scale
        return self.stack(x)


class NatureCNN(ConvEncoder):
    """Mnih et al. 2015 (Stable-Baselines3's `NatureCNN`, CleanRL's `ppo_atari`): 32x8x8/4,
    64x4x4/2, 64x3x3/1, dense 512; for 84x84 frames (at least 36x36)."""

    NAME = "nature_cnn"
    LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    DENSE = 512


class MinAtarCNN(ConvEncoder):
    """Young and Tian 2019 (MinAtar's DQN and actor-critic network): 16x3x3/1, dense 128."""

    NAME = "minatar_cnn"
    LAYERS = ((16, 3, 1),)
    DENSE = 128


class BoardResNet(nn.Cell):
    """AlphaZero's residual tower (Silver et al. 2017/2018) on a board game's planes, `net.encoder:
    resnet`: a 3x3 convolution to `channels`, `blocks` residual blocks (3x3, ReLU, 3x3, plus the
    block's input, ReLU), then AlphaZero's head convolutions: 1x1 to 2 planes for the policy and
    1x1 to 1 plane for the value, each with ReLU; the features are those 3 planes, flattened, on
    which the heads' MLPs (`net.hidden`) follow. Every 3x3 convolution keeps the board's size
    (one zero border, then a "valid" convolution of `rlstack.conv.conv_layer`: the fast CPU form, or
    `nn.Conv2d` on Ascend and GPU).

    It takes the flat (masked) observation of a game, whose first H*W*C entries are the planes
    [H, W, C] of `MaskedBox.obs_shape` (PettingZoo's layout). What differs from AlphaZero: no batch
    normalisation (its training and inference modes would make the acting graph compute something
    other than the training graph; rlstack exports what it trains), and instead the second
    convolution of every block starts at zero, so each block starts as the identity (Fixup, Zhang
    et al. 2019); the policy and value planes both reach both heads' MLPs."""

    frames = False

    def __init__(self, obs_space: gym.Space, spec=None):
        super().__init__()
        shape = getattr(obs_space, "obs_shape", None)
        if shape is None or len(shape) != 3:
            raise ValueError(f"encoder 'resnet' needs a board game's observation (planes [H, W, C] and a "
                             f"legal-move mask); got {obs_space}")
        self.height, self.width, self.in_channels = (int(d) for d in shape)
        self.plane_size = self.height * self.width * self.in_channels
        blocks, channels = int(getattr(spec, "blocks", 6)), int(getattr(spec, "channels", 64))
        if blocks < 0 or channels < 1:
            raise ValueError(f"encoder 'resnet' needs net.blocks >= 0 and net.channels >= 1, got {blocks}, {channels}")
        self.form = resolve_form(getattr(spec, "conv_form", "auto"))
        self.nhwc = self.form == "matmul"  # the fast form keeps channels last; nn.Conv2d reads NCHW
        fmt = {"in_format": "NHWC", "out_format": "NHWC"} if self.nhwc else {}
        pad = ((0, 0), (1, 1), (1, 1), (0, 0)) if self.nhwc else ((0, 0), (0, 0), (1, 1), (1, 1))
        self.pad = ops.Pad(pad)

        def conv(cin: int, cout: int, kernel: int, zero: bool = False) -> nn.Cell:
            init = {"weight_init": Zero(), "bias_init": Zero()} if zero else {}
            return conv_layer(cin, cout, kernel, 1, form=self.form, **init, **(fmt if self.form == "matmul" else {}))

        self.stem = conv(self.in_channels, channels, 3)
        self.blocks = nn.CellList([nn.CellList([conv(channels, channels, 3), conv(channels, channels, 3, zero=True)])
                                   for _ in range(blocks)])
        self.policy_conv = conv(channels, 2, 1)
        self.value_conv = conv(channels, 1, 1)
        self.out_dim = 3 * self.height * self.width

    def construct(self, x):
        planes = columns(x, 0, self.plane_size).reshape(-1, self.height, self.width, self.in_channels)
        if not self.nhwc:
            planes = ops.transpose(planes, (0, 3, 1, 2))
        y = ops.relu(self.stem(self.pad(planes)))
        for block in self.blocks:
            y = ops.relu(y + block[1](self.pad(ops.relu(block[0](self.pad(y))))))
        p = ops.relu(self.policy_conv(y))
        v = ops.relu(self.value_conv(y))
        if self.nhwc:  # flattened in (C, H, W) order whichever form, as `ConvStack`: the same parameters
            p, v = ops.transpose(p, (0, 3, 1, 2)), ops.transpose(v, (0, 3, 1, 2))
        batch = y.shape[0]
        return ops.concat((p.reshape(batch, -1), v.reshape(batch, -1)), 1)


ENCODERS: dict[str, type[nn.Cell]] = {"mlp": FlatEncoder, "nature_cnn": NatureCNN, "minatar_cnn": MinAtarCNN,
                                      "resnet": BoardResNet}
"""`net.encoder` -> the encoder class, built as `cls(obs_space, spec)` (the heads' MLPs follow it)."""

NATURE_MIN_SIZE = 36
"""The smallest frame side Nature CNN's three layers leave a 1x1 output on."""


def encoder_size(name: str, obs_space: gym.Space) -> tuple[int, int, int]:
    """(parameters, features' width, activations per row) of encoder `name` on `obs_space`,
    without building it (`rlstack/budget.py`'s estimate)."""
    name = resolve_encoder(name, obs_space)
    cls = ENCODERS.get(name)
    if cls is None or not issubclass(cls, ConvEncoder):
        return 0, obs_dim_of(obs_space), 0
    (c, h, w), _ = image_layout(obs_space)
    params, activations = 0, c * h * w  # the scaled float32 frames
    for out, k, s in cls.LAYERS:
        params += out * c * k * k + out
        c, h, w = out, (h - k) // s + 1, (w - k) // s + 1
        activations += c * h * w
    return params + (c * h * w + 1) * cls.DENSE, cls.DENSE, activations + cls.DENSE


def resolve_encoder(name: str, obs_space: gym.Space) -> str:
    """`net.encoder` as built: `auto` is `nature_cnn` for image observations of at least
    `NATURE_MIN_SIZE` pixels a side (Atari's 84x84), `minatar_cnn` for smaller ones (MinAtar's
    10x10), `mlp` for every other observation; any other name as it is."""
    if name != "auto":
        return name
    if not is_image_space(obs_space):
        return "mlp"
    (_, h, w), _ = image_layout(obs_space)
    return "nature_cnn" if min(h, w) >= NATURE_MIN_SIZE else "minatar_cnn"

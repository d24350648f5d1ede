"""The memory budget of a run: a config whose sizes cannot fit is refused before anything is allocated.

`check_fits(cfg, *probe_spaces(cfg))` runs in `Trainer.__init__` before the vector env is made.
It estimates, by arithmetic on the config and one env's spaces, the bytes of each big consumer
(network parameters with their gradients and Adam state, replay buffer, rollout storage,
environments, activations, actor processes) and raises `ConfigError` naming the key, its value
and the memory it would need when the run cannot fit in the memory available. Without it,
`net.hidden=[100000,100000]` or `env.n_envs=100000000` end in a MemoryError deep inside numpy or
MindSpore, or in the kernel's OOM killer taking the machine's other processes down too.

The estimates lean high (they count the transient copies too), but every shipped config needs
well under 1 GiB of them, so a refusal means a size far beyond what the machine holds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlstack.collector import trajectory_specs
from rlstack.config import Config, ConfigError, OffPolicyConfig
from rlstack.encoders import encoder_size
from rlstack.envs import make_env
from rlstack.replay import FrameReplay
from rlstack.spaces import flat_masked_space, is_image_space, mask_dim_of, obs_dtype_of

KiB, MiB, GiB = 2**10, 2**20, 2**30
FLOAT = 4  # float32, the dtype of every parameter and stored observation

ENV_BYTES = 1 * MiB
"""One environment of a sync vector env: a conservative constant, not a measurement of the env
at hand (docs/PERFORMANCE.md#memory)."""

ASYNC_ENV_BYTES = 64 * MiB
"""One environment of `env.vector: async`: a Python process of its own."""

PROCESS_BYTES = 1 * GiB
"""A process running the MindSpore runtime: the learner (set aside from the budget) and each
actor (`actors`), with room for compiled graphs and allocator pools (docs/PERFORMANCE.md#memory)."""

MARGIN = 0.9
"""Fraction of the available memory a run may plan to fill; the rest is for what is not
estimated (Python objects, compiled graphs, file cache other processes need)."""

TRAINED_COPIES = 6
"""Float copies of each trained parameter: its value, its gradient, Adam's two moments, the
exported acting graph the in-process actor runs, and a checkpoint being written."""

TARGET_COPIES = 2
"""Float copies of each target-network parameter: its value and a checkpoint being written."""

ACTIVATION_COPIES = 16
"""Floats per row and hidden unit held by one graph call: a gradient step runs the torsos over
its minibatch several times (DQN: online on obs and next_obs, target; SAC: actor, twin critics,
target critics) and keeps each forward value for the backward pass, plus its gradient."""

INT32_ROWS = 2**31 - 1
"""PPO gathers its minibatches with an int32 row index (`algorithms/ppo.py`): a rollout of more
rows would wrap around instead of failing."""

_CGROUP = Path("/sys/fs/cgroup")
_MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class Need:
    """One big consumer of memory and the config keys that size it."""

    what: str
    """What holds the memory, e.g. `the replay buffer`."""
    keys: tuple[tuple[str, Any], ...]
    """(config key, value) pairs whose product `size` is (e.g. env.n_envs x train.n_steps)."""
    nbytes: int
    size: int
    """The number the bytes grow with: the product of the keys' values, or the widest layer."""
    power: int = 1
    """How the bytes grow with `size`: 1 linearly, 2 with its square (stacked wide layers)."""
    detail: str = ""
    """How the bytes were counted, for the message (e.g. `42 B per transition`)."""

    @property
    def setting(self) -> str:
        return " x ".join(f"{key}={value}" for key, value in self.keys)

    def shares_a_key(self, other: Need) -> bool:
        return bool({k for k, _ in self.keys} & {k for k, _ in other.keys})


def probe_spaces(cfg: Config) -> tuple[gym.Space, gym.Space]:
    """(observation space, action space) of one env of `cfg.env`, made and closed here, so the
    budget is checked before `make_vector_env` builds `env.n_envs` of them. These are the vector
    env's single-env spaces (the self-play games' vector env uses the same ones)."""
    env = make_env(cfg.env.id, cfg.env.kwargs, imports=cfg.env.imports, wrappers=cfg.env.wrappers)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def check_fits(cfg: Config, obs_space: gym.Space, action_space: gym.Space,
               available_bytes: int | None = None) -> None:
    """Raise ConfigError when the run `cfg` cannot fit in memory, naming the key, its value, the
    memory it would need and a value that fits; return quietly otherwise.

    `available_bytes` defaults to `available_memory()`; when that cannot be read only the sanity
    checks run. The run may plan to use MARGIN of it, less PROCESS_BYTES for its own runtime.
    """
    _check_positive(cfg)
    available = available_memory() if available_bytes is None else available_bytes
    if available is not None:
        needs = estimate(cfg, obs_space, action_space)
        usable = max(0, int(available * MARGIN) - PROCESS_BYTES)
        if sum(n.nbytes for n in needs) > usable:
            raise ConfigError(_refusal(needs, usable, available))
    _check_int32_rows(cfg)


def estimate(cfg: Config, obs_space: gym.Space, action_space: gym.Space) -> list[Need]:
    """The big consumers of memory of a run of `cfg` on these (single-env) spaces, largest
    first. Pure arithmetic: nothing is allocated."""
    obs_dim = gym.spaces.flatdim(obs_space)  # a masked Dict is stored flat (rlstack/spaces.py)
    obs_item = obs_dtype_of(obs_space).itemsize  # frames are stored as uint8
    discrete = isinstance(action_space, gym.spaces.Discrete)
    action_dim = int(action_space.n) if discrete else gym.spaces.flatdim(action_space)
    chunk = _chunk_bytes(cfg, obs_dim, action_dim, discrete, obs_item)
    encoder = encoder_size(cfg.net.encoder, flat_masked_space(obs_space))
    needs = [_network_need(cfg, encoder, action_dim), _env_need(cfg), _evaluation_need(cfg, obs_space),
             *_rollout_needs(cfg, chunk, obs_dim, action_dim, discrete, obs_item),
             *_replay_needs(cfg, obs_dim, action_dim, discrete, obs_item, obs_space, action_space),
             _activation_need(cfg, encoder[2])]
    if cfg.actors:
        per_actor = PROCESS_BYTES + cfg.env.n_envs * _env_bytes(cfg) + chunk
        needs.append(Need("the actor processes", (("actors", cfg.actors),), cfg.actors * per_actor, cfg.actors,
                          detail=f"~{human(per_actor)} each"))
    return sorted(needs, key=lambda n: n.nbytes, reverse=True)


def available_memory(meminfo: Path = _MEMINFO, cgroup: Path = _CGROUP) -> int | None:
    """Bytes this process can still allocate: MemAvailable of /proc/meminfo (else the free
    physical pages), capped by the room left under a cgroup memory limit, which /proc/meminfo
    does not show (a container's limit). None when nothing can be read."""
    found = _meminfo_available(meminfo)
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            found = None
    room = _cgroup_room(cgroup)
    if room is None:
        return found
    return room if found is None else min(found, room)


def _meminfo_available(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * KiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(root: Path) -> int | None:
    """Bytes left under this cgroup's memory limit (cgroup v2, else v1); None without a limit.
    The usage counts file cache; its inactive part is reclaimable, so it counts as room (as
    `docker stats` and the kubelet's working set do)."""
    for limit_file, usage_file, stat_file, cache_key in (
            (root / "memory.max", root / "memory.current", root / "memory.stat", "inactive_file"),
            (root / "memory/memory.limit_in_bytes", root / "memory/memory.usage_in_bytes",
             root / "memory/memory.stat", "total_inactive_file")):
        try:
            limit = limit_file.read_text().strip()
            usage = int(usage_file.read_text())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as a huge number
            return None
        return max(0, int(limit) - usage + _stat_value(stat_file, cache_key))
    return None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def human(nbytes: float) -> str:
    """Bytes in binary units: `512 B`, `21.3 GiB`, `1.2 TiB`."""
    if nbytes < KiB:
        return f"{int(nbytes)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"):
        nbytes /= KiB
        if nbytes < KiB or unit == "YiB":
            return f"{nbytes:,.1f} {unit}"
    raise AssertionError("unreachable")


# ----- the consumers ----------------------------------------------------------------------------

def _network_need(cfg: Config, encoder: tuple[int, int, int], action_dim: int) -> Need:
    """The heads on the encoder's features (the algorithm's own count) and the encoder they share
    (in the target network too, if the algorithm keeps one)."""
    encoder_params, features, _ = encoder
    trained, target = cfg.train.network_params(cfg.net.hidden, features, action_dim)
    trained, target = trained + encoder_params, target + (encoder_params if target else 0)
    hidden = list(cfg.net.hidden)
    critics = (("train.n_critics", cfg.train.n_critics),) if hasattr(cfg.train, "n_critics") else ()
    return Need("the networks' parameters, gradients and Adam state", (("net.hidden", hidden), *critics),
                FLOAT * (TRAINED_COPIES * trained + TARGET_COPIES * target), max(hidden, default=features),
                power=2 if len(hidden) > 1 else 1)


def _env_bytes(cfg: Config) -> int:
    return ASYNC_ENV_BYTES if cfg.env.vector == "async" else ENV_BYTES


def _env_need(cfg: Config) -> Need:
    n, each = cfg.env.n_envs, _env_bytes(cfg)
    return Need("the environments", (("env.n_envs", n),), n * each, n,
                detail=f"~{human(each)} each, a conservative constant")


def _evaluation_need(cfg: Config, obs_space: gym.Space) -> Need:
    """The evaluation runs `env.eval_episodes` envs side by side while the training envs live;
    on the two-player games (masked observations) the self-play matches play their games side by
    side instead, counted as envs too (a game is far smaller: this leans high)."""
    sizes = [("env.eval_episodes", cfg.env.eval_episodes)]
    if mask_dim_of(obs_space):
        sizes += [("selfplay.eval_games", cfg.selfplay.eval_games), ("selfplay.elo_games", cfg.selfplay.elo_games)]
    key, n = max(sizes, key=lambda item: item[1])
    return Need("the evaluation", ((key, n),), n * ENV_BYTES, n,
                detail=f"{n} envs or games side by side, ~{human(ENV_BYTES)} each")


def _chunk_steps(cfg: Config) -> tuple[str, int] | None:
    """The config key and value of the vector steps in one collector chunk, if the algorithm has one."""
    key = "train_freq" if isinstance(cfg.train, OffPolicyConfig) else "n_steps"
    return (f"train.{key}", getattr(cfg.train, key)) if hasattr(cfg.train, key) else None


def _chunk_bytes(cfg: Config, obs_dim: int, action_dim: int, discrete: bool, obs_item: int) -> int:
    """One collector chunk, as `rlstack.collector.trajectory_specs` lays it out (sizes multiplied
    here as Python ints: numpy's int64 product would wrap on hostile sizes)."""
    chunk = _chunk_steps(cfg)
    if chunk is None:
        return 0
    specs = trajectory_specs(chunk[1], cfg.env.n_envs, (obs_dim,), () if discrete else (action_dim,),
                             "int32" if discrete else "float32", isinstance(cfg.train, OffPolicyConfig),
                             "uint8" if obs_item == 1 else "float32")
    return sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize for s in specs)


def _rollout_needs(cfg: Config, chunk: int, obs_dim: int, action_dim: int, discrete: bool,
                   obs_item: int) -> list[Need]:
    """The collector's chunk; for an on-policy learner also its flattened copy with advantages
    (`rlstack.buffers.rollout_batch`), GAE's temporaries, the shuffled minibatch indices of every
    epoch (int64 permutations, then int32) and the variance pass of observation normalisation."""
    steps = _chunk_steps(cfg)
    if steps is None:
        return []
    rows = steps[1] * cfg.env.n_envs
    if not isinstance(cfg.train, OffPolicyConfig):
        obs_bytes, action_bytes = obs_item * obs_dim, FLOAT * (1 if discrete else action_dim)
        epochs = getattr(cfg.train, "n_epochs", 1)
        normalize = 2 * obs_bytes if cfg.net.normalize_obs else 0
        # flat copy: obs, action, logp, value, adv, ret; GAE: reward + gamma V, done, adv, ret;
        # PPO's is_weight and old_logp; per epoch an int64 permutation and its int32 copy
        chunk += rows * (obs_bytes + action_bytes + 4 * FLOAT + 16 + 2 * FLOAT + 12 * epochs + normalize)
    return [Need("the rollout storage", (("env.n_envs", cfg.env.n_envs), steps), chunk, rows)]


def _replay_needs(cfg: Config, obs_dim: int, action_dim: int, discrete: bool, obs_item: int,
                  obs_space: gym.Space, action_space: gym.Space) -> list[Need]:
    """The replay buffer, as rlstack/replay.py stores a transition (obs and next_obs float32, the
    action, reward float32, terminated and truncated bool; image observations as `FrameReplay`
    stores them, each frame once), and the K x B rows one update samples, gathered on the host and
    copied into Tensors (SAC adds two noise arrays); a search learner's replay of positions
    (`algorithms/alphazero.py`)."""
    tc = cfg.train
    if hasattr(tc, "replay_positions"):  # a search learner: obs, the search's distribution, the outcome
        row = FLOAT * (obs_dim + action_dim + 1)
        return [Need("the replay of positions", (("train.replay_positions", tc.replay_positions),),
                     tc.replay_positions * row, tc.replay_positions, detail=f"{row} B per position")]
    if not isinstance(tc, OffPolicyConfig):
        return []
    transition = 2 * obs_item * obs_dim + FLOAT * (1 if discrete else action_dim) + FLOAT + 1 + 1
    # sampled rows are gathered as stored, then packed as float32 columns for the update graph
    packed = 2 * FLOAT * obs_dim + FLOAT * (1 if discrete else action_dim) + FLOAT + 1 + 1
    sampled = tc.gradient_steps * tc.batch_size
    stored = tc.buffer_size * transition
    if is_image_space(obs_space):
        stored = FrameReplay.nbytes_for(tc.buffer_size, obs_space, action_space, cfg.env.n_envs)
    return [Need("the replay buffer", (("train.buffer_size", tc.buffer_size),), stored,
                 tc.buffer_size, detail=f"{stored // max(1, tc.buffer_size)} B per transition"),
            Need("the sampled minibatches of one update",
                 (("train.gradient_steps", tc.gradient_steps), ("train.batch_size", tc.batch_size)),
                 sampled * (transition + packed + 12 + 4 * FLOAT * action_dim), sampled)]


def _activation_need(cfg: Config, encoder_activations: int) -> Need:
    """The hidden activations of the largest graph call (a conv encoder's included): a minibatch
    step, acting on every env at once, the evaluation, or (PPO's `is_clip`) the learner's
    log-probabilities of a whole rollout."""
    tc, n_envs, hidden = cfg.train, cfg.env.n_envs, list(cfg.net.hidden)
    calls = [(("env.n_envs", n_envs),), (("env.eval_episodes", cfg.env.eval_episodes),)]
    if hasattr(tc, "batch_size"):
        calls.append((("train.batch_size", tc.batch_size),))
    if getattr(tc, "is_clip", None) is not None and hasattr(tc, "n_steps"):
        calls.append((("env.n_envs", n_envs), ("train.n_steps", tc.n_steps)))
    rows, keys = max((math.prod(value for _, value in keys), keys) for keys in calls)
    width = sum(hidden) + encoder_activations
    return Need("the activations of one graph call", keys, rows * width * FLOAT * ACTIVATION_COPIES, rows,
                detail=f"{rows:,} rows through net.hidden={hidden}"
                + (" after the conv encoder" if encoder_activations else ""))


# ----- checks and the refusal --------------------------------------------------------------------

def _check_positive(cfg: Config) -> None:
    """Sizes the estimate multiplies must be positive: nothing else checks `net.hidden`, or PPO's
    `n_steps` and `n_epochs` (a rollout of 0 rows passes its divisibility check)."""
    sizes = [(f"net.hidden[{i}]", width) for i, width in enumerate(cfg.net.hidden)]
    sizes += [(f"train.{key}", getattr(cfg.train, key)) for key in ("n_steps", "n_epochs") if hasattr(cfg.train, key)]
    for key, value in sizes:
        if value < 1:
            raise ConfigError(f"'{key}' must be >= 1, got {value}")


def _check_int32_rows(cfg: Config) -> None:
    """The one hard cap, for where memory is not the issue (a machine with terabytes): INT32_ROWS."""
    if hasattr(cfg.train, "n_steps") and not isinstance(cfg.train, OffPolicyConfig):
        rows = cfg.train.n_steps * cfg.env.n_envs
        if rows > INT32_ROWS:
            raise ConfigError(f"train.n_steps={cfg.train.n_steps} x env.n_envs={cfg.env.n_envs} = {rows:,} rows "
                              f"per rollout; PPO indexes rollout rows with int32, at most {INT32_ROWS:,}. "
                              "Lower train.n_steps or env.n_envs")


def _refusal(needs: list[Need], usable: int, available: int) -> str:
    """The message: the largest consumer with its key and size, the total, and a value that fits."""
    top, total = needs[0], sum(n.nbytes for n in needs)
    detail = f" ({top.detail})" if top.detail else ""
    text = (f"{top.setting} needs ~{human(top.nbytes)} for {top.what}{detail}; this machine has "
            f"{human(available)} available (a run may plan ~{human(usable)} of it)")
    if total > 1.05 * top.nbytes:
        parts = ", ".join(f"{n.what} {human(n.nbytes)}" for n in needs if n.nbytes >= total / 100)
        text += f"; the whole run needs ~{human(total)} ({parts})"
    # The consumers growing with the same keys shrink together; the others stay as they are.
    growing = sum(n.nbytes for n in needs if n.shares_a_key(top))
    room = usable - (total - growing)
    limit = int(top.size * (room / growing) ** (1 / top.power)) if room > 0 else 0
    if top.keys[0][0] == "net.hidden":
        advice = f"use narrower net.hidden layers (at most ~{limit:,} wide)" if limit else "use narrower net.hidden layers"
        advice += " or fewer train.n_critics" if len(top.keys) > 1 else ""
    else:
        name = " x ".join(key for key, _ in top.keys) + (f" (now {top.size:,})" if len(top.keys) > 1 else "")
        advice = f"lower {name} to at most ~{limit:,}" if limit else f"lower {name}"
    return f"{text}. To fit, {advice}."

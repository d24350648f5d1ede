"""The config schema (dataclasses) and its loading: YAML values, dotted CLI overrides, validation.

Every stage reads its settings from one resolved `Config`. The schema is the dataclasses below
plus the algorithm's own `train` dataclass (found in the registry by `algo`); YAML files hold
only values. OmegaConf does the merging and type checking; this module turns its errors into
messages that name the key and the closest valid keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from rlstack import registry
from rlstack.errors import RlstackError
from rlstack.schedules import parse_schedule

DEFAULT_CONFIG = "ppo_cartpole"
"""The shipped config `python -m rlstack.train` trains without `--config`."""


def shipped_configs() -> Path:
    """The folder of the shipped configs: `configs/` of a checkout, `rlstack/configs/` of a wheel."""
    import rlstack.configs

    return Path(rlstack.configs.__file__).resolve().parent


def config_path(name_or_path: str | Path) -> Path:
    """A config file by path, or a shipped config by name (`ppo_cartpole` or `ppo_cartpole.yaml`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if len(path.parts) == 1:
        shipped = shipped_configs() / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
        if shipped.is_file():
            return shipped
    names = sorted(p.stem for p in shipped_configs().glob("*.yaml"))
    raise ConfigError(f"config file '{name_or_path}' does not exist (shipped configs, by name: {', '.join(names)})")


class _Yaml12Loader(yaml.SafeLoader):
    """YAML with 1.2 booleans: only true/false are bools, so `fusion: on` stays the string 'on'."""


_Yaml12Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 (a SafeLoader subclass)


class ConfigError(RlstackError, ValueError):
    """A config file or override is wrong; the message says which key and what is valid."""


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"
    """Gymnasium environment id (any registered id, e.g. `Acrobot-v1`, `Pendulum-v1`), or
    gymnasium's `module:Id` (e.g. `my_pkg.envs:MyEnv-v0`: `my_pkg.envs` is imported first, in every
    process, and registers `MyEnv-v0`)."""
    imports: list[str] = field(default_factory=list)
    """Modules to import before any env is made, in the learner and in every actor process and Ray
    actor (e.g. `[my_pkg.envs]`, a module that calls `gymnasium.register` at import). Each must be
    importable in every process (installed, or on PYTHONPATH; on a Ray cluster, on every node)."""
    wrappers: list[str] = field(default_factory=list)
    """`module:Callable` entries (e.g. `[gymnasium.wrappers:FlattenObservation, my_pkg.envs:scale]`),
    each called in order on every single env right after `gymnasium.make` returns it
    (`env = fn(env)`, outside gymnasium's time limit and checker; rlstack adds no per-env wrappers),
    in training, evaluation and actor processes alike. They need one env object per copy:
    `env.vectorization: auto` is then per_env, and `native` is refused."""
    n_envs: int = 8
    """Number of environments stepped together in one vector env (one graph call per step)."""
    vector: str = "sync"
    """`sync` (one process, lowest overhead for cheap envs) or `async` (one process per env)."""
    vectorization: str = "auto"
    """`native`: the env's own batched implementation, every copy stepped at once in numpy arrays
    (CartPole-v0/v1, the self-play games); `per_env`: one env object per copy, stepped as
    `env.vector` says; `auto`: native when the id has one that takes `env.kwargs`, else per_env."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for `gymnasium.make`."""
    eval_episodes: int = 10
    """Episodes of the final deterministic evaluation (run side by side, one graph call per step)."""

    def __post_init__(self) -> None:
        # Imported and resolved where the config is resolved, so the ids the modules register exist
        # before this process makes an env, and a bad entry is a config error before anything starts.
        # Actor processes and Ray actors import them again themselves (rlstack.envs.make).
        if self.imports or self.wrappers:
            from rlstack.envs.make import EnvError, import_env_modules, resolve_wrappers

            try:
                import_env_modules(self.imports)
                resolve_wrappers(self.wrappers)
            except EnvError as err:
                raise ConfigError(str(err)) from None


@dataclass
class NetConfig:
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Hidden layer sizes of every MLP (policy, value and Q torsos are separate MLPs)."""
    activation: str = "tanh"
    """`tanh`, `relu`, `elu` or `gelu`."""
    normalize_obs: bool = False
    """Running mean/variance observation normalisation, applied inside the graph."""
    obs_clip: float = 10.0
    """Normalised observations are clipped to [-obs_clip, obs_clip]."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (state-independent, PPO)."""
    ortho_init: bool = True
    """Orthogonal initialisation (gain sqrt(2) for hidden layers, 0.01 policy, 1 value), as SB3;
    off: PyTorch's default (`nn.Linear`'s and `nn.Conv2d`'s uniform init), as SB3's `ortho_init=False`."""
    encoder: str = "auto"
    """What turns the observation into the heads' input, shared by every head: `mlp` (the flat
    observation), `nature_cnn` (Atari frames), `minatar_cnn` (MinAtar planes), `resnet` (AlphaZero's
    residual tower on a board game's planes: `blocks`, `channels`), or `auto` (a conv
    encoder for image observations by their size, `mlp` otherwise). Frames stay uint8 in storage
    and enter the graph as they are."""
    conv_form: str = "auto"
    """A conv encoder's convolutions: `matmul` (built from kernels fast on MindSpore's CPU),
    `native` (MindSpore's `nn.Conv2d`), `auto` (`matmul` on the CPU, `native` on Ascend and GPU)."""
    blocks: int = 6
    """`encoder: resnet` (a board game's planes): residual blocks of its tower."""
    channels: int = 64
    """`encoder: resnet`: channels of every 3x3 convolution of its tower."""


@dataclass
class TrainConfig:
    """Settings every algorithm shares; each algorithm extends this with its own fields."""

    total_steps: int = 100_000
    """Environment steps (summed over the vector env) to train for."""
    log_every_seconds: float = 10.0
    """Seconds between plain log lines when stdout is not a terminal."""
    checkpoint_every: int = 0
    """Write a checkpoint every this many updates (0: only at the end and by `checkpoint_minutes`)."""
    checkpoint_minutes: float = 10.0
    """Also write one when this many minutes of wall-clock time passed since the last (0: off), so
    a crash loses at most that much work."""
    keep_checkpoints: int = 3
    """How many checkpoints to keep on disk (older ones are removed)."""
    export_every: int = 0
    """Export the acting graph to `<out>/policy/v<N>` every this many updates (0: only at the end)."""
    keep_versions: int = 0
    """How many exported policy versions to keep (0: all; self-play draws opponents from them)."""
    progress: str = "auto"
    """`auto` (bar on a terminal, log lines otherwise), `bar`, `log` or `off`."""
    eval_every: int = 0
    """Deterministic evaluation (`env.eval_episodes` episodes) every this many environment steps,
    logged as `eval/mean_return` (0: only the final evaluation)."""
    keep_best: bool = False
    """With `eval_every` (or, on the two-player games, `selfplay.eval_every`): the final policy
    (export and `summary.json`'s evaluation) is the network of the best periodic evaluation instead
    of the last one, as SB3's EvalCallback best model. On the games the best evaluation is the one
    with the fewest losses to perfect play over every line (tic-tac-toe with perfect minimax), then
    to minimax in the sampled games, then to the random player, then the most wins against it
    (with `selfplay.eval_search`, the searching agent's results first, then the policy's own).
    The checkpoint keeps the last network, so `--resume` continues the run itself."""

    data_parallel: ClassVar[bool] = False
    """Whether the algorithm's learner runs data-parallel (`learner.workers` > 1)."""

    def network_params(self, hidden: Sequence[int], obs_dim: int, action_dim: int) -> tuple[int, int]:
        """(trained, target) parameter counts of the networks the algorithm builds, for the memory
        check before a run (`rlstack/budget.py`). By default a policy and a value MLP, and a target
        copy of both."""
        both = mlp_params(obs_dim, hidden, action_dim) + mlp_params(obs_dim, hidden, 1)
        return both, both


def mlp_params(in_dim: int, hidden: Sequence[int], out_dim: int) -> int:
    """Weights and biases of an MLP `in_dim -> hidden -> out_dim` (`rlstack.layers.mlp`)."""
    sizes = [in_dim, *hidden, out_dim]
    return sum((fan_in + 1) * fan_out for fan_in, fan_out in zip(sizes, sizes[1:], strict=False))


@dataclass
class OffPolicyConfig(TrainConfig):
    """Settings of the trainer's off-policy loop (names as in Stable-Baselines3 / RL Zoo)."""

    buffer_size: int = 1_000_000
    """Replay capacity in transitions (the oldest are overwritten)."""
    learning_starts: int = 100
    """Environment steps of uniformly random actions before the first update."""
    batch_size: int = 256
    """Transitions per gradient step."""
    train_freq: int = 1
    """Update every this many vector-env steps (each vector step is env.n_envs transitions)."""
    gradient_steps: int = 1
    """Gradient steps per update (each on a fresh minibatch)."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 1.0
    """Target-network update rate: 1.0 is a hard copy, < 1 Polyak averaging."""
    lr: str = "3e-4"
    """Adam learning rate: a number, or `lin_X` for a linear decay from X to 0."""
    checkpoint_replay: bool | None = None
    """Save the replay buffer with each checkpoint (None: only when its capacity is
    at most 128 MiB, so `--resume` continues with the same data)."""
    log_every_steps: int = 1000
    """Environment steps between TensorBoard points (training metrics are averaged in between)."""

    def validate(self, cfg: Config) -> None:
        for key in ("buffer_size", "batch_size", "train_freq", "gradient_steps", "log_every_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"'train.{key}' must be >= 1, got {getattr(self, key)}")
        if self.learning_starts < 0:
            raise ConfigError(f"'train.learning_starts' must be >= 0, got {self.learning_starts}")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"'train.tau' must be in (0, 1], got {self.tau}")
        if self.buffer_size < cfg.env.n_envs:
            raise ConfigError(f"'train.buffer_size' ({self.buffer_size}) must hold at least one vector step "
                              f"(env.n_envs = {cfg.env.n_envs})")
        try:
            parse_schedule(self.lr, "train.lr")
        except ValueError as err:
            raise ConfigError(str(err)) from None


@dataclass
class SelfPlayConfig:
    """Opponents and evaluation for the two-player game envs (`rlstack/TicTacToe-v0`,
    `rlstack/ConnectFour-v0`); ignored for other envs."""

    opponents: str = "latest"
    """Opponent pool of exported versions (`policy/v*`, one every train.export_every updates):
    `latest`, `uniform` over the last pool_size, or `gated` (a version joins when the learner
    scores >= gate_score against the pool). The uniform random player until the first export."""
    pool_size: int = 5
    """Versions the pool draws from (`uniform`, `gated`)."""
    gate_score: float = 0.55
    """`gated`: (wins + draws / 2) / games the learner needs against the pool to admit a version."""
    gate_min_games: int = 200
    """`gated`: games against the pool before the gate is checked."""
    opponent_sample: bool = True
    """Opponents sample their moves from their policy (False: their argmax move)."""
    opponent_epsilon: float = 0.0
    """Probability that an opponent's move is uniformly random instead (exploration)."""
    sparring: list[str] = field(default_factory=list)
    """Built-in sparring partners in the pool besides the versions: `random`, `minimax:D`, `perfect`,
    `mcts:N` (OpenSpiel's games)."""
    sparring_prob: float = 0.0
    """Probability that an episode's opponent is a sparring partner instead of a version."""
    eval_every: int = 0
    """Evaluate every this many updates (0: only at the end): W/D/L vs random, minimax, snapshots."""
    eval_games: int = 100
    """Games per evaluation match, seats alternating; the agent plays its argmax move."""
    minimax_depth: int = 2
    """Depth of the minimax evaluation opponent of the built-in games (>= 9 is perfect play on tic-tac-toe)."""
    mcts_simulations: int = 100
    """Simulations per move of the evaluation opponent of OpenSpiel's games: OpenSpiel's `MCTSBot`
    (UCT with random rollouts), the reference opponent of OpenSpiel's own AlphaZero results."""
    reference: str = "auto"
    """The evaluation's reference opponent (beside the random player; `train.keep_best` ranks by
    it): `minimax` (of `minimax_depth`: the built-in games, and OpenSpiel's with their rules),
    `mcts` (OpenSpiel's MCTS of `mcts_simulations`, OpenSpiel's games), `perfect` (the game solved:
    small games such as tic-tac-toe only), `auto` (minimax where it plays, else mcts on OpenSpiel's
    games, else a second random player)."""
    elo_snapshots: int = 3
    """Latest exported versions in the Elo table (with random, minimax and the current agent)."""
    elo_games: int = 20
    """Games per pair in the Elo round robin (all players sample their moves)."""
    eval_search: int = 0
    """Also evaluate the agent with tree search of this many simulations per move on its graph
    (`rlstack/search.py`), reported apart from its policy's moves (`eval/search/…`; 0: off)."""


@dataclass
class RayConfig:
    address: str | None = None
    """Unset: start a Ray instance on this machine (bound to 127.0.0.1); `auto` or `host:port`:
    join that running cluster (`ray start --head` on one machine, `ray start --address` on the others)."""
    cpus_per_actor: float = 1.0
    """CPUs Ray reserves for each actor (its scheduling; an actor steps its envs on one core)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each actor needs, e.g. `{rollout: 1}` to place actors only on nodes
    started with `ray start --resources='{"rollout": 8}'`."""
    max_restarts: int = 100
    """How often Ray restarts an actor whose process died; the chunk it was collecting is lost."""


@dataclass
class LearnerConfig:
    """Data-parallel learning (`rlstack/distributed.py`): N learner processes, each collecting with
    its own `env.n_envs` envs and averaging every minibatch gradient with the others."""

    workers: int = 1
    """Learner processes (PPO only). N >= 2: `python -m rlstack.train` starts N workers on this
    machine; rank r steps its own `env.n_envs` envs seeded `seed + r * 1_000_000`, all start from
    rank 0's network, every minibatch gradient is all-reduced (mean) before clipping and Adam, so
    the networks stay bitwise identical. `train.total_steps` counts the steps of all ranks (each
    update consumes N rollouts). Rank 0 alone writes the run directory. Not with `actors` >= 1 or
    `net.normalize_obs` (each rank's observation statistics would drift apart)."""
    master_port: int = 0
    """TCP port of MindSpore's cluster scheduler on 127.0.0.1 (0: a free port is picked)."""



@dataclass
class Config:
    algo: str = "ppo"
    """Algorithm name in the registry (`ppo`, `dqn`, `sac`, `td3`, `alphazero`, or a plug-in's)."""
    seed: int = 0
    """Seeds network initialisation, noise, and the environments (env i gets seed + i)."""
    device: str = "cpu"
    """`cpu`, `gpu` or `ascend`."""
    fusion: str = "auto"
    """Graph-kernel fusion: `auto` (on for Ascend/GPU, off on CPU), `on`, `off`."""
    parity: str = "fast"
    """`fast`, or `strict`: a batch-invariant network, so the exported graph acting at batch
    env.n_envs and the learner at any minibatch size agree bit for bit (parity/max_abs_logp = 0)."""
    actors: int = 0
    """0: collect in the learner process (still through the exported graph); N >= 1: N actor
    processes, each stepping its own env.n_envs envs and streaming rollouts to the learner."""
    actors_backend: str = "process"
    """Where the actors run: `process` (processes on this machine, weights and chunks through
    shared memory) or `ray` (Ray actors on a Ray cluster, everything through Ray's object store)."""
    ray: RayConfig = field(default_factory=RayConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    net: NetConfig = field(default_factory=NetConfig)
    train: Any = field(default_factory=TrainConfig)
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)


_CHOICES = {
    "device": ("cpu", "gpu", "ascend"),
    "fusion": ("auto", "on", "off"),
    "actors_backend": ("process", "ray"),
    "parity": ("fast", "strict"),
    "env.vector": ("sync", "async"),
    "env.vectorization": ("auto", "native", "per_env"),
    "net.activation": ("tanh", "relu", "elu", "gelu"),
    "net.encoder": ("auto", "mlp", "nature_cnn", "minatar_cnn", "resnet"),  # rlstack.encoders.ENCODERS, and auto
    "net.conv_form": ("auto", "native", "matmul"),  # rlstack.conv.FORMS
    "train.progress": ("auto", "bar", "log", "off"),
    "selfplay.opponents": ("latest", "uniform", "gated"),
    "selfplay.reference": ("auto", "minimax", "mcts", "perfect"),
}


def _schema(algo: str, train_class: Callable[[str], type] | None = None) -> DictConfig:
    """The whole config's schema with algorithm `algo`'s `train` class: the registered one, or
    `train_class(algo)`'s (the key docs' rebuilt class, rlstack/config_docs.py)."""
    try:
        train_cls = train_class(algo) if train_class is not None else registry.get(algo).config_cls
    except KeyError as err:
        raise ConfigError(str(err.args[0])) from None
    base = OmegaConf.structured(Config)
    base.train = OmegaConf.structured(train_cls)
    return base


def _valid_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, DictConfig):
        return []
    keys = []
    for k in node.keys():
        full = f"{prefix}{k}"
        keys.append(full)
        child = node._get_node(k)
        if isinstance(child, DictConfig) and OmegaConf.get_type(child) is not dict:
            keys.extend(_valid_keys(child, full + "."))
    return keys


def _explain(err: OmegaConfBaseException, schema: DictConfig, source: str) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, ConfigKeyError) or "not in" in str(err) or "Key '" in str(err):
        valid = _valid_keys(schema)
        parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
        siblings = [k for k in valid if k.startswith(parent) and "." not in k[len(parent):]]
        close = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
        msg = f"{source}: unknown config key '{key}'"
        if close:
            msg += f"; did you mean {', '.join(repr(c) for c in close)}?"
        msg += f" Valid keys here: {', '.join(siblings)}"
        return ConfigError(msg)
    if isinstance(err, ValidationError):
        expected = OmegaConf.select(schema, key, default=None)
        msg = f"{source}: wrong type for '{key}': {err.msg.splitlines()[0]}"
        if expected is not None:
            msg += f" (expected a value like {expected!r})"
        return ConfigError(msg)
    return ConfigError(f"{source}: {err.msg.splitlines()[0] if hasattr(err, 'msg') else err}")


def _parse_overrides(overrides: list[str]) -> dict[str, Any]:
    dotted: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. train.total_steps=50000)")
        key, _, raw = item.partition("=")
        dotted[key.strip()] = _yaml_load(raw) if raw != "" else ""
    return dotted


def _nest(dotted: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in dotted.items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{key}' conflicts with another override of '{part}'")
        node[parts[-1]] = value
    return nested


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> Config:
    """Resolve a config: schema defaults <- `base` (a saved config) or YAML file <- overrides.

    Raises ConfigError naming the offending key and the close matches.
    """
    overrides = overrides or []
    if base is None:
        path = config_path(path if path is not None else DEFAULT_CONFIG)
        try:
            values = _yaml_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        source = str(path)
    else:
        values, source = base, "saved config"
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys to values")
    dotted = _parse_overrides(overrides)
    algo = dotted.get("algo", values.get("algo", Config.algo))
    schema = _schema(str(algo))
    merged = schema
    for what, layer in ((source, values), ("command line", _nest(dotted))):
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as err:
            raise _explain(err, schema, what) from None
    cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    _check(cfg)
    return cfg


def _check(cfg: Config) -> None:
    for key, allowed in _CHOICES.items():
        value = OmegaConf.select(OmegaConf.structured(cfg), key)
        if value not in allowed:
            raise ConfigError(f"'{key}' is {value!r}; valid values: {', '.join(allowed)}")
    if cfg.env.n_envs < 1:
        raise ConfigError(f"'env.n_envs' must be >= 1, got {cfg.env.n_envs}")
    if cfg.actors < 0:
        raise ConfigError(f"'actors' must be >= 0 (0: collect in the learner process), got {cfg.actors}")
    if cfg.actors and cfg.actors_backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ConfigError("actors_backend: ray needs Ray, which is not installed: pip install -e \".[ray]\" "
                              "(or use actors_backend: process)")
        if cfg.ray.cpus_per_actor < 0 or cfg.ray.max_restarts < -1:
            raise ConfigError(f"'ray.cpus_per_actor' must be >= 0 and 'ray.max_restarts' >= -1 (-1: no limit), got "
                              f"{cfg.ray.cpus_per_actor} and {cfg.ray.max_restarts}")
    _check_learner(cfg)
    batch_size = getattr(cfg.train, "batch_size", None)
    if cfg.parity == "strict" and batch_size is not None:
        _check_strict_batch(batch_size)
    if cfg.train.total_steps < 1:
        raise ConfigError(f"'train.total_steps' must be >= 1, got {cfg.train.total_steps}")
    check = getattr(cfg.train, "validate", None)
    if check is not None:
        check(cfg)


def _check_learner(cfg: Config) -> None:
    workers, port = cfg.learner.workers, cfg.learner.master_port
    if workers < 1:
        raise ConfigError(f"'learner.workers' must be >= 1 (1: one learner process), got {workers}")
    if not (port == 0 or 1024 <= port <= 65535):
        raise ConfigError(f"'learner.master_port' must be 0 (pick a free port) or in 1024..65535, got {port}")
    if workers == 1:
        return
    if not type(cfg.train).data_parallel:
        able = [name for name in registry.names() if registry.get(name).config_cls.data_parallel]
        raise ConfigError(f"learner.workers={workers} is supported for algo: {', '.join(able)} only, not "
                          f"'{cfg.algo}' (use learner.workers=1)")
    if cfg.actors:
        raise ConfigError(f"learner.workers={workers} collects in each learner process: it cannot be combined "
                          f"with actors={cfg.actors} (use actors=0, or learner.workers=1)")
    if cfg.net.normalize_obs:
        raise ConfigError(f"learner.workers={workers} does not support net.normalize_obs: each rank's running "
                          "observation statistics would differ, and so would the networks (use net.normalize_obs=false)")


def _check_strict_batch(batch_size: int) -> None:
    from rlstack.network import BLOCK_ROWS  # imported here: the schema does not need MindSpore

    if batch_size % BLOCK_ROWS:
        raise ConfigError(f"parity: strict needs 'train.batch_size' to be a multiple of {BLOCK_ROWS} (the "
                          f"learner's graphs must see whole {BLOCK_ROWS}-row blocks), got {batch_size}")


def to_dict(cfg: Config) -> dict[str, Any]:
    """The resolved config as plain data (what is saved beside checkpoints and artifacts)."""
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def config_hash(cfg: Config) -> str:
    """sha256 of the resolved config, stable across runs (used in manifests)."""
    return hashlib.sha256(json.dumps(to_dict(cfg), sort_keys=True).encode()).hexdigest()

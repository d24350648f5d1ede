"""AlphaZero (Silver et al. 2018, https://arxiv.org/abs/1712.01815) for two-player games (the
built-in ones, OpenSpiel's, your own: rlstack/envs/state_games.py):
self-play by Monte Carlo tree search, a network trained on the search's move distributions and
the games' outcomes.

The network is the one network module with its categorical policy head (the legal-move mask in
the graph) and its value head; the search evaluates leaves with the exported acting graph, so
self-play, evaluation, `rlstack.play --search N` and the server all run what training exported
(`rlstack/search.py`). What differs from the paper:
- games are played side by side in the learner's process (`train.games`); each simulation is one
  graph call for all of them; no separate self-play workers;
- the network is the module's MLP (two heads on the flat board), not a residual tower;
- a replay of the most recent positions (`train.replay_positions`) instead of the last 500k
  games, and an update (`train.gradient_steps` Adam steps) after every `train.games_per_update`
  finished games;
- each sampled position is trained on in a random symmetry of the board (`train.augment`), as
  AlphaGo Zero did (AlphaZero dropped it to cover chess and shogi, which have no such symmetry);
- the value head is linear (no tanh) and trained by MSE to the outcome, as the paper's loss;
  L2 regularisation (Adam's `weight_decay`) is off by default (the update graph's kernel count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from rlstack import registry
from rlstack.buffers import pack_columns
from rlstack.collector import Trajectory
from rlstack.config import Config, ConfigError, TrainConfig
from rlstack.envs.games import ENV_IDS, GAME_ENV_ID, env_game, game_spec
from rlstack.graphcall import LeanCall, ParameterWrite, host_tensors, to_numpy, written_by
from rlstack.kernels import column, columns
from rlstack.network import NetSpec, Network, PolicyKind
from rlstack.registry import Progress
from rlstack.schedules import parse_schedule
from rlstack.search import SearchSettings, SelfPlayGames, acting_evaluator, outcome_targets


@dataclass
class AlphaZeroConfig(TrainConfig):
    games: int = 64
    """Self-play games played side by side (one graph call per simulation for all of them)."""
    games_per_update: int = 64
    """Finished games added to the replay before each update."""
    simulations: int = 32
    """Search simulations per move in self-play."""
    c_puct: float = 1.5
    """Exploration constant of the PUCT rule."""
    dirichlet_alpha: float = 0.5
    """Root noise Dir(alpha) in self-play (AlphaZero: about 10 / legal moves)."""
    dirichlet_fraction: float = 0.25
    """Weight of the root noise in the prior (self-play only; play and evaluation use none)."""
    temperature_moves: int = 2
    """Opening moves of each game sampled in proportion to the visits; later moves are the most visited."""
    replay_positions: int = 20_000
    """Most recent positions kept for training."""
    batch_size: int = 256
    """Positions per gradient step."""
    gradient_steps: int = 16
    """Adam steps per update, each on a fresh uniform sample of the replay."""
    lr: str = "1e-3"
    """Adam learning rate: a number, or `lin_X` for a linear decay from X to 0."""
    vf_coef: float = 1.0
    """Weight of the value loss against the policy cross-entropy."""
    augment: bool = True
    """Train on each sampled position in a random symmetry of the board, its policy target
    moved with it (Connect Four's mirror image, tic-tac-toe's 8 rotations and reflections), as
    AlphaGo Zero did: the rules are symmetric, so every position is worth 2 (8) positions. Games
    that declare no symmetries (`Game.symmetries()` None, e.g. OpenSpiel's Breakthrough) are trained on as played."""
    weight_decay: float = 0.0
    """L2 regularisation (Adam's weight decay). Off by default: it adds two kernels per
    parameter to the update graph, which crosses the 100-kernel line with a [64, 64] network
    (docs/PERFORMANCE.md#the-100-kernel-line)."""

    def validate(self, cfg: Config) -> None:
        if env_game(cfg.env.id, cfg.env.kwargs) is None:
            raise ConfigError(f"algo alphazero plays two-player games: env.id must be one of "
                              f"{', '.join([*ENV_IDS, GAME_ENV_ID])} (the last with env.kwargs.game, e.g. "
                              f"openspiel:othello), got '{cfg.env.id}'" + (" without env.kwargs.game"
                                                                           if cfg.env.id == GAME_ENV_ID else ""))
        try:
            game_spec(env_game(cfg.env.id, cfg.env.kwargs))
        except ValueError as err:
            raise ConfigError(f"env.kwargs.game: {err}") from None
        if cfg.actors:
            raise ConfigError("algo alphazero plays its self-play games by search in the learner's process; "
                              f"set actors: 0 (got {cfg.actors})")
        for key in ("games", "games_per_update", "simulations", "replay_positions", "batch_size", "gradient_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"'train.{key}' must be >= 1, got {getattr(self, key)}")
        if self.batch_size > self.replay_positions:
            raise ConfigError(f"'train.batch_size' ({self.batch_size}) must be <= 'train.replay_positions' "
                              f"({self.replay_positions})")
        try:
            parse_schedule(self.lr, "train.lr")
            self.search_settings()
        except ValueError as err:
            raise ConfigError(f"train: {err}") from None

    def search_settings(self) -> SearchSettings:
        return SearchSettings(simulations=self.simulations, c_puct=self.c_puct, dirichlet_alpha=self.dirichlet_alpha,
                              dirichlet_fraction=self.dirichlet_fraction)


class AlphaZeroLoss(nn.Cell):
    """Cross-entropy to the search's distribution plus vf_coef * MSE to the outcome, of a packed
    minibatch [B, D + n + 1] (obs, policy target, outcome); returns (loss, [policy_loss,
    value_loss, entropy])."""

    def __init__(self, network: Network, cfg: AlphaZeroConfig):
        super().__init__()
        self.network = network
        self.vf_coef = cfg.vf_coef
        self.obs_dim, self.n = network.obs_dim, network.action_dim

    def construct(self, batch):
        obs = columns(batch, 0, self.obs_dim)
        target = columns(batch, self.obs_dim, self.obs_dim + self.n)  # [B, n], 0 on illegal moves
        outcome = column(batch, self.obs_dim + self.n)  # [B]
        x = self.network.features(obs)
        _, logp_all = self.network.pi.logits(x, obs)  # illegal moves: -1e9, times a 0 target
        policy_loss = -(target * logp_all).sum(-1).mean()
        error = outcome - self.network.state_value(x)
        value_loss = (error * error).mean()
        entropy = -(ops.exp(logp_all) * logp_all).sum(-1).mean()
        return policy_loss + self.vf_coef * value_loss, ops.stack((policy_loss, value_loss, entropy))


class AlphaZeroStep(nn.Cell):
    """One gradient step: the loss's gradients and Adam, one graph under the 100-kernel line;
    returns [loss, policy_loss, value_loss, entropy]."""

    def __init__(self, network: Network, optimizer: nn.Optimizer, cfg: AlphaZeroConfig):
        super().__init__()
        self.network = network
        self.optimizer = optimizer
        self.grad = ops.value_and_grad(AlphaZeroLoss(network, cfg), None, optimizer.parameters, has_aux=True)

    def construct(self, batch):
        (loss, info), grads = self.grad(batch)
        self.optimizer(grads)
        return ops.concat((loss.reshape(1), info))


class PositionReplay:
    """The most recent positions (flat obs, policy target, outcome), packed as the step's columns;
    with `symmetries` (`GameSpec.symmetries()`) each sampled row comes in a random one of them."""

    def __init__(self, capacity: int, width: int, symmetries: tuple[np.ndarray, np.ndarray] | None = None):
        self.rows = np.zeros((capacity, width), np.float32)
        self.capacity, self.size, self.next = capacity, 0, 0
        self.permutations = None
        if symmetries is not None:  # [K, width]: obs and target permuted, the outcome (last) kept
            obs, moves = symmetries
            self.permutations = np.concatenate([obs, obs.shape[1] + moves, np.full((len(obs), 1), width - 1)], 1)

    def add(self, rows: np.ndarray) -> None:
        """Append rows, overwriting the oldest (as `rlstack.replay.ReplayBuffer.add` does)."""
        n, kept = len(rows), rows[-self.capacity:]  # more rows than the capacity: the newest stay
        index = (self.next + n - len(kept) + np.arange(len(kept))) % self.capacity
        self.rows[index] = kept
        self.next = int((self.next + n) % self.capacity)
        self.size = min(self.capacity, self.size + n)

    def sample(self, batch: int, rng: np.random.Generator) -> np.ndarray:
        index = rng.integers(0, self.size, batch)
        if self.permutations is None:
            return self.rows[index]
        columns = self.permutations[rng.integers(0, len(self.permutations), batch)]
        return self.rows[index[:, None], columns]


class SearchSource(registry.ChunkSource):
    """The learner's chunks for a search learner: the positions of `games_per_update` finished
    self-play games as a `Trajectory` of [P, 1] (one column of games, move after move) with the
    search's distributions in `policy_target`."""

    def __init__(self, games: SelfPlayGames, acting: Any, per_update: int):
        self.games, self.acting, self.per_update = games, acting, per_update

    def get(self) -> Trajectory:
        search_s, game_s = self.games.search_seconds, self.games.game_seconds
        record = self.games.play(self.per_update)
        p = len(record.action)
        chosen = record.policy[np.arange(p), record.action]
        column = np.zeros((p, 1), np.float32)
        return Trajectory(
            obs=record.obs[:, None], action=record.action[:, None], logp=np.log(chosen)[:, None],
            value=record.value[:, None], reward=record.reward[:, None], terminated=record.terminated[:, None],
            truncated=np.zeros((p, 1), bool), final_value=column, next_obs=None,
            version=np.full(p, self.acting.updates, np.int64), last_obs=np.zeros((1, record.obs.shape[1]), np.float32),
            last_value=np.zeros(1, np.float32), episode_returns=record.first_player_results,
            episode_lengths=record.lengths, actor=-1, env_seconds=self.games.game_seconds - game_s,
            act_seconds=self.games.search_seconds - search_s, policy_target=record.policy[:, None])

    def publish(self) -> None:
        """Nothing to send: the search's acting graph follows the live network itself."""


class AlphaZero(registry.Algorithm):
    """Search self-play on the shared network module: categorical policy (masked) plus value;
    root noise and the opening temperature explore."""

    data_path = registry.DataPath.OWN

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space):
        self.cfg: AlphaZeroConfig = cfg.train
        self.seed = cfg.seed
        self.spec = game_spec(env_game(cfg.env.id, cfg.env.kwargs))
        self.network = Network(obs_space, action_space, NetSpec.of(cfg.net, policy=PolicyKind.CATEGORICAL,
                                                                   value=True))
        if not self.network.masked:
            raise ConfigError("algo alphazero needs the game's masked observation (planes and legal-move mask)")
        self.lr = parse_schedule(self.cfg.lr, "train.lr")
        self.optimizer = nn.Adam(self.network.trainable_params(), learning_rate=Tensor(self.lr(1.0), ms.float32),
                                 weight_decay=self.cfg.weight_decay)
        self.chunk_steps = 1
        self.step = AlphaZeroStep(self.network, self.optimizer, self.cfg)
        self.update = LeanCall(self.step, state=written_by(self.step))
        self._lr = ParameterWrite([self.optimizer.learning_rate])
        self.replay = PositionReplay(self.cfg.replay_positions, self.network.obs_dim + self.network.action_dim + 1,
                                     self.spec.symmetries() if self.cfg.augment else None)
        self.games: SelfPlayGames | None = None

    def make_source(self, acting: Any, counters: Any, rng: np.random.Generator) -> SearchSource:
        """Self-play games searched with `acting` (the exported graph following this network)."""
        self.games = SelfPlayGames(self.spec, acting_evaluator(acting), self.cfg.search_settings(), self.cfg.games,
                                   self.cfg.temperature_moves, np.random.default_rng(self.seed + 1_000 * counters.updates))
        return SearchSource(self.games, acting, self.cfg.games_per_update)

    def state_cell(self) -> nn.Cell:
        return self.step

    def summary(self) -> dict[str, Any]:
        """`summary.json` entries: the self-play games' counts and rates (`SelfPlayGames.stats`)."""
        return {"selfplay/games": self.games.stats()} if self.games is not None else {}

    def learn(self, rollout: Trajectory, progress: Progress, rng: np.random.Generator) -> dict[str, float]:
        """Add a chunk's positions to the replay, then `gradient_steps` Adam steps on it."""
        if rollout.policy_target is None:
            raise ValueError("algo alphazero learns from search self-play chunks (policy_target), not env rollouts")
        obs = rollout.obs.reshape(-1, self.network.obs_dim)
        target = rollout.policy_target.reshape(len(obs), -1)
        outcome = outcome_targets(rollout.reward.reshape(-1), rollout.terminated.reshape(-1))
        self.replay.add(pack_columns((len(obs),), obs, target, outcome))
        lr = self.lr(progress.remaining)
        self._lr(lr)
        outputs = [self.update(*host_tensors(self.replay.sample(self.cfg.batch_size, rng)))
                   for _ in range(self.cfg.gradient_steps)]
        loss, policy_loss, value_loss, entropy = np.mean([to_numpy(out) for out in outputs], 0)
        games = self.games
        metrics = {"train/loss": float(loss), "train/policy_loss": float(policy_loss),
                   "train/value_loss": float(value_loss), "train/entropy": float(entropy),
                   "train/learning_rate": lr, "train/replay_positions": float(self.replay.size),
                   "rollout/first_player_score": float(np.mean(rollout.episode_returns))}
        if games is not None:
            metrics["rollout/graph_calls"] = float(games.calls)
            metrics["rollout/games"] = float(games.finished)
        return metrics


registry.register("alphazero", AlphaZeroConfig, AlphaZero)

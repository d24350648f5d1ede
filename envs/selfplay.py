"""Self-play for the env stage: the learner's single-agent view of a two-player game, opponents,
and the opponent pool of exported policy versions.

Each episode the learner takes the first or the second seat at random and plays one opponent
drawn from an `OpponentPool`; the learner only ever sees positions where it is to move, as the
flat masked observation `[planes, mask]` (rlstack/spaces.py). Rewards: +1 win, -1 loss, 0 draw,
given on the learner's step that ends the game (its own winning move, or the move the opponent
answers with a win).

`SelfPlayVectorEnv` steps N games in numpy arrays and computes the opponents' moves batched:
per step, one call per distinct opponent (for exported versions: one graph call through
`rlstack.acting.Acting`). A new episode in which the opponent opens needs an
opening move right away; those come from a per-opponent stock of opening moves that is refilled
inside the same batched call (the empty board is the same position in every game), so an
episode ending on the opponent's move costs no extra graph call.

The opponents are players (rlstack/envs/players.py): exported policy versions, and besides them
built-in sparring partners (`PoolSettings.sparring`, e.g. depth-2 minimax), the scripted members
of a league, drawn with a configurable probability. On tic-tac-toe pure PPO self-play improves slowly
(docs/PERFORMANCE.md#tictactoe-selfplay); a sparring partner supplies the opponent that punishes
every mistake, which self-play versions only become late.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from rlstack.envs.games import Game, game_spec
from rlstack.envs.players import Player, PolicyPlayer, RandomPlayer, load_player, make_player, moves

POOL_MODES = ("latest", "uniform", "gated")
SEATS = ("random", "first", "second")


@dataclass(frozen=True)
class PoolSettings:
    """How the opponent pool picks opponents (filled from the `selfplay:` config section)."""

    mode: str = "latest"
    """`latest` (the newest exported version), `uniform` (uniform over the last `size` versions) or
    `gated` (uniform over the last `size` versions admitted by the gate)."""
    size: int = 5
    gate_score: float = 0.55
    """Gated mode: the newest version joins the pool once the learner's score (wins + draws / 2)
    against the pool reaches this over at least `gate_min_games` games."""
    gate_min_games: int = 200
    sample: bool = True
    """Opponents sample their moves from their policy (False: they play their argmax move)."""
    epsilon: float = 0.0
    """Probability that an opponent's move is replaced by a uniformly random legal one, so the
    learner also meets (and learns to punish) positions its own versions avoid."""
    sparring: tuple[str, ...] = ()
    """Built-in sparring partners besides the versions (`make_player`'s names: `random`,
    `minimax:D`, `perfect`, `mcts:N`), as the scripted members of a league; drawn with probability
    `sparring_prob` per episode."""
    sparring_prob: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in POOL_MODES:
            raise ValueError(f"pool mode '{self.mode}' is unknown; valid: {', '.join(POOL_MODES)}")
        if self.size < 1:
            raise ValueError(f"pool size must be >= 1, got {self.size}")
        if not 0.0 <= self.sparring_prob <= 1.0:
            raise ValueError(f"sparring probability must be in [0, 1], got {self.sparring_prob}")
        if self.sparring_prob > 0.0 and not self.sparring:
            raise ValueError("a sparring probability > 0 needs sparring partners (e.g. ['minimax:2'])")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"opponent epsilon must be in [0, 1], got {self.epsilon}")
        if not 0.0 < self.gate_score <= 1.0:
            raise ValueError(f"gate score must be in (0, 1], got {self.gate_score}")


class OpponentPool:
    """Opponents for the learner: a fixed player, or exported versions from `<run>/policy/`.

    Until the first version is exported the pool holds the uniform random player. `refresh()`
    (called by the trainer after each update) picks up new versions; loaded graphs are cached,
    so a version stays playable after `train.keep_versions` removed it from disk.
    """

    def __init__(self, spec: Game, policy_dir: str | Path | None = None,
                 settings: PoolSettings | None = None, fixed: Player | None = None):
        self.spec = spec
        self.policy_dir = Path(policy_dir) if policy_dir is not None else None
        self.settings = settings or PoolSettings()
        self.fixed = fixed
        self.members: list[Player] = [fixed or RandomPlayer(spec)]
        self.gated: list[str] = []
        self.results: Counter[str] = Counter()
        """Learner's outcomes ('win', 'draw', 'loss') against the pool since the last admission."""
        self.totals: Counter[str] = Counter()
        self.played: Counter[str] = Counter()
        """Games per opponent name (versions, sparring partners), over the whole run."""
        self._loaded: dict[str, PolicyPlayer] = {}
        self.sparring: list[Player] = [make_player(spec, what) for what in self.settings.sparring]

    @classmethod
    def of(cls, spec: Game, player: Player) -> OpponentPool:
        """A pool that always draws `player`."""
        return cls(spec, fixed=player)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def sample(self, rng: np.random.Generator) -> Player:
        """An opponent for one episode: a sparring partner with probability `sparring_prob`,
        otherwise a member drawn uniformly."""
        if self.sparring and rng.random() < self.settings.sparring_prob:
            return self.sparring[int(rng.integers(len(self.sparring)))]
        return self.members[int(rng.integers(len(self.members)))]

    def record(self, outcomes: np.ndarray, opponents: list[str] | None = None) -> None:
        """The learner's finished games: +1 win, 0 draw, -1 loss each, against `opponents`
        (names; games against sparring partners do not count towards the gate)."""
        o = np.asarray(outcomes).reshape(-1)
        if opponents is not None:
            self.played.update(opponents)
        sparring = {p.name for p in self.sparring}
        gate = o if opponents is None else o[[name not in sparring for name in opponents]]
        for key, count in (("win", (o > 0).sum()), ("draw", (o == 0).sum()), ("loss", (o < 0).sum())):
            if count:
                self.totals[key] += int(count)
        for key, count in (("win", (gate > 0).sum()), ("draw", (gate == 0).sum()), ("loss", (gate < 0).sum())):
            if count:
                self.results[key] += int(count)

    @property
    def score(self) -> float | None:
        """(wins + draws / 2) / games against the pool since the last admission."""
        games = sum(self.results.values())
        return None if games == 0 else (self.results["win"] + 0.5 * self.results["draw"]) / games

    def _load(self, version_dir: Path) -> PolicyPlayer:
        name = version_dir.name
        if name not in self._loaded:
            self._loaded[name] = load_player(version_dir, self.spec, self.settings.sample)
        return self._loaded[name]

    def refresh(self) -> list[str]:
        """Re-read `policy/` and update the members; returns the names that joined."""
        if self.fixed is not None or self.policy_dir is None:
            return []
        from rlstack.artifact import list_versions

        versions = list_versions(self.policy_dir, scheduled=True)
        if not versions:
            return []
        before = set(self.names)
        s = self.settings
        if s.mode == "latest":
            chosen = versions[-1:]
        elif s.mode == "uniform":
            chosen = versions[-s.size:]
        else:
            newest = versions[-1].name
            games = sum(self.results.values())
            if newest not in self.gated and games >= s.gate_min_games and (self.score or 0.0) >= s.gate_score:
                self.gated.append(newest)
                self.results.clear()
            on_disk = {v.name: v for v in versions}
            chosen = [on_disk.get(name, self.policy_dir / name) for name in self.gated[-s.size:]]
            if not chosen:
                return []
        self.members = [self._load(v) for v in chosen]
        for name in set(self._loaded) - set(self.names):
            del self._loaded[name]
        return [n for n in self.names if n not in before]

    # ----- a pool inside an actor: it follows the learner's pool and reports its games back -----

    def follow(self, names: list[str], load: Callable[[str], Player]) -> None:
        """Make the members the learner's pool names (an actor's pool: the learner decides who
        plays, refresh() stays a no-op here). `load(name)` gives an exported version's player;
        loaded versions are cached while they stay members."""
        if self.fixed is not None or list(names) == self.names:
            return
        members = []
        for name in names:
            if name == "random":
                members.append(RandomPlayer(self.spec))
            else:
                if name not in self._loaded:
                    self._loaded[name] = load(name)
                members.append(self._loaded[name])
        self.members = members or [RandomPlayer(self.spec)]
        for name in set(self._loaded) - set(self.names):
            del self._loaded[name]

    def take_record(self) -> dict[str, dict[str, int]]:
        """The games recorded since the last call (for the learner's pool), then forget them."""
        record = {"results": dict(self.results), "totals": dict(self.totals), "played": dict(self.played)}
        self.results.clear()
        self.totals.clear()
        self.played.clear()
        return record

    def add_record(self, record: dict[str, dict[str, int]]) -> None:
        """Count games an actor's pool recorded (`take_record`) as if played here."""
        self.results.update(record.get("results", {}))
        self.totals.update(record.get("totals", {}))
        self.played.update(record.get("played", {}))

    def player(self, name: str) -> Player | None:
        """The opponent called `name`: a member, a sparring partner, the random player the pool
        starts with, or an exported version still on disk (games in progress may be against a
        version that has since left the pool). None if there is none."""
        for p in [*self.members, *self.sparring]:
            if p.name == name:
                return p
        if name == "random" and self.fixed is None:
            return RandomPlayer(self.spec)
        if self.policy_dir is not None and (self.policy_dir / name).is_dir():
            return load_player(self.policy_dir / name, self.spec, self.settings.sample)
        return None

    def state(self) -> dict[str, Any]:
        return {"gated": list(self.gated), "results": dict(self.results), "totals": dict(self.totals),
                "played": dict(self.played)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.gated = list(state.get("gated", []))
        self.results = Counter(state.get("results", {}))
        self.totals = Counter(state.get("totals", {}))
        self.played = Counter(state.get("played", {}))


def follower_pool(envs: Any, settings: dict[str, Any] | None) -> OpponentPool | None:
    """In an actor: give a self-play vector env a pool that follows the learner's (`settings`:
    the learner pool's `PoolSettings` as a dict, `pool_settings`); None for other envs."""
    if settings is None or not isinstance(envs, SelfPlayVectorEnv):
        return None
    pool = OpponentPool(envs.game, None, PoolSettings(**{**settings, "sparring": tuple(settings["sparring"])}))
    envs.set_pool(pool)
    return pool


def pool_settings(pool: OpponentPool) -> dict[str, Any] | None:
    """What an actor needs to build a pool that follows `pool` (None: a fixed opponent, which
    the actor's env builds itself from the same env kwargs)."""
    return None if pool.fixed is not None else asdict(pool.settings)


def _check_seat(seat: str) -> None:
    if seat not in SEATS:
        raise ValueError(f"seat '{seat}' is unknown; valid: {', '.join(SEATS)}")


class SelfPlayVectorEnv(gym.vector.VectorEnv):
    """N games of `game` against opponents from a pool; the learner is to move in every returned obs.

    Autoreset is SAME_STEP (as `make_vector_env`): the step that ends a game returns the first
    observation of the next one and puts the learner's view of the final board in
    `info["final_obs"]`. `info["learner_seat"]` is 0 (moves first) or 1 per env.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, game: str = "connect4", opponent: str = "random",
                 seat: str = "random", opponent_sample: bool = True):
        self.game: Game = game_spec(game)  # not `spec`: gymnasium sets env.spec to its EnvSpec
        _check_seat(seat)
        self.num_envs = num_envs
        self.seat = seat
        self.single_observation_space = self.game.flat_space()
        self.single_action_space = gym.spaces.Discrete(self.game.n_actions)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.pool = OpponentPool.of(self.game, make_player(self.game, opponent, sample=opponent_sample))
        self.boards = self.game.positions(num_envs)
        self.learner_seat = np.zeros(num_envs, np.int64)
        self.opponent: list[Player] = [self.pool.members[0]] * num_envs
        self.rng = np.random.default_rng()
        self._empty = self.game.positions(1)  # the opening position, identical in every game
        self._empty_obs = self._empty.flat_obs()
        self._openings: dict[str, list[int]] = {}
        self._random = RandomPlayer(self.game)
        self.opponent_calls = 0
        """Opponent `act` calls so far (graph calls for exported versions), for tests and benchmarks."""

    def set_pool(self, pool: OpponentPool) -> None:
        """Draw opponents from `pool` from the next episode on (the trainer attaches its pool)."""
        if pool.spec != self.game:
            raise ValueError(f"pool is for {pool.spec.name}, this env plays {self.game.name}")
        self.pool = pool

    # ----- gymnasium API -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._openings.clear()
        self._start(np.arange(self.num_envs))
        return self.boards.flat_obs(), {"learner_seat": self.learner_seat.copy()}

    def step(self, actions: np.ndarray):
        b, n = self.boards, self.num_envs
        actions = np.asarray(actions).reshape(n)
        everyone = np.arange(n)
        b.play(actions, everyone)  # the learner is to move in every game; illegal -> IllegalMoveError
        reward = np.zeros(n, np.float32)
        ended = b.over.copy()
        respond = np.flatnonzero(~ended)
        self._opponents_move(respond)
        done = b.over.copy()
        finished = np.flatnonzero(done)
        infos: dict[str, Any] = {}
        if len(finished):
            reward[finished] = b.result_for(self.learner_seat[finished], finished)
            self.pool.record(reward[finished], [self.opponent[i].name for i in finished])
            final = b.flat_obs(finished, self.learner_seat[finished])
            final_obs = np.empty(n, object)
            final_obs[finished] = list(final)
            infos = {"final_obs": final_obs, "_final_obs": done.copy()}
            self._start(finished)
        infos["learner_seat"] = self.learner_seat.copy()
        return b.flat_obs(), reward, done, np.zeros(n, bool), infos

    # ----- state, for exact resume (rlstack/envs/state.py) ------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The games in progress, their opponents (by name), the RNG and the opening stocks."""
        return {"boards": self.boards.take(np.arange(self.num_envs)), "learner_seat": self.learner_seat.copy(),
                "opponent": [p.name for p in self.opponent], "rng": self.rng.bit_generator.state,
                "openings": {k: list(v) for k, v in self._openings.items()}, "opponent_calls": self.opponent_calls}

    def set_state(self, state: dict[str, Any]) -> None:
        """Put `get_state`'s games back; every opponent must be found by `OpponentPool.player`
        (ValueError if not)."""
        players = {name: self.pool.player(name) for name in set(state["opponent"])}
        missing = sorted(name for name, p in players.items() if p is None)
        if missing or state["boards"].n != self.num_envs:
            raise ValueError(f"saved games need opponents {missing} that neither the pool nor the policy "
                             f"directory holds, or {state['boards'].n} games for {self.num_envs} envs")
        self.boards, self.learner_seat = state["boards"], state["learner_seat"]
        self.opponent = [players[name] for name in state["opponent"]]
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
        self._openings = {k: list(v) for k, v in state["openings"].items()}
        self.opponent_calls = state["opponent_calls"]

    # ----- episodes and opponents ------------------------------------------------------------

    def _start(self, idx: np.ndarray) -> None:
        """New games in `idx`: seats, opponents from the pool, opponents' opening moves."""
        b = self.boards
        b.reset(idx)
        if self.seat == "random":
            self.learner_seat[idx] = self.rng.integers(0, 2, len(idx))
        else:
            self.learner_seat[idx] = 0 if self.seat == "first" else 1
        for i in idx:
            self.opponent[i] = self.pool.sample(self.rng)
        opening = idx[self.learner_seat[idx] == 1]
        if not len(opening):
            return
        by_player = self._group(opening)
        for name, games in by_player.items():
            player = self.opponent[games[0]]
            stock = self._openings.setdefault(name, [])
            if len(stock) < len(games):
                # Only when this opponent has not been called yet (reset, or it just joined the
                # pool): every call tops its stock up to num_envs, more than one step can use.
                self._call(player, games[:0], len(games))
            b.play(np.array([stock.pop() for _ in games]), games)

    def _opponents_move(self, idx: np.ndarray) -> None:
        """One batched call per distinct opponent for the games in `idx` (opponent to move)."""
        for games in self._group(idx).values():
            self._call(self.opponent[games[0]], games)

    def _group(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        groups: dict[str, list[int]] = {}
        for i in idx:
            groups.setdefault(self.opponent[i].name, []).append(int(i))
        return {k: np.array(v, np.int64) for k, v in groups.items()}

    def _call(self, player: Player, games: np.ndarray, min_stock: int = 0) -> None:
        """Moves for `games`, plus opening moves topping the player's stock up, in one call."""
        stock = self._openings.setdefault(player.name, [])
        refill = max(self.num_envs, min_stock) - len(stock)
        if hasattr(player, "act_positions"):  # a search: its moves from the positions, its openings too
            if len(games):
                self.boards.play(moves(player, self.boards, games, self.rng), games)
            if refill > 0:
                stock.extend(int(a) for a in moves(player, self._empty, np.zeros(refill, np.int64), self.rng))
            self.opponent_calls += 1
            return
        rows = self.boards.flat_obs(games)
        if refill > 0:
            rows = np.concatenate([rows, np.repeat(self._empty_obs, refill, 0)])
        if not len(rows):
            return
        actions = np.asarray(player.act(rows, self.rng)).reshape(-1)
        self.opponent_calls += 1
        epsilon = self.pool.settings.epsilon
        if epsilon > 0.0:
            explore = self.rng.random(len(rows)) < epsilon
            if explore.any():
                actions[explore] = self._random.act(rows[explore], self.rng)
        if len(games):
            self.boards.play(actions[: len(games)], games)
        stock.extend(int(a) for a in actions[len(games):])


class SelfPlayEnv(gym.Env):
    """One game against one opponent per episode (what `gym.make(id)` returns); no autoreset.

    `opponent`: `random` (default), `minimax[:DEPTH]`, `perfect`, or a policy path; the trainer
    replaces it with its opponent pool through `set_pool`.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, game: str = "connect4", opponent: str = "random", seat: str = "random",
                 opponent_sample: bool = True, render_mode: str | None = None):
        self.game = game_spec(game)
        _check_seat(seat)
        self.seat = seat
        self.render_mode = render_mode
        self.observation_space = self.game.flat_space()
        self.action_space = gym.spaces.Discrete(self.game.n_actions)
        self.pool = OpponentPool.of(self.game, make_player(self.game, opponent, sample=opponent_sample))
        self.boards = self.game.positions(1)
        self.learner_seat = 0
        self.opponent: Player = self.pool.members[0]

    def set_pool(self, pool: OpponentPool) -> None:
        self.pool = pool

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.boards.reset()
        if self.seat == "random":
            self.learner_seat = int(self.np_random.integers(0, 2))
        else:
            self.learner_seat = 0 if self.seat == "first" else 1
        self.opponent = self.pool.sample(self.np_random)
        if self.learner_seat == 1:
            self._opponent_move()
        return self.boards.flat_obs()[0], {"learner_seat": self.learner_seat, "opponent": self.opponent.name}

    def _opponent_move(self) -> None:
        self.boards.play(moves(self.opponent, self.boards, np.zeros(1, np.int64), self.np_random))

    def step(self, action: int):
        b = self.boards
        b.play(np.array([action]))
        if not b.over[0]:
            self._opponent_move()
        info = {"learner_seat": self.learner_seat, "opponent": self.opponent.name}
        if b.over[0]:
            reward = float(b.result_for(np.array([self.learner_seat]))[0])
            self.pool.record(np.array([reward]), [self.opponent.name])
            return b.flat_obs(None, self.learner_seat)[0], reward, True, False, info
        return b.flat_obs()[0], 0.0, False, False, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self.boards.render(0)
        return None

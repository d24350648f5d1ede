"""PettingZoo AEC adapter for the two-player games, so they plug into that ecosystem.

`aec_env("connect4")` / `aec_env("tictactoe")` is a `pettingzoo.AECEnv` with agents `player_0`
(moves first) and `player_1`, the spaces and observation layout of PettingZoo's classic games
(`observe(agent)`: planes from that agent's perspective, `action_mask` all 0 unless it is that
agent's turn), win +1 / loss -1 / draw 0. Unlike PettingZoo's own games an illegal move raises
`IllegalMoveError` (nothing is played) instead of an assertion.

Needs the optional `pettingzoo` package (`pip install -e ".[pettingzoo]"`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlstack.envs.games import GameSpec, TwoPlayerGame, game_spec
from rlstack.spaces import MASK_KEY, OBS_KEY

try:
    from pettingzoo import AECEnv
    from pettingzoo.utils import AgentSelector
except ImportError as err:  # pragma: no cover - depends on the install
    raise ImportError("rlstack.envs.pettingzoo_env needs the pettingzoo package: "
                      "pip install -e \".[pettingzoo]\" (or pip install pettingzoo)") from err


class GameAECEnv(AECEnv):
    """One tic-tac-toe or Connect Four game under PettingZoo's agent-environment-cycle API."""

    metadata = {"render_modes": ["ansi"], "name": "rlstack_game_v0", "is_parallelizable": False}

    def __init__(self, game: str | GameSpec = "connect4", render_mode: str | None = None):
        super().__init__()
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.spec = game_spec(game)
        self.metadata = {**self.metadata, "name": f"rlstack_{self.spec.name}_v0"}
        self.render_mode = render_mode
        self.possible_agents = list(TwoPlayerGame.agents)
        self.observation_spaces = {a: self.spec.observation_space() for a in self.possible_agents}
        self.action_spaces = {a: gym.spaces.Discrete(self.spec.n_actions) for a in self.possible_agents}
        self.game = TwoPlayerGame(self.spec)

    def observation_space(self, agent: str) -> gym.spaces.Dict:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gym.spaces.Discrete:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.game.reset()
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self._agent_selector = AgentSelector(self.agents)
        self.agent_selection = self._agent_selector.reset()

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        player = self.possible_agents.index(agent)
        boards = self.game.boards
        planes = boards.planes(player=np.array([player]))[0]
        mask = np.zeros(self.spec.n_actions, np.int8)
        if agent == self.agent_selection:  # the legal mask is all 0 once the game is over
            mask = boards.legal_mask()[0].astype(np.int8)
        return {OBS_KEY: planes, MASK_KEY: mask}

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.game.step(int(action))  # IllegalMoveError before anything changes
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if self.game.done:
            for player, name in enumerate(self.possible_agents):
                self.rewards[name] = self.game.reward(player)
            self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = self._agent_selector.next()
        self._accumulate_rewards()

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode (use render_mode='ansi')")
            return None
        return self.game.render()

    def close(self) -> None:
        pass


def aec_env(game: str | GameSpec = "connect4", render_mode: str | None = None) -> GameAECEnv:
    """A PettingZoo AEC env of `game` (`connect4` or `tictactoe`)."""
    return GameAECEnv(game, render_mode)

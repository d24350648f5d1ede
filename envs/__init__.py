"""Environments: gymnasium adapters for training and evaluation, two-player games and self-play.

Importing this package registers the self-play game ids `rlstack/TicTacToe-v0` and
`rlstack/ConnectFour-v0` with gymnasium (as gymnasium's own packages do: a registry entry
with a lazy entry point, nothing else is loaded).
"""

from rlstack.envs.games import register_games
from rlstack.envs.make import EnvError, make_env, make_vector_env

register_games()

__all__ = ["EnvError", "make_env", "make_vector_env", "register_games"]

"""The algorithms (PPO, DQN, SAC), each one file, each registered by name for the trainer."""

from rlstack.algorithms import ppo  # noqa: F401  (registers "ppo")

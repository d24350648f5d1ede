"""The algorithms (PPO, DQN, SAC, AlphaZero), each one file, each registered by name for the trainer."""

from rlstack.algorithms import alphazero, dqn, ppo, sac  # noqa: F401  (register "alphazero", "dqn", "ppo", "sac")

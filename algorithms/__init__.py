"""The algorithms (PPO, DQN, SAC), each one file, each registered by name for the trainer."""

from rlstack.algorithms import dqn, ppo, sac  # noqa: F401  (register "dqn", "ppo", "sac")

"""Environments: gymnasium adapters for training and evaluation (two-player games come later)."""

from rlstack.envs.make import EnvError, make_env, make_vector_env

__all__ = ["EnvError", "make_env", "make_vector_env"]

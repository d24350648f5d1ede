"""The shipped configs (YAML), installed as package data of `rlstack.configs`; select one by name
(`python -m rlstack.train --config ppo_cartpole`) or by path."""

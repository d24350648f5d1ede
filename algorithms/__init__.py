"""The algorithms (PPO, DQN, SAC, AlphaZero), each one file that registers itself by name on import;
the trainer finds each through the `rlstack.algorithms` entry points (`pyproject.toml`), so this
package imports none of them (nor MindSpore) by itself."""

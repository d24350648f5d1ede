"""rlstack: reinforcement learning on MindSpore; the network that is trained is the graph that acts.

`import rlstack` is cheap: MindSpore loads when a submodule that needs it is first used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_policy"]


def __getattr__(name: str) -> Any:
    if name == "load_policy":
        from rlstack.acting import load_policy

        return load_policy
    raise AttributeError(f"module 'rlstack' has no attribute {name!r}")

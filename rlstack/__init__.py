"""rlstack: reinforcement learning on MindSpore; the network that is trained is the graph that acts.

`import rlstack` is cheap: MindSpore loads when a submodule that needs it is first used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Policy", "RlstackError", "__version__", "load_policy"]


def __getattr__(name: str) -> Any:
    if name in ("load_policy", "Policy"):  # (the acting module loads MindSpore)
        from rlstack import acting

        return getattr(acting, name)
    if name == "RlstackError":
        from rlstack.errors import RlstackError

        return RlstackError
    raise AttributeError(f"module 'rlstack' has no attribute {name!r}")

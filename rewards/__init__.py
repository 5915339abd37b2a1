"""Pure reward functions and a registry by name.

Contract: `(prompts, completions, **columns) -> list[float | None]`; None means the sample cannot
be verified and is skipped, not scored 0.
"""

from rewards.registry import REWARDS, get_reward

__all__ = ["REWARDS", "get_reward"]

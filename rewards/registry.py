"""Reward functions by the names that configs use."""

from __future__ import annotations

from collections.abc import Callable

from rewards.accuracy import accuracy_reward
from rewards.format import format_reward
from rewards.language import language_reward

RewardFn = Callable[..., list[float | None]]

REWARDS: dict[str, RewardFn] = {
    "accuracy": accuracy_reward,
    "format": format_reward,
    "language": language_reward,
}


def get_reward(name: str) -> RewardFn:
    try:
        return REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; known: {sorted(REWARDS)}") from None

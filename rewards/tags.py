"""Tag count: partial credit for each format tag that appears exactly once.

Softer than the all-or-nothing format reward, so a policy that gets some of the structure right
still sees a gradient toward the rest (the open-r1 recipe uses it alongside format).
"""

from __future__ import annotations

from rewards.format import TAGS


def tag_count(completion: str) -> float:
    return sum(0.25 for tag in TAGS if completion.count(tag) == 1)


def tag_count_reward(prompts: list[str], completions: list[str], **_: object) -> list[float | None]:
    return [tag_count(c) for c in completions]

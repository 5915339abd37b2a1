"""The format reward: 1 for a completion in the think/answer format (contracts.answer_format),
else 0."""

from __future__ import annotations

from contracts.answer_format import is_well_formed


def format_reward(prompts: list[str], completions: list[str], **_: object) -> list[float | None]:
    return [1.0 if is_well_formed(c) else 0.0 for c in completions]

"""The think/answer format: `<think> reasoning </think> <answer> summary </answer>`."""

from __future__ import annotations

import re

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_FORMAT = re.compile(r"\s*<think>(.+?)</think>\s*<answer>(.+?)</answer>\s*", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def is_well_formed(completion: str) -> bool:
    """One think block then one answer block, both non-empty, nothing around them."""
    if any(completion.count(tag) != 1 for tag in TAGS):
        return False
    match = _FORMAT.fullmatch(completion)
    return bool(match and match.group(1).strip() and match.group(2).strip())


def answer_block(completion: str) -> str | None:
    """Content of the last `<answer>` block, or None when there is none."""
    blocks = _ANSWER.findall(completion)
    return blocks[-1].strip() if blocks else None


def think_block(completion: str) -> str | None:
    match = _FORMAT.fullmatch(completion)
    return match.group(1).strip() if match else None


def format_reward(prompts: list[str], completions: list[str], **_: object) -> list[float | None]:
    return [1.0 if is_well_formed(c) else 0.0 for c in completions]

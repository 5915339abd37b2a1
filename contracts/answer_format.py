"""The think/answer format: `<think> reasoning </think> <answer> summary </answer>`.

A block counts only when its tags appear once each, in order, around visible text: whitespace,
zero-width and other format characters, or combining marks alone are not content.
"""

from __future__ import annotations

import re
import unicodedata

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_FORMAT = re.compile(r"\s*<think>(.+?)</think>\s*<answer>(.+?)</answer>\s*", re.DOTALL)
_INVISIBLE = {"Cc", "Cf", "Cn", "Co", "Cs", "Me", "Mn", "Zl", "Zp", "Zs"}


def has_visible_text(text: str) -> bool:
    """Whether `text` holds a character a reader sees (not space, format or a lone mark)."""
    return any(not ch.isspace() and unicodedata.category(ch) not in _INVISIBLE for ch in text)


def is_well_formed(completion: str) -> bool:
    """One think block then one answer block, both with visible text, nothing around them."""
    if any(completion.count(tag) != 1 for tag in TAGS):
        return False
    match = _FORMAT.fullmatch(completion)
    return bool(match and has_visible_text(match.group(1)) and has_visible_text(match.group(2)))


def block(completion: str, open_tag: str, close_tag: str) -> str | None:
    """The stripped text between the completion's one `open_tag` and its one `close_tag` after
    it, or None: no such block, tags repeated or out of order, or no visible text inside."""
    if completion.count(open_tag) != 1 or completion.count(close_tag) != 1:
        return None
    start = completion.index(open_tag) + len(open_tag)
    end = completion.index(close_tag)
    if end < start:
        return None
    text = completion[start:end].strip()
    return text if has_visible_text(text) else None


def answer_block(completion: str) -> str | None:
    """The content of the completion's one answer block: where the format says the answer
    stands. None when there is none, or more than one (an answer hedged over several blocks)."""
    return block(completion, ANSWER_OPEN, ANSWER_CLOSE)


def think_block(completion: str) -> str | None:
    match = _FORMAT.fullmatch(completion)
    return match.group(1).strip() if match else None


def formatted(reasoning: str, answer: str) -> str:
    """A completion in the format: `<think> reasoning </think> <answer> answer </answer>`."""
    return f"{THINK_OPEN} {reasoning} {THINK_CLOSE} {ANSWER_OPEN} {answer} {ANSWER_CLOSE}"

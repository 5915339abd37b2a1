"""Final-answer extraction from free text: GSM8K `#### 42` and MATH `\\boxed{42}` styles."""

from __future__ import annotations

import re

_HASHES = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # 1,600 -> 1600; (3, -1) and 1,2 are kept
_BOXES = ("\\boxed{", "\\fbox{")


def _last_box(text: str) -> tuple[int, str]:
    """Where the last `\\boxed{` or `\\fbox{` opens (-1: none), and which it is."""
    return max((text.rfind(box), box) for box in _BOXES)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, nested braces
    balanced."""
    start, box = _last_box(text)
    if start < 0:
        return None
    i = start + len(box)
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def final_answer_text(text: str) -> str:
    """The part of a solution that states the final answer.

    `#### 42` (GSM8K) gives what follows the last `####`, thousands separators dropped;
    `\\boxed{42}` (MATH; or `\\fbox{42}`) gives the last box's content; anything else is
    returned stripped, for the verifier to search.
    """
    if "####" in text:
        tail = text[text.rfind("####") :]
        match = _HASHES.match(tail)
        if match:
            return _THOUSANDS.sub("", match.group(1)).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    return text.strip()


def worked_solution(text: str) -> str:
    """`text` when it is a worked solution (reasoning before GSM8K's `#### 42` or before MATH's
    last `\\boxed{42}`), else "": a bare answer ("42", "\\boxed{42}") has no reasoning to learn."""
    stripped = text.strip()
    if "####" in stripped:
        reasoning = stripped[: stripped.rfind("####")]
    elif last_boxed(stripped) is not None:
        reasoning = stripped[: _last_box(stripped)[0]]
    else:
        return ""
    return stripped if any(ch.isalnum() for ch in reasoning) else ""

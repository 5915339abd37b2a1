"""Final-answer extraction from free text: GSM8K `#### 42` and MATH `\\boxed{42}` styles."""

from __future__ import annotations

import re

_HASHES = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # 1,600 -> 1600; (3, -1) and 1,2 are kept
_BOXES = ("\\boxed{", "\\fbox{")
_BOX_OPENS = re.compile(r"\\(?:boxed|fbox)\{")


def _last_box(text: str) -> tuple[int, str]:
    """Where the last `\\boxed{` or `\\fbox{` opens (-1: none), and which it is."""
    return max((text.rfind(box), box) for box in _BOXES)


def boxed_contents(text: str) -> list[str]:
    """The content of every closed `\\boxed{...}` and `\\fbox{...}` in `text`, in the order
    they open, nested braces balanced; one pass over the text, however many boxes it opens."""
    opens = {match.end() for match in _BOX_OPENS.finditer(text)}  # just past a box's `{`
    found: list[tuple[int, str]] = []
    open_boxes: list[tuple[int, int]] = []  # (where its content starts, the depth it opened at)
    depth = 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
            if i + 1 in opens:
                open_boxes.append((i + 1, depth))
        elif ch == "}":
            if open_boxes and open_boxes[-1][1] == depth:
                start, _ = open_boxes.pop()
                found.append((start, text[start:i].strip()))
            depth -= 1
    return [content for _, content in sorted(found)]


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, nested braces
    balanced; None where there is none or it is not closed."""
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

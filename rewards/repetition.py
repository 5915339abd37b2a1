"""Repetition penalty: minus the share of the completion's text that repeats, scaled.

A chain of thought stuck in a loop repeats itself; this pushes against it (as open-r1 does with
word n-grams). The text is normalised first (NFKC, case folded; punctuation, spaces and zero-width
and other format characters dropped), and the share is that of its runs of `chars` characters
seen before. So a loop cannot hide by varying case or punctuation, by invisible characters, or by
gluing its words together: every such disguise normalises to the same text, and the same share.
"""

from __future__ import annotations

import unicodedata

CHARS = 24


def _replacement(ch: str) -> str | None:
    """What `normalise` makes of one character: nothing for a format character, a space for
    punctuation, other controls and separators, else itself."""
    category = unicodedata.category(ch)
    if category == "Cf":
        return None
    return " " if category.startswith(("P", "C", "Z")) else ch


def normalise(text: str) -> str:
    """Case folded words, punctuation and format characters gone, one space between words."""
    text = unicodedata.normalize("NFKC", text).casefold()
    # one lookup per distinct character, the text itself rewritten by str.translate
    table = {ord(ch): _replacement(ch) for ch in set(text)}
    return " ".join(text.translate(table).split())


def repeated_ngram_share(text: str, n: int = 3) -> float:
    """Share of the normalised text's word n-grams seen before."""
    words = normalise(text).split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def repetition_share(text: str, chars: int = CHARS) -> float:
    """Share of the `chars`-long runs of the normalised text, spaces removed, seen before."""
    joined = normalise(text).replace(" ", "")
    runs = [joined[i : i + chars] for i in range(len(joined) - chars + 1)]
    return 1.0 - len(set(runs)) / len(runs) if runs else 0.0


def repetition_reward(
    prompts: list[str], completions: list[str], chars: int = CHARS, scale: float = 1.0, **_: object
) -> list[float | None]:
    return [-scale * repetition_share(c, chars) for c in completions]

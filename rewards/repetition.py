"""Repetition penalty: minus the share of repeated text, scaled.

A chain of thought stuck in a loop repeats itself; this pushes against it (as open-r1 does).
Repetition is measured twice on a normalised text (NFKC, case folded, zero-width and other
format characters and punctuation dropped), and the larger share counts: repeated word n-grams,
and repeated runs of `chars` characters with the spaces taken out, so that a loop cannot hide by
varying case or punctuation, by invisible characters, or by gluing its words together.
"""

from __future__ import annotations

import unicodedata

CHARS = 24


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return "".join(
        ch if not unicodedata.category(ch).startswith(("P", "C")) else " "
        for ch in text
        if unicodedata.category(ch) != "Cf"
    )


def repeated_ngram_share(text: str, n: int = 3) -> float:
    words = normalise(text).split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def repeated_run_share(text: str, chars: int = CHARS) -> float:
    """Share of the `chars`-long runs of the text (spaces removed) seen before."""
    joined = "".join(normalise(text).split())
    runs = [joined[i : i + chars] for i in range(len(joined) - chars + 1)]
    return 1.0 - len(set(runs)) / len(runs) if runs else 0.0


def repetition_share(text: str, n: int = 3) -> float:
    return max(repeated_ngram_share(text, n), repeated_run_share(text))


def repetition_reward(
    prompts: list[str], completions: list[str], n: int = 3, scale: float = 1.0, **_: object
) -> list[float | None]:
    return [-scale * repetition_share(c, n) for c in completions]

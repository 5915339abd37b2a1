"""Repetition penalty: minus the share of repeated word n-grams, scaled.

A chain of thought stuck in a loop repeats itself; this pushes against it (as open-r1 does).
"""

from __future__ import annotations


def repeated_ngram_share(text: str, n: int = 3) -> float:
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def repetition_reward(
    prompts: list[str], completions: list[str], n: int = 3, scale: float = 1.0, **_: object
) -> list[float | None]:
    return [-scale * repeated_ngram_share(c, n) for c in completions]

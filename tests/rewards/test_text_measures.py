"""The text measures the rewards and the guard's signals read (normalised text, letters per
script) against their slow one-character-at-a-time definitions, on hostile text: format and
zero-width characters, combining marks, other scripts, punctuation, controls, ligatures."""

from __future__ import annotations

import random
import unicodedata
from collections import Counter

from problems.scripts import char_script, script_counts, strip_markup
from rewards.repetition import normalise

ALPHABET = (
    "abc XYZ αβγ ΑΒΓ ϝϙ 123 .,;!?-–—()[]{}<>/\\'\"\t\n\r\x00\x07\u00a0\u2009\u3000"
    "\u200b\u200c\u200d\u2060\ufeff\u00ad\u0301\u0308ﬁﬂ①Ⅻ㎏ＡＢ中文字ك\u202e\u2028"
)


def slow_normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    kept = (
        " " if unicodedata.category(ch).startswith(("P", "C", "Z")) else ch
        for ch in text
        if unicodedata.category(ch) != "Cf"
    )
    return " ".join("".join(kept).split())


def slow_script_counts(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for ch in strip_markup(text):
        script = char_script(ch)
        if script:
            counts[script] += 1
    return counts


def texts(n: int = 300) -> list[str]:
    rng = random.Random(0)
    samples = ["", " ", "<think>αβ</think><answer> \\frac{1}{2} </answer>", "\u200b" * 5]
    for _ in range(n):
        samples.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 80))))
    return samples


def test_normalise_is_its_one_character_at_a_time_definition():
    for text in texts():
        assert normalise(text) == slow_normalise(text), repr(text)


def test_script_counts_are_their_one_character_at_a_time_definition():
    for text in texts():
        assert script_counts(text) == slow_script_counts(text), repr(text)

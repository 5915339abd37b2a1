"""Language consistency: the share of the completion's letters in the prompt's script.

DeepSeek-R1 adds this as a reward to stop the chain of thought from mixing languages; the same
measure filters cold-start traces and gives the evaluation's language-consistency rate.
"""

from __future__ import annotations

import re

from contracts.answer_format import ANSWER_CLOSE, ANSWER_OPEN, answer_block, think_block
from problems.scripts import script_counts, script_share

CONSISTENT_AT = 0.95
_FENCED = re.compile(r"```.*?```", re.DOTALL)


def prose(completion: str) -> str:
    """The completion without the code fenced in its answer block: a program is written in
    Python whatever the language of the reasoning around it. Code anywhere else counts."""
    block = answer_block(completion)
    if block is None or "```" not in block:
        return completion
    start = completion.index(ANSWER_OPEN)
    end = completion.index(ANSWER_CLOSE)
    return completion[:start] + _FENCED.sub(" ", completion[start:end]) + completion[end:]


def language_consistency(completion: str, language: str) -> float:
    """Share of the completion's letters (the answer's code aside) in `language`'s script."""
    return script_share(prose(completion), language)


def is_language_consistent(
    completion: str, language: str, threshold: float = CONSISTENT_AT
) -> bool:
    return language_consistency(completion, language) >= threshold


def reasoning_language_share(text: str, language: str) -> float:
    """Share of the letters of `text` in `language`'s script; 0.0 with no letters at all (a
    reasoning with no words is not rewarded as consistent)."""
    counts = script_counts(text)
    total = sum(counts.values())
    return counts[language] / total if total else 0.0


def language_reward(
    prompts: list[str], completions: list[str], language: list[str], **_: object
) -> list[float | None]:
    """Share of the reasoning (the think block, else the whole completion) in the target script,
    the language-consistency reward of DeepSeek-R1's reasoning RL."""
    rewards: list[float | None] = []
    for completion, lang in zip(completions, language, strict=True):
        reasoning = think_block(completion)
        rewards.append(reasoning_language_share(reasoning if reasoning else completion, lang))
    return rewards

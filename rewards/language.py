"""Language consistency: the share of the completion's letters in the prompt's script.

DeepSeek-R1 adds this as a reward to stop the chain of thought from mixing languages; the same
measure filters cold-start traces and gives the evaluation's language-consistency rate.
"""

from __future__ import annotations

from problems.scripts import script_counts, script_share
from rewards.format import think_block

CONSISTENT_AT = 0.95


def language_consistency(completion: str, language: str) -> float:
    return script_share(completion, language)


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

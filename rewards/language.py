"""Language consistency: the share of the completion's letters in the prompt's script.

DeepSeek-R1 adds this as a reward to stop the chain of thought from mixing languages; the same
measure filters cold-start traces and gives the evaluation's language-consistency rate.
"""

from __future__ import annotations

from problems.scripts import script_share

CONSISTENT_AT = 0.95


def language_consistency(completion: str, language: str) -> float:
    return script_share(completion, language)


def is_language_consistent(
    completion: str, language: str, threshold: float = CONSISTENT_AT
) -> bool:
    return language_consistency(completion, language) >= threshold


def language_reward(
    prompts: list[str], completions: list[str], language: list[str], **_: object
) -> list[float | None]:
    return [language_consistency(c, lang) for c, lang in zip(completions, language, strict=True)]

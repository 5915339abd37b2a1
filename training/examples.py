"""Token-level training examples: plain language modelling, and completion-only SFT."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

IGNORE = -100  # label that the loss skips


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]


def lm_examples(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int
) -> list[Example]:
    """Every token is a target (pretraining)."""
    examples = []
    for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        ids = ids[:max_length]
        examples.append(Example(ids, list(ids)))
    return examples


def sft_examples(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    completions: Sequence[str],
    max_length: int,
) -> list[Example]:
    """Prompt tokens are context only; the loss falls on the completion tokens."""
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    examples = []
    for p, c in zip(prompt_ids, completion_ids, strict=True):
        ids = (p + c)[:max_length]
        labels = ([IGNORE] * len(p) + c)[:max_length]
        if any(label != IGNORE for label in labels):
            examples.append(Example(ids, labels))
    return examples

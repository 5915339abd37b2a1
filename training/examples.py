"""Token-level training examples: plain language modelling, and completion-only SFT.

An example longer than the stage's `max_length` is cut to it; one cut so far that no target
token is left is dropped. Each builder returns its examples with how many of each (`Examples.cuts`),
for the stage to log and warn about: nothing is cut without a word.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from models.chat import render_completions, render_prompt

IGNORE = -100  # label that the loss skips

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]


@dataclass(frozen=True)
class Cuts:
    """What `max_length` cut from a set of examples."""

    examples: int  # examples given
    cut: int  # longer than max_length: cut to it (dropped ones included)
    dropped: int  # no target token left after the cut: left out
    tokens_cut: int
    max_length: int

    def metrics(self) -> dict[str, float]:
        return {
            "data/examples": float(self.examples),
            "data/truncated_examples": float(self.cut),
            "data/dropped_examples": float(self.dropped),
            "data/truncated_tokens": float(self.tokens_cut),
        }

    def report(self, log_metrics: Callable[[dict[str, float]], None], desc: str) -> None:
        """Log the counts (`data/truncated_examples`, ...) and warn when anything was cut."""
        log_metrics(self.metrics())
        if self.cut:
            log.warning(
                "%s: %d of %d examples are longer than max_length %d and were cut (%d tokens; "
                "%d left with no target and dropped): raise max_length or filter by length",
                desc,
                self.cut,
                self.examples,
                self.max_length,
                self.tokens_cut,
                self.dropped,
            )


class Examples(list[Example]):
    """A list of examples that also says what `max_length` cut from them."""

    def __init__(self, examples: list[Example], cuts: Cuts):
        super().__init__(examples)
        self.cuts = cuts


def lm_examples(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int
) -> Examples:
    """Every token is a target (pretraining)."""
    examples, cut, tokens_cut = [], 0, 0
    for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        if len(ids) > max_length:
            cut, tokens_cut = cut + 1, tokens_cut + len(ids) - max_length
        ids = ids[:max_length]
        examples.append(Example(ids, list(ids)))
    return Examples(examples, Cuts(len(texts), cut, 0, tokens_cut, max_length))


def sft_examples(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    completions: Sequence[str],
    max_length: int,
) -> Examples:
    """Prompt tokens are context only; the loss falls on the completion tokens."""
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    examples, cut, dropped, tokens_cut = [], 0, 0, 0
    for p, c in zip(prompt_ids, completion_ids, strict=True):
        if len(p) + len(c) > max_length:
            cut, tokens_cut = cut + 1, tokens_cut + len(p) + len(c) - max_length
        ids = (p + c)[:max_length]
        labels = ([IGNORE] * len(p) + c)[:max_length]
        if any(label != IGNORE for label in labels):
            examples.append(Example(ids, labels))
        else:
            dropped += 1
    return Examples(examples, Cuts(len(prompt_ids), cut, dropped, tokens_cut, max_length))


def dataset_examples(
    tokenizer: PreTrainedTokenizerBase, dataset_path: Path, max_length: int
) -> Examples:
    """The SFT examples of a saved dataset: the rendered question as context, the rendered
    completion as the target."""
    from datasets import load_from_disk  # here: the training workers' other paths need none

    rows = load_from_disk(str(dataset_path))
    return sft_examples(
        tokenizer,
        [render_prompt(tokenizer, q) for q in rows["question"]],
        render_completions(tokenizer, rows["completion"]),
        max_length,
    )

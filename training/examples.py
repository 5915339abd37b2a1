"""Token-level training examples: plain language modelling, and completion-only SFT.

An example longer than the stage's `max_length` is cut to it; one cut so far that no target
token is left is dropped. Each builder returns its examples with how many of each (`Examples.cuts`),
for the stage to log and warn about: nothing is cut without a word.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from models.chat import render_completions, render_prompt

IGNORE = -100  # label that the loss skips
# Texts handed to the tokenizer at once. Its output for a batch holds every token's text and
# offsets beside the ids; a whole corpus at once (NuminaMath's 860k solutions) held all of them
# until the last text was encoded, gigabytes more than the ids kept.
TOKENIZE_CHUNK = 1024

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


def token_ids(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> Iterator[list[int]]:
    """Each text's token ids, in order, tokenised TOKENIZE_CHUNK texts at a time (the same ids
    as all at once: each text is encoded on its own), so memory holds the ids the caller keeps,
    not the tokenizer's whole output for every text."""
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = list(texts[start : start + TOKENIZE_CHUNK])
        yield from tokenizer(chunk, add_special_tokens=False, return_attention_mask=False)[
            "input_ids"
        ]


def lm_examples(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int
) -> Examples:
    """Every token is a target (pretraining)."""
    examples, cut, tokens_cut = [], 0, 0
    for ids in token_ids(tokenizer, texts):
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
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    examples, cut, dropped, tokens_cut = [], 0, 0, 0
    pairs = zip(token_ids(tokenizer, prompts), token_ids(tokenizer, completions), strict=True)
    for p, c in pairs:
        if len(p) + len(c) > max_length:
            cut, tokens_cut = cut + 1, tokens_cut + len(p) + len(c) - max_length
        ids = (p + c)[:max_length]
        labels = ([IGNORE] * len(p) + c)[:max_length]
        if any(label != IGNORE for label in labels):
            examples.append(Example(ids, labels))
        else:
            dropped += 1
    return Examples(examples, Cuts(len(prompts), cut, dropped, tokens_cut, max_length))


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

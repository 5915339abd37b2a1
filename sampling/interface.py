"""What every sampler backend takes and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy decoding; top_p 1 keeps the whole vocabulary (no top-k cut).

    Randomness is per prompt: prompt i of a call draws from a stream named by (seed,
    prompt_offset + i), whatever else is in the call. A data-parallel rank that samples a share
    of a step's prompts passes the index of its first prompt as `prompt_offset` and draws what
    one process sampling all of them would.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0
    prompt_offset: int = 0


@dataclass(frozen=True)
class Completion:
    """One sample. `token_ids` end with the stop token when `finish_reason` is "stop"; `text` is
    their decoding without special tokens, stripped.

    `logprobs[t]` is the log-probability of `token_ids[t]` under the distribution it was drawn
    from: log-softmax of the logits divided by the temperature, renormalised over the top-p
    nucleus. At temperature 1 and top_p 1 that is the model's own log-softmax; greedy decoding
    reports the model's log-softmax at temperature 1.
    """

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]

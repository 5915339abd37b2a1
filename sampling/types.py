"""What every sampler backend takes and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]
    logprobs: list[float]  # of each sampled token under the sampling distribution
    finish_reason: Literal["stop", "length"]

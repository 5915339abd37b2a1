"""Sampler backends: `generate(prompts, n, params) -> completions`; `hf` runs on CPU."""

from sampling.types import Completion, SamplingParams

__all__ = ["Completion", "SamplingParams"]

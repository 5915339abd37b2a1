"""Sampler backends: `generate(prompts, n, params) -> completions`.

`hf` (sampling/hf.py) decodes in this process on CPU; `vllm` (sampling/vllm.py) on GPUs;
`sampling.factory.make_sampler` picks one by name.
"""

from sampling.interface import Completion, SamplingParams

__all__ = ["Completion", "SamplingParams"]

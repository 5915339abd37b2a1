"""The GPU backend: vLLM's offline `LLM` engine behind the same `generate` as the CPU sampler.

vllm is imported inside the class, so this module imports (and its mapping is testable) on
machines without it; it comes with the `gpu` extra (`pip install -e .[gpu]`), and has no CPU wheel.

Logprobs keep the meaning the CPU sampler gives them: the engine runs with
`logprobs_mode="processed_logprobs"`, so each is the sampled token's log-probability under the
distribution it was drawn from (after temperature and top-p), not the raw model distribution
that vLLM reports by default. Each request asks for `logprobs=0`: only the sampled token's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from models.chat import stop_token_ids
from sampling.types import Completion, SamplingParams

FINISH_REASONS = {"stop": "stop", "length": "length"}

# Seeds of successive prompts in one call: far apart so no two prompts share a random stream.
SEED_STRIDE = 1_000_003


class VLLMOutput(Protocol):
    """The part of vLLM's `CompletionOutput` that the mapping reads."""

    text: str
    token_ids: Sequence[int]
    logprobs: Sequence[Mapping[int, Any]] | None  # per position: token id -> Logprob
    finish_reason: str | None


def sampled_logprob(entry: Any) -> float:
    """A `Logprob` object's value (plain floats are accepted too)."""
    return float(getattr(entry, "logprob", entry))


def completion_from_vllm(output: VLLMOutput) -> Completion:
    """One vLLM completion as ours: stripped text, token ids, sampled tokens' logprobs, finish."""
    reason = FINISH_REASONS.get(output.finish_reason or "")
    if reason is None:
        raise ValueError(f"vLLM finished a sequence with {output.finish_reason!r}")
    ids = list(output.token_ids)
    if output.logprobs is None:
        raise ValueError("vLLM returned no logprobs: the request must set logprobs=0")
    logprobs = [sampled_logprob(output.logprobs[i][t]) for i, t in enumerate(ids)]
    return Completion(output.text.strip(), ids, logprobs, reason)  # type: ignore[arg-type]


def completions_from_request(request_output: Any) -> list[Completion]:
    """The n completions of one `RequestOutput`, in sample-index order."""
    outputs = sorted(request_output.outputs, key=lambda o: getattr(o, "index", 0))
    return [completion_from_vllm(o) for o in outputs]


def request_seeds(seed: int, n_prompts: int, prompt_offset: int = 0) -> list[int]:
    """One seed per prompt: vLLM seeds each request's generator with its own `seed`, so prompts
    sharing one would share their random draws. Prompt i's seed depends on `prompt_offset + i`
    only (SamplingParams). Kept within a signed 64-bit integer."""
    return [(seed * SEED_STRIDE + prompt_offset + i) % 2**63 for i in range(n_prompts)]


class VLLMSampler:
    """`generate(prompts, n, params)` on vLLM; prompts are sent as text, already templated."""

    def __init__(
        self,
        model_path: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        seed: int = 0,
        max_model_len: int | None = None,
        **engine_kwargs: Any,
    ):
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(
                "the vllm sampler needs vLLM, which is not installed: install the `gpu` extra "
                "(pip install -e '.[gpu]') on a machine with a CUDA GPU, or use the hf backend"
            ) from err
        self.llm = LLM(
            model=str(model_path),
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            **engine_kwargs,
        )
        # the chat template's end-of-turn as well as EOS (models.chat.stop_token_ids)
        self.stop_ids = stop_token_ids(self.llm.get_tokenizer())

    def generate(
        self, prompts: Sequence[str], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        """n completions for each prompt, in prompt order."""
        from vllm import SamplingParams as VLLMParams

        per_prompt = [
            VLLMParams(
                n=n,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                seed=seed,
                logprobs=0,
                stop_token_ids=self.stop_ids,
            )
            for seed in request_seeds(params.seed, len(prompts), params.prompt_offset)
        ]
        outputs = self.llm.generate(list(prompts), per_prompt, use_tqdm=False)
        return [completions_from_request(o) for o in outputs]

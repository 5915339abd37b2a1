"""The previous CPU sampler, on `transformers.generate`: the reference that tests and the
benchmark compare the decode loop with. Not used by the pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sampling.interface import Completion, SamplingParams


class GenerateSampler:
    """Batched `generate` with left padding; every row runs until the batch's longest ends."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 64
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    def generate(
        self, prompts: Sequence[str], n: int, params: SamplingParams
    ) -> list[list[Completion]]:
        flat = [p for p in prompts for _ in range(n)]
        torch.manual_seed(params.seed)
        out: list[Completion] = []
        for start in range(0, len(flat), self.batch_size):
            out += self._generate_batch(flat[start : start + self.batch_size], params)
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    @torch.no_grad()
    def _generate_batch(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        tok = self.tokenizer
        tok.padding_side = "left"
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        greedy = params.temperature == 0
        result = self.model.generate(
            **enc,
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p,
            top_k=0,  # no top-k cut: plain temperature / nucleus sampling
            max_new_tokens=params.max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        new_tokens = result.sequences[:, enc["input_ids"].shape[1] :]  # (B, T_new)
        logprobs = self.model.compute_transition_scores(
            result.sequences, result.scores, normalize_logits=True
        )  # (B, T_new)
        rows = zip(new_tokens.tolist(), logprobs.tolist(), strict=True)
        return [self._completion(ids, lps) for ids, lps in rows]

    def _completion(self, ids: list[int], logprobs: list[float]) -> Completion:
        eos = self.tokenizer.eos_token_id
        if eos in ids:
            cut = ids.index(eos)
            return Completion(self._decode(ids[:cut]), ids[: cut + 1], logprobs[: cut + 1], "stop")
        return Completion(self._decode(ids), ids, logprobs, "length")

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

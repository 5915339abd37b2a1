"""Turning sampled groups into training tensors, and per-token log-probabilities of a policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.logits import (
    chunk_positions,
    chunked_token_logprobs,
    final_hidden_states,
    fits,
    output_head,
    token_logprobs,
    vocabulary_size,
)
from training.varlen import packed_attention


@dataclass
class PolicyBatch:
    """Prompts left-padded to one width, completions right-padded after them."""

    input_ids: torch.Tensor  # (N, P + C)
    attention_mask: torch.Tensor  # (N, P + C)
    completion_mask: torch.Tensor  # (N, C): 1 on completion tokens that carry loss
    prompt_width: int

    @property
    def completion_width(self) -> int:
        return self.input_ids.shape[1] - self.prompt_width

    def to(self, device: torch.device | str) -> PolicyBatch:
        """The batch on the policy's device (a no-op on CPU)."""
        return PolicyBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.completion_mask.to(device),
            self.prompt_width,
        )


def build_batch(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    completions: Sequence[Sequence[int]],
    pad_id: int,
) -> PolicyBatch:
    tokenizer.padding_side = "left"
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    width = max(1, max(len(c) for c in completions))
    ids = torch.full((len(completions), width), pad_id, dtype=torch.long)  # (N, C)
    mask = torch.zeros((len(completions), width), dtype=torch.long)  # (N, C)
    for row, tokens in enumerate(completions):
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, : len(tokens)] = 1
    return PolicyBatch(
        input_ids=torch.cat([enc["input_ids"], ids], dim=1),
        attention_mask=torch.cat([enc["attention_mask"], mask], dim=1),
        completion_mask=mask,
        prompt_width=enc["input_ids"].shape[1],
    )


@dataclass(frozen=True)
class PackedRow:
    """A PolicyBatch's sequences (prompt and completion, no padding) laid end to end in one row.

    Position ids restart at each sequence: run the model under `training.varlen.packed_attention`
    and without a cache. `source[i, t]` is the index in the row of the position whose output
    predicts completion token t of sequence i, where `valid[i, t]`.
    """

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T)
    source: torch.Tensor  # (N, C)
    valid: torch.Tensor  # (N, C) bool: a completion token of sequence i


def pack_policy_batch(batch: PolicyBatch) -> PackedRow:
    """`batch`'s sequences, their padding dropped, in one row."""
    attention = batch.attention_mask.cpu().bool()  # (N, P + C)
    prompt_lengths = attention[:, : batch.prompt_width].sum(dim=1)  # (N,)
    if int(prompt_lengths.min()) < 1:
        raise ValueError("each sequence needs a prompt token to predict its first completion token")
    lengths = attention.sum(dim=1)  # (N,)
    starts = lengths.cumsum(dim=0) - lengths  # (N,) where each sequence begins in the row
    valid = attention[:, batch.prompt_width :]  # (N, C): completions are right-padded
    t = torch.arange(batch.completion_width)  # (C,)
    source = (starts + prompt_lengths - 1)[:, None] + t[None, :]  # (N, C)
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])  # (T,)
    device = batch.input_ids.device
    return PackedRow(
        batch.input_ids[attention.to(device)][None],
        positions[None].to(device),
        (source * valid).to(device),
        valid.to(device),
    )


def completion_logprobs(
    model: PreTrainedModel,
    batch: PolicyBatch,
    temperature: float,
    with_entropy: bool = False,
    packed: bool = True,
    logits_budget: int | None = None,
    fused_head: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities (N, C) of the completion tokens under `model` at `temperature`, and
    their entropies when asked; 0 past each completion's end.

    Packed (the default), the sequences go through the model in one row without padding
    (`PackedRow`), and only the positions that predict a completion token through the
    log-softmax. Padded, the rows go as `batch` lays them out, with position ids that follow the
    attention mask so left padding does not shift the prompt.

    `logits_budget` bounds the float32 logits (elements) one pass holds. When the pass's logits
    fit it (or there is no budget), the model's own forward computes them, as it always has;
    otherwise the model returns its final hidden states and the output projection runs a chunk
    of positions at a time (training/logits.py), recomputed in the backward pass, so a step's
    logits cost one chunk's memory, not positions x vocabulary; `fused_head` compiles each
    chunk's elementwise work (training/fused_head.py).
    """
    if not packed:
        return _padded_completion_logprobs(
            model, batch, temperature, with_entropy, logits_budget, fused_head
        )
    rows = pack_policy_batch(batch)
    targets = batch.input_ids[:, batch.prompt_width :][rows.valid]  # (K,), K completion tokens
    positions = rows.source[rows.valid]  # (K,) the row positions that predict them
    inputs = {"input_ids": rows.input_ids, "position_ids": rows.position_ids, "use_cache": False}
    with packed_attention(model):
        if fits(logits_budget, rows.input_ids.shape[1], vocabulary_size(model)):
            logits = model(**inputs).logits[0]  # (T, V)
            token_logp, token_entropy = token_logprobs(
                logits[positions], targets, temperature, with_entropy
            )  # (K,)
        else:
            hidden = final_hidden_states(model, inputs)[0]  # (T, H)
            token_logp, token_entropy = chunked_token_logprobs(
                output_head(model), hidden[positions], targets, temperature, with_entropy,
                chunk_positions(logits_budget, vocabulary_size(model)), fused_head,
            )  # fmt: skip
    return _scatter(rows.valid, token_logp, token_entropy)


def _scatter(
    valid: torch.Tensor, token_logp: torch.Tensor, token_entropy: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token values (K,) laid out at the `valid` places of (N, C), 0 elsewhere."""
    logp = torch.zeros(valid.shape, dtype=token_logp.dtype, device=token_logp.device)
    logp = logp.masked_scatter(valid, token_logp)  # (N, C)
    if token_entropy is None:
        return logp, None
    return logp, torch.zeros_like(logp).masked_scatter(valid, token_entropy)


def _padded_completion_logprobs(
    model: PreTrainedModel,
    batch: PolicyBatch,
    temperature: float,
    with_entropy: bool,
    logits_budget: int | None,
    fused_head: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    position_ids = (batch.attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    width = batch.completion_width
    inputs = {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": position_ids,
    }
    targets = batch.input_ids[:, batch.prompt_width :]  # (N, C)
    valid = batch.completion_mask.bool()
    if fits(logits_budget, batch.input_ids.shape[0] * (width + 1), vocabulary_size(model)):
        logits = model(**inputs, logits_to_keep=width + 1).logits[:, :-1, :]  # (N, C, V)
        logp, entropy = token_logprobs(logits, targets, temperature, with_entropy)
        zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
        return (
            torch.where(valid, logp, zero),
            None if entropy is None else torch.where(valid, entropy, zero),
        )
    hidden = final_hidden_states(model, inputs)  # (N, P + C, H)
    predicting = hidden[:, batch.prompt_width - 1 : -1]  # (N, C, H): position t predicts t + 1
    token_logp, token_entropy = chunked_token_logprobs(
        output_head(model), predicting[valid], targets[valid], temperature, with_entropy,
        chunk_positions(logits_budget, vocabulary_size(model)), fused_head,
    )  # fmt: skip
    return _scatter(valid, token_logp, token_entropy)


def token_ends(
    tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int], offsets: Sequence[int]
) -> list[int]:
    """For each character offset into a completion's text, the index of the token that reaches it.

    The text is the stripped decoding of `token_ids`, as samplers return it. Each offset is found
    by bisection over decoded prefixes, so a completion costs O(len(offsets) * log T) decodes.
    """
    raw = tokenizer.decode(token_ids, skip_special_tokens=True)
    lead = len(raw) - len(raw.lstrip())
    ends = []
    for offset in offsets:
        lo, hi = 0, len(token_ids) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            prefix = tokenizer.decode(token_ids[: mid + 1], skip_special_tokens=True)
            if len(prefix) >= offset + lead:
                hi = mid
            else:
                lo = mid + 1
        ends.append(lo)
    return ends

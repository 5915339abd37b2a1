"""Turning sampled groups into training tensors, and per-token log-probabilities of a policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities (N, C) of the completion tokens under `model` at `temperature`, and
    their entropies when asked; 0 past each completion's end.

    Packed (the default), the sequences go through the model in one row without padding
    (`PackedRow`), and only the positions that predict a completion token through the
    log-softmax. Padded, the rows go as `batch` lays them out, with position ids that follow the
    attention mask so left padding does not shift the prompt, and only the completion positions
    through the output projection.
    """
    if not packed:
        return _padded_completion_logprobs(model, batch, temperature, with_entropy)
    rows = pack_policy_batch(batch)
    with packed_attention(model):
        logits = model(
            input_ids=rows.input_ids, position_ids=rows.position_ids, use_cache=False
        ).logits[0]  # (T, V)
    targets = batch.input_ids[:, batch.prompt_width :][rows.valid]  # (K,), K completion tokens
    token_logp, token_entropy = _token_logprobs(
        logits[rows.source[rows.valid]], targets, temperature, with_entropy
    )  # (K,)
    logp = torch.zeros(rows.valid.shape, dtype=token_logp.dtype, device=token_logp.device)
    logp = logp.masked_scatter(rows.valid, token_logp)  # (N, C)
    if token_entropy is None:
        return logp, None
    return logp, torch.zeros_like(logp).masked_scatter(rows.valid, token_entropy)


def _padded_completion_logprobs(
    model: PreTrainedModel, batch: PolicyBatch, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    position_ids = (batch.attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    width = batch.completion_width
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids,
        logits_to_keep=width + 1,
    ).logits[:, :-1, :]  # (N, C, V): position t predicts completion token t
    targets = batch.input_ids[:, batch.prompt_width :]  # (N, C)
    return _token_logprobs(logits, targets, temperature, with_entropy)


def _token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of `targets` (...) under `logits` (..., V) at `temperature`, and the
    distributions' entropies (no gradient) when asked."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        return logp, -(logp_all.exp() * logp_all).sum(dim=-1)


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

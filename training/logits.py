"""Log-probabilities of chosen tokens without holding a whole pass's logits.

A causal LM's logits are positions x vocabulary: for a GRPO step of 16 x 8 completions of up to
1,024 tokens on a 151,936-token vocabulary that is 20 G values, and the float32 copy, the
log-softmax and the entropy's exp each add as many again. Here the model returns its final
hidden states (a forward hook on the decoder; the LM head runs on one position only), and the
output projection, log-softmax and gather run on `chunk` positions at a time. With gradients on,
each chunk runs under activation checkpointing: only its inputs are kept, and the backward pass
recomputes its logits, so the logits cost one chunk's memory in both directions, for one more
output projection per chunk in the backward pass.

The projection is called as the model's own head module, so wrappers that manage its weight
(DeepSpeed ZeRO-3's gather hooks) see an ordinary call of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a DeepSpeed engine or DDP wrapper (`.module`)."""
    inner = model
    while isinstance(getattr(inner, "module", None), torch.nn.Module):
        inner = inner.module
    return inner


def vocabulary_size(model: torch.nn.Module) -> int:
    return int(unwrapped(model).config.vocab_size)


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    head = unwrapped(model).get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(unwrapped(model)).__name__} has no output embeddings (LM head)")
    return head


def fits(budget: int | None, positions: int, vocabulary: int) -> bool:
    """Whether `positions` rows of logits stay within `budget` elements (None: no bound)."""
    return budget is None or positions * vocabulary <= budget


def chunk_positions(budget: int | None, vocabulary: int, model: torch.nn.Module) -> int:
    """Positions per chunk: as many rows of logits as the budget holds, at least one.

    A ZeRO-3 model's head runs once, over every position: ZeRO-3 takes a parameter's gradient
    once per backward pass, and a head recomputed chunk by chunk in the backward pass would
    hand it one per chunk (DeepSpeed 0.19 aborts on CPU). Its micro-batch bounds
    the logits instead."""
    if budget is None:
        raise ValueError("chunks need a logits budget")
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return 2**62
    return max(1, budget // vocabulary)


@contextmanager
def _capture_decoder_output(model: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    inner = unwrapped(model)
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else inner.model
    captured: dict[str, torch.Tensor] = {}

    def keep(module: torch.nn.Module, args: Any, output: Any) -> None:
        captured["hidden"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    handle = decoder.register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()


def final_hidden_states(model: torch.nn.Module, inputs: Mapping[str, Any]) -> torch.Tensor:
    """The decoder's last hidden states (B, T, H) for `inputs`, the model's own forward run
    with its LM head on the last position only (`logits_to_keep=1`)."""
    with _capture_decoder_output(model) as captured:
        model(**inputs, logits_to_keep=1)
    return captured["hidden"]


def token_logprobs(
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


def chunked_token_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs(head(hidden), ...)` for hidden states (K, H) and targets (K,), `chunk`
    positions at a time; each chunk's logits are recomputed in the backward pass instead of
    kept."""

    def piece(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp, entropy = token_logprobs(head(h), t, temperature, with_entropy)
        return logp, entropy if entropy is not None else torch.zeros(0, device=logp.device)

    logps, entropies = [], []
    recompute = chunk < hidden.shape[0]  # one chunk: nothing to gain by recomputing it
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        if recompute and torch.is_grad_enabled() and h.requires_grad:
            logp, entropy = checkpoint(piece, h, t, use_reentrant=False)
        else:
            logp, entropy = piece(h, t)
        logps.append(logp)
        entropies.append(entropy)
    empty = hidden.new_zeros(0, dtype=torch.float32)
    logp = torch.cat(logps) if logps else empty
    if not with_entropy:
        return logp, None
    return logp, torch.cat(entropies) if entropies else empty

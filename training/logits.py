"""Log-probabilities and cross-entropy of chosen tokens without holding a whole pass's logits.

A causal LM's logits are positions x vocabulary: for a GRPO step of 16 x 8 completions of up to
1,024 tokens on a 151,936-token vocabulary that is 20 G values, and the float32 copy, the
log-softmax and the entropy's exp each add as many again; an SFT micro-batch of 16,384 tokens
holds 2.5 G. Here the model returns its final hidden states (a forward hook on the decoder; the
LM head runs on one position only), and the output projection, log-softmax and gather run on
`chunk` positions at a time inside one autograd function, so the logits cost one chunk's memory
in both directions:
- GRPO (`chunked_token_logprobs`): each position's log-sum-exp is kept and the backward pass
  recomputes a chunk's logits at a time (one more output projection per position);
- SFT (`chunked_nll`): the loss is the function's own scalar, so the forward pass computes the
  gradients on the hidden states and the head as it goes, and the backward pass only scales
  them: nothing is recomputed.
Either way the head's weight gets its gradient once per call, summed over the chunks in float32
(ZeRO-3 takes a parameter's gradient once per backward pass). With `fused` (`engine.fused_head`)
a chunk's elementwise work between its matmuls runs in compiled kernels (training/fused_head.py).

The projection is called as the model's own head module, so wrappers that manage its weight
(DeepSpeed ZeRO-3's gather hooks) see an ordinary call of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from training.examples import IGNORE
from training.fused_head import compiled, logprob_grad_middle, logprob_middle, nll_middle


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


def chunk_positions(budget: int | None, vocabulary: int) -> int:
    """Positions per chunk: as many rows of logits as the budget holds, at least one."""
    if budget is None:
        raise ValueError("chunks need a logits budget")
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


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """A chunk's logits (c, V) in float32 at `temperature`, in a tensor of its own."""
    logits = F.linear(hidden, weight, bias)
    z = logits.float() if logits.dtype != torch.float32 else logits
    del logits
    return z.div_(temperature) if temperature != 1.0 else z


def _bias_gradient(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    if bias is None:
        return None
    return torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)


def _chunks(total: int, chunk: int) -> list[slice]:
    return [slice(start, min(start + chunk, total)) for start in range(0, total, chunk)]


def _weight_gradient(weight: torch.Tensor) -> torch.Tensor:
    """The float32 accumulator a chunked head adds each chunk's weight gradient into."""
    return torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)


class _HeadLogprobs(torch.autograd.Function):
    """Log-probabilities (K,) of `targets` under softmax(head(hidden) / temperature), a chunk of
    positions at a time, and the entropies (no gradient) when asked. Only the hidden states and
    each position's log-sum-exp are kept: the backward pass recomputes one chunk's logits at a
    time and returns the head's gradient once, summed over the chunks (ZeRO-3 takes a
    parameter's gradient once per backward pass)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, with_entropy, fused):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n if with_entropy else 0, dtype=torch.float32)
        for part in _chunks(n, chunk):
            if fused:
                middle = compiled(logprob_middle)
                logits = F.linear(hidden[part], weight, bias)
                logp[part], lse[part], e = middle(logits, targets[part], temperature, with_entropy)
                del logits
                if e is not None:
                    entropy[part] = e
                continue
            z = _chunk_logits(hidden[part], weight, bias, temperature)  # (c, V)
            lse[part] = torch.logsumexp(z, dim=-1)
            logp[part] = z.gather(-1, targets[part, None]).squeeze(-1) - lse[part]
            if with_entropy:  # H = lse - sum(p z), p = exp(z - lse), one float32 copy more
                p = (z - lse[part, None]).exp_()
                entropy[part] = lse[part] - (p[:, None, :] @ z[:, :, None]).view(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk, ctx.fused = temperature, chunk, fused
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = _weight_gradient(weight) if need_w else None
        grad_b = _bias_gradient(weight, bias) if need_b else None
        rows = torch.arange(min(ctx.chunk, hidden.shape[0]), device=hidden.device)
        for part in _chunks(hidden.shape[0], ctx.chunk):
            if ctx.fused:
                logits = F.linear(hidden[part], weight, bias)
                dlogits = compiled(logprob_grad_middle)(
                    logits, targets[part], lse[part], grad_logp[part], ctx.temperature,
                    hidden.dtype,
                )  # fmt: skip
                del logits
                _head_gradients(dlogits, hidden[part], weight, part, grad_h, grad_w, grad_b)
                continue
            z = _chunk_logits(hidden[part], weight, bias, ctx.temperature)
            g = grad_logp[part].float()
            # d logp_t / d z = onehot(t) - softmax(z): the gradient on the logits, in place
            dz = z.sub_(lse[part, None]).exp_().mul_(-g[:, None])
            dz[rows[: dz.shape[0]], targets[part]] += g
            dlogits = dz.div_(ctx.temperature).to(hidden.dtype)
            del z, dz
            _head_gradients(dlogits, hidden[part], weight, part, grad_h, grad_w, grad_b)
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None, None, None, None, None,
        )  # fmt: skip


def _head_gradients(
    dlogits: torch.Tensor,  # (c, V) in the hidden states' dtype
    hidden: torch.Tensor,  # (c, H)
    weight: torch.Tensor,  # (V, H)
    part: slice,
    grad_h: torch.Tensor | None,
    grad_w: torch.Tensor | None,
    grad_b: torch.Tensor | None,
) -> None:
    """One chunk's share of the head's gradients, from the gradient on its logits."""
    if grad_h is not None:
        grad_h[part] = dlogits @ weight
    if grad_w is not None and grad_w.dtype == dlogits.dtype:
        grad_w.addmm_(dlogits.T, hidden)  # float32: no product in between
    elif grad_w is not None:
        grad_w += dlogits.T @ hidden  # bf16's product, summed in float32
    if grad_b is not None:
        grad_b += dlogits.sum(dim=0, dtype=torch.float32)


class _HeadNLL(torch.autograd.Function):
    """The summed negative log-likelihood of `targets` under softmax(head(hidden)), a chunk of
    positions at a time, with its gradients computed in the forward pass: the loss is this
    scalar, so nothing is recomputed, and the backward pass only scales what the forward pass
    kept (the hidden states' gradient and the head's, once) by the loss's gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, fused):
        n = hidden.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = _weight_gradient(weight) if need_w else None
        grad_b = _bias_gradient(weight, bias) if need_b else None
        total = hidden.new_zeros((), dtype=torch.float32)
        rows = torch.arange(min(chunk, n), device=hidden.device)
        for part in _chunks(n, chunk):
            if fused:
                logits = F.linear(hidden[part], weight, bias)
                nll, dlogits = compiled(nll_middle)(
                    logits, targets[part], hidden.dtype, need_h or need_w or need_b
                )
                del logits
                total += nll
                if dlogits is not None:
                    _head_gradients(dlogits, hidden[part], weight, part, grad_h, grad_w, grad_b)
                continue
            z = _chunk_logits(hidden[part], weight, bias, 1.0)
            lse = torch.logsumexp(z, dim=-1)
            total += (lse - z.gather(-1, targets[part, None]).squeeze(-1)).sum()
            if need_h or need_w or need_b:  # d nll / d z = softmax(z) - onehot(t)
                dz = z.sub_(lse[:, None]).exp_()
                dz[rows[: dz.shape[0]], targets[part]] -= 1.0
                dlogits = dz.to(hidden.dtype)
                del z, dz
                _head_gradients(dlogits, hidden[part], weight, part, grad_h, grad_w, grad_b)
        ctx.grads = (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
        )
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grads, ctx.grads = ctx.grads, None
        if grads is None:
            raise RuntimeError("the chunked loss's gradients were taken once already")
        scaled = [None if g is None else g.mul_(grad_total.to(g.dtype)) for g in grads]
        return (*scaled, None, None, None)


def _call_head(head: torch.nn.Module, run, hidden: torch.Tensor):
    """`run(hidden, weight, bias)` called as `head`'s forward, so that wrappers that manage its
    weight (DeepSpeed ZeRO-3's gather hooks, before the forward and before its backward) see an
    ordinary call of it."""
    own = head.__dict__.get("forward")  # a wrapper's, if one set it on the instance
    head.forward = lambda h: run(h, head.weight, getattr(head, "bias", None))
    try:
        return head(hidden)
    finally:
        if own is None:
            del head.forward  # the class's own again
        else:
            head.forward = own


def chunked_token_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk: int,
    fused: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs(head(hidden), ...)` for hidden states (K, H) and targets (K,), `chunk`
    positions at a time; each chunk's logits are recomputed in the backward pass instead of
    kept. `fused`: each chunk's elementwise work in compiled kernels (training/fused_head.py)."""

    def run(h, weight, bias):
        return _HeadLogprobs.apply(
            h, weight, bias, targets, temperature, chunk, with_entropy, fused
        )

    logp, entropy = _call_head(head, run, hidden)
    return logp, entropy if with_entropy else None


def chunked_nll(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    fused: bool = False,
) -> torch.Tensor:
    """The summed cross-entropy of targets (K,) under `head(hidden)` for hidden states (K, H),
    `chunk` positions at a time (`_HeadNLL`); `fused` as in `chunked_token_logprobs`."""

    def run(h, weight, bias):
        return _HeadNLL.apply(h, weight, bias, targets, chunk, fused)

    return _call_head(head, run, hidden)


def causal_lm_loss(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor],
    num_items: int | None,
    budget: int | None,
    fused_head: bool = False,
) -> torch.Tensor:
    """The causal-LM loss of `inputs` (with `labels`): the mean over their target tokens, or
    the sum over `num_items`, as transformers computes it. When the pass's logits exceed
    `budget` (float32 elements), they are computed a chunk at a time (`chunked_nll`, its
    elementwise work compiled with `fused_head`)."""
    labels = inputs["labels"]
    if fits(budget, labels.numel(), vocabulary_size(model)):
        extra = {} if num_items is None else {"num_items_in_batch": num_items}
        return model(**inputs, **extra, use_cache=False).loss
    rest = {key: value for key, value in inputs.items() if key != "labels"}
    hidden = final_hidden_states(model, rest | {"use_cache": False})  # (B, T, H)
    targets = labels[:, 1:]  # position t predicts token t + 1
    valid = targets != IGNORE
    chunk = chunk_positions(budget, vocabulary_size(model))
    head = output_head(model)
    nll = chunked_nll(head, hidden[:, :-1][valid], targets[valid], chunk, fused_head)
    return nll / (num_items if num_items is not None else valid.sum())

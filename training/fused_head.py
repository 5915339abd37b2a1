"""The chunked head's elementwise work compiled into fused kernels (`engine.fused_head`).

Between a chunk's two matmuls (its logits, then the gradients on the hidden states and the head)
the eager chunk (training/logits.py) runs one kernel per operation over c x V values: the
float32 copy, the log-sum-exp's max, shifted exp and sum, the shifted copy, its exp, the one-hot
subtraction and the cast back, each reading and writing the whole chunk, about 52 bytes a logit.
Compiled, the same arithmetic becomes a reduction kernel and one elementwise kernel that read the
matmul's logits and write their gradient once: about 2b bytes a logit read and b written per
pass (b = 2 in bf16), with no float32 chunk held. The matmuls stay as they are (cuBLAS).

Each function takes a chunk's logits straight from the projection and is `torch.compile`d once
per process with dynamic shapes (a pass's last chunk is shorter); the values are the eager
chunk's to float32 rounding (tests/training/test_fused_head.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def _one_hot(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    vocabulary = torch.arange(logits.shape[-1], device=logits.device)
    return (vocabulary[None, :] == targets[:, None]).float()


def nll_middle(
    logits: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype, with_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chunk's summed cross-entropy of `targets` (c,) under `logits` (c, V), and its
    gradient on the logits in `dtype` (softmax - one-hot) when asked."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    nll = (lse - z.gather(-1, targets[:, None]).squeeze(-1)).sum()
    if not with_grad:
        return nll, None
    return nll, (torch.exp(z - lse[:, None]) - _one_hot(z, targets)).to(dtype)


def logprob_middle(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A chunk's log-probabilities of `targets` under softmax(logits / temperature), each
    position's log-sum-exp (the backward pass's), and the entropies when asked."""
    z = logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, lse, None
    return logp, lse, lse - (torch.exp(z - lse[:, None]) * z).sum(dim=-1)


def logprob_grad_middle(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    temperature: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The gradient on a chunk's logits in `dtype` from the gradient `grad` (c,) reaching its
    log-probabilities: (one-hot - softmax) x grad / temperature."""
    z = logits.float() / temperature
    softmax = torch.exp(z - lse[:, None])
    return ((_one_hot(z, targets) - softmax) * (grad.float() / temperature)[:, None]).to(dtype)


@functools.cache
def compiled(middle: Callable) -> Callable:
    """`middle` compiled once per process, whole (no graph breaks), for any chunk length."""
    return torch.compile(middle, dynamic=True, fullgraph=True)

"""The GRPO objective: importance ratios, the clipped surrogate, KL estimators, aggregation.

All functions take per-token log-probabilities of the sampled tokens, shape (B, T), and a mask
(B, T) that is 1 on completion tokens that count. Losses are to be minimised (the negated
objective).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token log pi/pi_ref: unbiased for KL(pi || pi_ref), may be negative."""
    return logp - ref_logp


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token pi_ref/pi - log(pi_ref/pi) - 1 (DeepSeekMath eq. 4): unbiased and >= 0."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k3": kl_k3,
}


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) per token, and the ratios rho.

    `advantages` is (B, T), or (B,) for outcome supervision (broadcast over tokens). A larger
    eps_high than eps_low is DAPO's clip-higher.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # (B, 1)
    ratio = torch.exp(logp - old_logp)  # (B, T)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    return torch.minimum(unclipped, clipped), ratio  # (B, T), (B, T)


# Each aggregation is a numerator over the batch's tokens divided by a denominator that depends
# only on the mask: a data-parallel rank divides its own numerator by the denominator summed over
# every rank, and the ranks' losses then add up to the whole batch's.


def sequence_mean_numerator(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum()  # sum of (B,)


def masked_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (per_token * mask).sum()


def sequence_count(mask: torch.Tensor, max_len: int) -> torch.Tensor:
    return torch.tensor(float(mask.shape[0]))


def token_count(mask: torch.Tensor, max_len: int) -> torch.Tensor:
    return mask.sum()


def constant_count(mask: torch.Tensor, max_len: int) -> torch.Tensor:
    return torch.tensor(float(mask.shape[0] * max_len))


@dataclass(frozen=True)
class Aggregation:
    numerator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (per_token, mask)
    denominator: Callable[[torch.Tensor, int], torch.Tensor]  # (mask, max_len)

    def __call__(self, per_token: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
        return self.numerator(per_token, mask) / self.denominator(mask, max_len).clamp(min=1)


# Original GRPO: mean over each sequence's tokens, then over sequences.
sequence_mean = Aggregation(sequence_mean_numerator, sequence_count)
# DAPO: mean over all tokens of the batch, so long sequences weigh by their length.
token_mean = Aggregation(masked_sum, token_count)
# Dr. GRPO: sum over tokens divided by a constant (batch size x max completion length).
constant_normaliser = Aggregation(masked_sum, constant_count)

AGGREGATIONS: dict[str, Aggregation] = {
    "sequence_mean": sequence_mean,
    "token_mean": token_mean,
    "constant": constant_normaliser,
}


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    kl_estimator: str = "k3",
    aggregation: str | Aggregation = "sequence_mean",
    max_len: int | None = None,
    denominator: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The negated GRPO objective -(w * surrogate - beta * KL), aggregated (by name, or the
    aggregation itself), and its statistics.

    `denominator` replaces the aggregation's own (a data-parallel rank passes the sum over all
    ranks' batches, so that the ranks' losses add up to the loss of the whole batch).
    `weights` (B, T), without gradient, scale each token's surrogate (truncated importance
    sampling, `truncated_is_weights`); the KL term is not weighted, as in TRL.
    """
    objective, ratio = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high)
    per_token = -objective if weights is None else -objective * weights
    stats: dict[str, float] = {}
    m = mask.float()
    n = m.sum().clamp(min=1)
    if beta > 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs the reference log-probabilities")
        kl = KL_ESTIMATORS[kl_estimator](logp, ref_logp)
        per_token = per_token + beta * kl
        stats["kl"] = float((kl.detach() * m).sum() / n)
    reduce = AGGREGATIONS[aggregation] if isinstance(aggregation, str) else aggregation
    if denominator is None:
        loss = reduce(per_token, m, max_len or logp.shape[1])
    else:
        loss = reduce.numerator(per_token, m) / max(denominator, 1.0)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    low = (ratio < 1.0 - eps_low) & (adv < 0)  # the clip bound that is active for A < 0
    high = (ratio > 1.0 + eps_high) & (adv > 0)  # and for A > 0
    stats["clip_low_fraction"] = float((low.float() * m).sum() / n)
    stats["clip_high_fraction"] = float((high.float() * m).sum() / n)
    return loss, stats


def truncated_is_weights(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Truncated importance sampling (TIS) for a sampler whose probabilities are not the
    trainer's (vLLM's kernels, bf16): per-token weights min(pi_train / pi_sampler, cap) (B, T),
    with the ratios' sum and the number above the cap over the tokens of `mask` (B, T).

    The samples were drawn from the sampler's distribution, so the on-policy gradient weighs
    each token by pi_train / pi_sampler; truncating at `cap` bounds the variance a rare token
    with a tiny sampler probability would bring (Yao et al. 2025; TRL's `token_truncate`).
    `trainer_logp` are pi_old's log-probabilities (no gradient)."""
    ratio = torch.exp(trainer_logp - sampler_logp) * mask  # (B, T), 0 off the mask
    weights = torch.where(mask > 0, ratio.clamp(max=cap), torch.ones_like(ratio))
    return weights, ratio.sum(), ((ratio > cap) & (mask > 0)).sum()

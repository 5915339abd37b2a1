"""The losses of on-policy distillation (rl.on_policy): per-token reverse KL(student || teacher)
on the student's own samples, by two estimators.

- "full": the exact KL over the whole vocabulary at each completion position,
  sum_v p_s(v) (log p_s(v) - log p_t(v)); lowest variance, needs both models' full logits.
- "sampled": log p_s(x_t) - log p_t(x_t) of the sampled token only, used as a negative per-token
  advantage in a policy-gradient loss (as in Thinking Machines' on-policy distillation); unbiased
  for the gradient of the same per-position KL, with more variance.

By default each position's KL is minimised as if the states were fixed (discount 0, as GKD and
Thinking Machines do). `discount` > 0 also charges each sampled token the KLs of the positions it
leads to; at 1 the expected gradient is that of the sequence-level reverse KL, which (every token
costing KL >= 0) also rewards ending sooner.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the tokens that count, so every completion token weighs the same."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1)


def reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Exact KL(student || teacher) at each position, (B, T), from log-probabilities (B, T, V)."""
    return (student_logp.exp() * (student_logp - teacher_logp)).sum(dim=-1)  # (B, T)


def future_sum(values: torch.Tensor, mask: torch.Tensor, discount: float) -> torch.Tensor:
    """sum_{t' > t} discount^(t' - t) values_t' over the tokens that count, (B, T); zero at
    discount 0. What a token's choice costs later in its sequence."""
    values = values * mask.to(values.dtype)  # (B, T)
    out = torch.zeros_like(values)
    if discount == 0.0:
        return out
    running = torch.zeros_like(values[:, 0])  # (B,)
    for t in range(values.shape[1] - 2, -1, -1):
        running = discount * (values[:, t + 1] + running)
        out[:, t] = running
    return out


def full_kl_loss(
    student_logp: torch.Tensor,  # (B, T, V)
    teacher_logp: torch.Tensor,  # (B, T, V)
    targets: torch.Tensor,  # (B, T) sampled tokens; needed only when discount > 0
    mask: torch.Tensor,  # (B, T)
    discount: float = 0.0,
) -> torch.Tensor:
    """Mean per-token exact reverse KL; the gradient reaches the student only.

    With discount > 0 each sampled token also carries, as a policy-gradient term, the exact KLs
    of the positions its choice leads to; at discount 1 the expected gradient is that of the
    sequence-level reverse KL sum_t KL_t (per token of the batch).
    """
    kl = reverse_kl(student_logp, teacher_logp.detach())  # (B, T)
    if discount == 0.0:
        return masked_mean(kl, mask)
    s_tok = student_logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
    later = future_sum(kl.detach(), mask, discount)  # (B, T)
    return masked_mean(kl + later * s_tok, mask)


def sampled_kl_loss(
    student_logp: torch.Tensor,  # (B, T, V)
    teacher_logp: torch.Tensor,  # (B, T, V)
    targets: torch.Tensor,  # (B, T)
    mask: torch.Tensor,  # (B, T)
    discount: float = 0.0,
) -> torch.Tensor:
    """Policy gradient with per-token advantage -(log p_s(x_t) - log p_t(x_t)).

    With x_t drawn from the student, E[(log p_s - log p_t) grad log p_s] is the gradient of the
    per-position reverse KL (the score function has mean zero), so this is unbiased for the same
    update as `full_kl_loss`, seeing one token of the teacher's distribution instead of all.
    With discount > 0 the advantage is the discounted return of these costs from t on.
    """
    index = targets.unsqueeze(-1)
    s_tok = student_logp.gather(-1, index).squeeze(-1)  # (B, T)
    t_tok = teacher_logp.gather(-1, index).squeeze(-1)  # (B, T)
    cost = (s_tok - t_tok).detach()  # (B, T): -advantage at discount 0
    return masked_mean((cost + future_sum(cost, mask, discount)) * s_tok, mask)


DistillLoss = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]
DISTILL_LOSSES: dict[str, DistillLoss] = {"full": full_kl_loss, "sampled": sampled_kl_loss}

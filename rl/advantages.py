"""Group-normalised advantages (DeepSeekMath eq. 3-5, section 4.1.2-4.1.3).

Outcome supervision gives every token of completion i the advantage (r_i - mean(r)) / std(r),
statistics taken over the G completions of the same prompt. Process supervision normalises step
rewards over all steps of the group and gives token t the sum of the normalised rewards of the
steps that end at or after t.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

EPS = 1e-4


def group_advantages(
    rewards: torch.Tensor, scale_std: bool = True, eps: float = EPS
) -> torch.Tensor:
    """Outcome advantages for rewards of shape (B, G): B prompts, G completions each.

    The std is the population std over the group (a group of G is the whole population of that
    prompt's samples), so rewards (1,1,0,1,0,0,1,0) give advantages of exactly +-1 up to eps.
    `scale_std=False` is Dr. GRPO's choice: centre only, no division by the group spread.
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (B, G)
    if not scale_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)  # (B, G)


def zero_spread_groups(rewards: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    """(B,) mask of groups whose G rewards are all equal: their advantages carry no signal."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) <= tol


def process_advantages(
    step_rewards: Sequence[Sequence[float]],
    step_ends: Sequence[Sequence[int]],
    length: int,
    scale_std: bool = True,
    eps: float = EPS,
) -> torch.Tensor:
    """Process-supervision advantages (G, length) for one group.

    `step_rewards[i][j]` is the reward of step j of completion i, and `step_ends[i][j]` the
    0-based index of the token where that step ends. Rewards are normalised over every step of
    every completion in the group; token t of completion i gets the sum over steps j with
    end >= t. Tokens after the last step get 0.
    """
    flat = torch.tensor([r for steps in step_rewards for r in steps], dtype=torch.float32)
    if flat.numel() == 0:
        return torch.zeros(len(step_rewards), length)
    mean = flat.mean()
    scale = flat.std(unbiased=False) + eps if scale_std else torch.tensor(1.0)
    adv = torch.zeros(len(step_rewards), length)  # (G, T)
    for i, (rewards, ends) in enumerate(zip(step_rewards, step_ends, strict=True)):
        for reward, end in zip(rewards, ends, strict=True):
            adv[i, : min(end, length - 1) + 1] += (reward - mean) / scale
    return adv

"""GRPO math against DESIGN.md's worked numbers and naive references written the obvious way."""

import math
import random

import pytest
import torch

from rl.advantages import group_advantages, process_advantages, zero_spread_groups
from rl.losses import (
    AGGREGATIONS,
    clipped_surrogate,
    grpo_loss,
    kl_k1,
    kl_k3,
)


def lp(p: float) -> torch.Tensor:
    return torch.tensor([[math.log(p)]])


# ---- worked numbers -------------------------------------------------------------------------


def test_outcome_advantages_worked_example():
    rewards = torch.tensor([[1.0, 1, 0, 1, 0, 0, 1, 0]])
    adv = group_advantages(rewards)
    expected = torch.tensor([[1.0, 1, -1, 1, -1, -1, 1, -1]])
    assert torch.allclose(adv, expected, atol=1e-3)


@pytest.mark.parametrize("pi,ref,expected", [(0.6, 0.4, 0.072), (0.9, 0.1, 1.308)])
def test_k3_worked_examples(pi, ref, expected):
    assert kl_k3(lp(pi), lp(ref)).item() == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("advantage,expected", [(1.0, 1.2), (-1.0, -1.5)])
def test_clipped_surrogate_worked_examples(advantage, expected):
    old = torch.tensor([[0.0]])
    logp = torch.tensor([[math.log(1.5)]])  # rho = 1.5
    objective, _ = clipped_surrogate(logp, old, torch.tensor([advantage]), 0.2, 0.2)
    assert objective.item() == pytest.approx(expected)


def test_process_advantages_worked_example():
    # steps ending at tokens 10, 20, 30 (1-based) with normalised rewards +0.5, -0.3, +0.8
    adv = process_advantages([[0.5, -0.3, 0.8]], [[9, 19, 29]], length=35, scale_std=False)
    mean = (0.5 - 0.3 + 0.8) / 3
    raw = [0.5 - mean, -0.3 - mean, 0.8 - mean]
    assert adv[0, :10] == pytest.approx([sum(raw)] * 10)
    assert adv[0, 10:20] == pytest.approx([raw[1] + raw[2]] * 10)
    assert adv[0, 20:30] == pytest.approx([raw[2]] * 10)
    assert adv[0, 30:] == pytest.approx([0.0] * 5)


# ---- naive references -----------------------------------------------------------------------


def naive_group_advantages(rows, scale_std=True, eps=1e-4):
    out = []
    for row in rows:
        mean = sum(row) / len(row)
        std = math.sqrt(sum((r - mean) ** 2 for r in row) / len(row))
        out.append([(r - mean) / (std + eps) if scale_std else r - mean for r in row])
    return out


@pytest.mark.parametrize("scale_std", [True, False])
def test_group_advantages_match_reference(scale_std):
    rng = random.Random(0)
    rows = [[rng.choice([0.0, 0.5, 1.0]) for _ in range(6)] for _ in range(5)]
    got = group_advantages(torch.tensor(rows), scale_std=scale_std)
    for g, e in zip(got.tolist(), naive_group_advantages(rows, scale_std), strict=True):
        assert g == pytest.approx(e, abs=1e-5)


def test_zero_spread_groups():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert zero_spread_groups(rewards).tolist() == [True, False, True]
    assert torch.all(group_advantages(rewards)[0] == 0)


def naive_process_advantages(step_rewards, step_ends, length):
    flat = [r for steps in step_rewards for r in steps]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((r - mean) ** 2 for r in flat) / len(flat))
    out = []
    for rewards, ends in zip(step_rewards, step_ends, strict=True):
        row = []
        for t in range(length):
            row.append(
                sum((r - mean) / (std + 1e-4) for r, e in zip(rewards, ends, strict=True) if e >= t)
            )
        out.append(row)
    return out


def test_process_advantages_match_reference():
    step_rewards = [[1.0, 0.0], [0.5], [0.0, 1.0, 1.0]]
    step_ends = [[3, 7], [5], [2, 4, 8]]
    got = process_advantages(step_rewards, step_ends, length=10)
    for g, e in zip(
        got.tolist(), naive_process_advantages(step_rewards, step_ends, 10), strict=True
    ):
        assert g == pytest.approx(e, abs=1e-5)


def test_kl_estimators_match_reference_and_k3_is_nonnegative():
    torch.manual_seed(0)
    logp, ref = torch.randn(4, 7).clamp(max=0), torch.randn(4, 7).clamp(max=0)
    k1, k3 = kl_k1(logp, ref), kl_k3(logp, ref)
    for i in range(4):
        for t in range(7):
            p, q = math.exp(logp[i, t]), math.exp(ref[i, t])
            assert k1[i, t].item() == pytest.approx(math.log(p / q), abs=1e-5)
            assert k3[i, t].item() == pytest.approx(q / p - math.log(q / p) - 1, abs=1e-5)
    assert torch.all(k3 >= 0)
    assert torch.allclose(kl_k3(logp, logp), torch.zeros_like(logp))


def naive_surrogate(rho, adv, eps_low, eps_high):
    return min(rho * adv, max(min(rho, 1 + eps_high), 1 - eps_low) * adv)


def test_clipped_surrogate_matches_reference_with_clip_higher():
    torch.manual_seed(1)
    logp, old = torch.randn(3, 5) * 0.3, torch.randn(3, 5) * 0.3
    adv = torch.randn(3)
    got, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28)
    for i in range(3):
        for t in range(5):
            rho = math.exp(logp[i, t] - old[i, t])
            want = naive_surrogate(rho, adv[i].item(), 0.2, 0.28)
            assert got[i, t].item() == pytest.approx(want, abs=1e-5)


def naive_aggregate(values, mask, mode, max_len):
    if mode == "sequence_mean":
        per_seq = [
            sum(v for v, m in zip(row, mrow, strict=True) if m) / max(1, sum(mrow))
            for row, mrow in zip(values, mask, strict=True)
        ]
        return sum(per_seq) / len(per_seq)
    total = sum(
        v
        for row, mrow in zip(values, mask, strict=True)
        for v, m in zip(row, mrow, strict=True)
        if m
    )
    if mode == "token_mean":
        return total / sum(sum(mrow) for mrow in mask)
    return total / (len(values) * max_len)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregations_match_reference(mode):
    values = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0]]
    mask = [[1, 1, 1, 1], [1, 1, 0, 0]]
    got = AGGREGATIONS[mode](torch.tensor(values), torch.tensor(mask, dtype=torch.float32), 6)
    assert got.item() == pytest.approx(naive_aggregate(values, mask, mode, 6))


def test_aggregations_differ_as_the_papers_say():
    values = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0]])
    # per-sequence mean weighs the one-token sequence as much as the four-token one
    assert AGGREGATIONS["sequence_mean"](values, mask, 4).item() == pytest.approx(3.0)
    assert AGGREGATIONS["token_mean"](values, mask, 4).item() == pytest.approx(9 / 5)
    assert AGGREGATIONS["constant"](values, mask, 4).item() == pytest.approx(9 / 8)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_shares_over_the_global_denominator_add_up_to_the_whole_batch(mode):
    """What a data-parallel rank computes: its rows' numerator over the denominator of all."""
    torch.manual_seed(2)
    logp, old = torch.randn(6, 5) * 0.3, torch.randn(6, 5) * 0.3
    adv = torch.randn(6)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1
    whole, _ = grpo_loss(logp, old, adv, mask, aggregation=mode, max_len=5)
    den = sum(float(AGGREGATIONS[mode].denominator(mask[r], 5)) for r in (slice(0, 2), slice(2, 6)))
    parts = [
        grpo_loss(logp[r], old[r], adv[r], mask[r], aggregation=mode, max_len=5, denominator=den)
        for r in (slice(0, 2), slice(2, 6))
    ]
    assert float(parts[0][0] + parts[1][0]) == pytest.approx(float(whole), rel=1e-6)


def test_grpo_loss_is_negated_objective_plus_beta_kl():
    torch.manual_seed(2)
    logp, old, ref = (torch.randn(2, 3) * 0.2 for _ in range(3))
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 3)
    loss, stats = grpo_loss(logp, old, adv, mask, ref_logp=ref, beta=0.1, aggregation="token_mean")
    objective, _ = clipped_surrogate(logp, old, adv, 0.2, 0.2)
    want = (-objective + 0.1 * kl_k3(logp, ref)).mean()
    assert loss.item() == pytest.approx(want.item(), abs=1e-6)
    assert stats["kl"] == pytest.approx(kl_k3(logp, ref).mean().item(), abs=1e-6)
    with pytest.raises(ValueError, match="reference"):
        grpo_loss(logp, old, adv, mask, beta=0.1)


def test_grpo_gradient_at_ratio_one_is_the_policy_gradient():
    """With pi == pi_old and beta 0, d loss / d logp = -A / (tokens of the sequence)."""
    logp = torch.zeros(2, 2, requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([2.0, -1.0]), torch.ones(2, 2))
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.5, -0.5, 0.25, 0.25])


def test_clip_statistics_count_active_bounds():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    _, stats = grpo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 3))
    assert stats["clip_high_fraction"] == pytest.approx(1 / 3)
    assert stats["clip_low_fraction"] == 0.0

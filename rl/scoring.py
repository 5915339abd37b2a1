"""Scoring a step's sampled groups: every reward on every sample, advantages over the samples a
reward could score (outcome or process supervision), and what one data-parallel rank sampled,
merged with the others' for the step's metrics. No model and no I/O here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from problems.types import Problem
from rewards.registry import RewardSet, combine, safe_scores
from rewards.steps import process_steps
from rl.advantages import EPS, group_advantages, process_advantages, zero_spread_groups
from rl.rollouts import token_ends
from sampling.interface import Completion


@dataclass(frozen=True)
class ScoredGroups:
    rewards: torch.Tensor  # (B, G) total reward, NaN where no reward could score the sample
    per_reward: dict[str, list[float | None]]  # name -> B*G scores


def score(
    problems: Sequence[Problem],
    prompts: Sequence[str],
    groups: Sequence[Sequence[Completion]],
    rewards: RewardSet,
) -> ScoredGroups:
    """Every reward on every sample, except that a reward limited to some prompt kinds or
    problem families scores the others None (left out of their sum), so reasoning families and
    general prompts can share a batch."""
    g = len(groups[0])
    flat = [c for group in groups for c in group]
    flat_problems = [p for p in problems for _ in range(g)]
    columns = {
        "answer": [p.answer for p in flat_problems],
        "language": [p.language for p in flat_problems],
        "kind": [p.kind for p in flat_problems],
        "family": [p.family for p in flat_problems],
        "tests": [list(p.tests) for p in flat_problems],
        "numbers": [list(p.numbers) for p in flat_problems],
        "completion_tokens": [len(c.token_ids) for c in flat],
    }
    texts = [c.text for c in flat]
    flat_prompts = [p for p in prompts for _ in range(g)]
    per_reward = {}
    for name, fn in rewards.fns.items():
        rows = [i for i, p in enumerate(flat_problems) if rewards.applies(name, p.kind, p.family)]
        scores: list[float | None] = [None] * len(flat)
        if rows:
            picked = {k: [v[i] for i in rows] for k, v in columns.items()}
            got = safe_scores(
                fn, [flat_prompts[i] for i in rows], [texts[i] for i in rows], **picked
            )
            for i, value in zip(rows, got, strict=True):
                scores[i] = value
        per_reward[name] = scores
    total = [math.nan if r is None else r for r in combine(per_reward, rewards.weights)]
    return ScoredGroups(torch.tensor(total, dtype=torch.float32).view(len(groups), g), per_reward)


def masked_advantages(rewards: torch.Tensor, scale_std: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages (B, G) over the scorable samples, and the groups (B,) with no reward spread.

    Unscorable samples (NaN) are left out of their group's mean and std and get advantage 0; the
    caller masks them out of the loss. With every sample scorable this is `group_advantages`.
    """
    valid = ~torch.isnan(rewards)  # (B, G)
    if bool(valid.all()):
        return group_advantages(rewards, scale_std=scale_std), zero_spread_groups(rewards)
    counts = valid.sum(dim=1, keepdim=True).clamp(min=1)
    mean = torch.where(valid, rewards, 0.0).sum(dim=1, keepdim=True) / counts
    centred = torch.where(valid, rewards - mean, 0.0)  # (B, G)
    std = (centred.pow(2).sum(dim=1, keepdim=True) / counts).sqrt()
    zero = (std.squeeze(1) <= 1e-6) | (valid.sum(dim=1) < 2)
    return (centred / (std + EPS) if scale_std else centred), zero


def kind_metrics(batch: Sequence[Problem], rewards: torch.Tensor) -> dict[str, float]:
    """Mean total reward per prompt kind, when a batch mixes kinds (stage 6), and per reasoning
    family, when it mixes families (`reward/family/<family>/mean`)."""
    metrics = {}
    for prefix, names in (
        ("kind", [p.kind for p in batch]),
        ("family", [p.family if p.kind == "reasoning" else None for p in batch]),
    ):
        present = sorted({n for n in names if n is not None})
        if prefix == "kind" and len(present) < 2:
            continue
        for name in present:
            rows = rewards[[n == name for n in names]]  # (B_name, G)
            valid = rows[~torch.isnan(rows)]
            if valid.numel():
                metrics[f"reward/{prefix}/{name}/mean"] = float(valid.mean())
    return metrics


@dataclass
class RankRollouts:
    """What one rank sampled and scored in a step; the ranks' lists, in rank order, are the step's
    whole batch (a single process has one)."""

    batch: list[Problem]
    groups: list[list[Completion]]
    scored: ScoredGroups
    zero: torch.Tensor  # (B,) groups with no reward spread
    process: bool = False  # process supervision: the steps were checked
    steps_seen: int = 0  # checked steps, and how many were right
    steps_right: int = 0

    @classmethod
    def merge(cls, parts: Sequence[RankRollouts]) -> RankRollouts:
        if len(parts) == 1:
            return parts[0]
        per_reward = {
            name: [s for part in parts for s in part.scored.per_reward[name]]
            for name in parts[0].scored.per_reward
        }
        scored = ScoredGroups(torch.cat([p.scored.rewards for p in parts]), per_reward)
        return cls(
            [q for p in parts for q in p.batch],
            [g for p in parts for g in p.groups],
            scored,
            torch.cat([p.zero for p in parts]),
            parts[0].process,
            sum(p.steps_seen for p in parts),
            sum(p.steps_right for p in parts),
        )

    @property
    def flat(self) -> list[Completion]:
        return [c for group in self.groups for c in group]

    def step_metrics(self) -> dict[str, float]:
        if not self.process:
            return {}
        metrics = {"steps/per_completion": self.steps_seen / self.scored.rewards.numel()}
        if self.steps_seen:
            metrics["steps/correct_fraction"] = self.steps_right / self.steps_seen
        return metrics


def step_advantages(
    tokenizer: PreTrainedTokenizerBase,
    batch: Sequence[Problem],
    groups: Sequence[Sequence[Completion]],
    rewards: torch.Tensor,
    step_reward: float,
    scale_std: bool,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Process supervision: token advantages (B, G, T) from checked steps plus the outcome as the
    last step, the groups with no spread, and the number of steps checked and found right.

    Each equation of a math or logic completion is a step, and so is each check of a logic
    attempt against the target, rewarded `step_reward` when right and grounded
    (rewards/steps.py); the outcome reward is the step that ends at the last token. Code
    completions have only their outcome. Steps are normalised over the group and token t gets
    the sum over steps ending at or after t. Unscorable samples take no part in their group's
    statistics.
    """
    width = max(len(c.token_ids) for group in groups for c in group)
    out = torch.zeros(len(groups), len(groups[0]), width)  # (B, G, T)
    zero = torch.zeros(len(groups), dtype=torch.bool)
    n_steps = n_correct = 0
    for b, (problem, group) in enumerate(zip(batch, groups, strict=True)):
        step_rewards, step_ends = [], []
        for g, c in enumerate(group):
            if torch.isnan(rewards[b, g]):
                step_rewards.append([])
                step_ends.append([])
                continue
            checks = process_steps(problem.question, c.text, problem.family, problem.answer)
            ends = token_ends(tokenizer, c.token_ids, [s.end for s in checks])
            n_steps += len(checks)
            n_correct += sum(s.correct for s in checks)
            step_rewards.append([step_reward * s.correct for s in checks] + [float(rewards[b, g])])
            step_ends.append(ends + [len(c.token_ids) - 1])
        flat = [r for steps in step_rewards for r in steps]
        zero[b] = len(flat) < 2 or max(flat) - min(flat) <= 1e-6
        out[b] = process_advantages(step_rewards, step_ends, width, scale_std)
    return out, zero, n_steps, n_correct

"""What a step's rollouts say beyond their reward, for the RL guard (guard/) and the curves: the
share of completions that repeat themselves, the share in their prompt's one script, and each
reward term's share of the total and its unscorable share. No model and no I/O here."""

from __future__ import annotations

import time
from collections.abc import Sequence

from problems.types import Problem
from rewards.language import is_language_consistent
from rewards.registry import RewardSet
from rewards.repetition import repeated_ngram_share
from rl.scoring import RankRollouts, ScoredGroups
from sampling.interface import Completion

REPEATING_AT = 0.25  # a completion repeats itself when over a quarter of its word trigrams recur


def text_signals(
    batch: Sequence[Problem], groups: Sequence[Sequence[Completion]]
) -> dict[str, float]:
    """What the completions' text says about a collapse: the share that repeats itself (over a
    quarter of its word trigrams seen before in it) and the share of reasoning completions in
    their prompt's one script (rewards/language.py, as evaluation counts it)."""
    flat = [(p, c.text) for p, group in zip(batch, groups, strict=True) for c in group]
    if not flat:
        return {}
    repeating = sum(repeated_ngram_share(text) > REPEATING_AT for _, text in flat)
    signals = {"completion/repetition_rate": repeating / len(flat)}
    reasoning = [(p, text) for p, text in flat if p.kind == "reasoning"]
    if reasoning:
        consistent = sum(is_language_consistent(text, p.language) for p, text in reasoning)
        signals["completion/language_consistency_rate"] = consistent / len(reasoning)
    return signals


def term_shares(scored: ScoredGroups, weights: dict[str, float]) -> dict[str, float]:
    """Each reward term's share of the step's total reward, by size (`reward/<name>/share`):
    |weight x its sum over the samples it scored| over the same summed over every term."""
    sizes = {
        name: abs(weights.get(name, 1.0) * sum(s for s in scores if s is not None))
        for name, scores in scored.per_reward.items()
    }
    total = sum(sizes.values())
    if total <= 0:
        return {}
    return {f"reward/{name}/share": size / total for name, size in sizes.items()}


def term_unscorable(whole: RankRollouts, rewards: RewardSet) -> dict[str, float]:
    """Each reward term's unscorable share among the samples it applies to
    (`reward/<name>/unscorable_fraction`): a judge that fails while the others score."""
    g = len(whole.groups[0]) if whole.groups else 1
    shares = {}
    for name, scores in whole.scored.per_reward.items():
        applies = [
            s
            for i, s in enumerate(scores)
            if rewards.applies(name, whole.batch[i // g].kind, whole.batch[i // g].family)
        ]
        if applies:
            unscorable = sum(s is None for s in applies) / len(applies)
            shares[f"reward/{name}/unscorable_fraction"] = unscorable
    return shares


def step_signals(whole: RankRollouts, rewards: RewardSet) -> dict[str, float]:
    """The step's text signals, term shares and unscorable shares, from the whole batch, and
    the time they took (`time/signals_seconds`: part of the guard's cost)."""
    began = time.perf_counter()
    signals = (
        text_signals(whole.batch, whole.groups)
        | term_shares(whole.scored, rewards.weights)
        | term_unscorable(whole, rewards)
    )
    return signals | {"time/signals_seconds": time.perf_counter() - began}

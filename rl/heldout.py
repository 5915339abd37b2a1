"""The held-out probe of a GRPO stage: what it draws, and how its readings are graded."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from statistics import fmean as mean

from configs.reinforcement import GRPOConfig
from guard.paired import items_key, paid_key
from guard.watch import paired_readings
from models.chat import render_prompt
from problems.loader import load_problems
from problems.types import Problem
from rewards.accuracy import verifiable_problems
from rewards.registry import RewardSet
from rewards.verifiers import grade_readings
from rl.probing import HeldoutProbe
from rl.scoring import score
from rl.sources import DrawRequest
from sampling.factory import context_length
from sampling.interface import Completion, SamplingParams


def heldout_probe(config: GRPOConfig, heldout_path: Path, tokenizer) -> HeldoutProbe:
    """The R1-Zero figures over training (the paper's Figures 2 and 3, small): held-out pass@1,
    strict and lenient, per family, and the mean length of the held-out responses; and, for the
    guard's paired readings (guard/paired.py, guard/watch.py `paired_readings`), each problem's
    share of samples found right in the readings the guard reads, and the share that each
    training verifier that is not the grader's own pays for. What it draws is a request, so
    that sampling workers can draw it off the trainer's path (rl/probing.py)."""
    probe = config.probe
    where = f"the held-out probe on {heldout_path}"
    problems = verifiable_problems(load_problems(heldout_path), where)[: probe.problems]
    prompts = [render_prompt(tokenizer, p.question) for p in problems]
    max_new = probe.max_new_tokens or config.max_new_tokens
    params = SamplingParams(probe.temperature, probe.top_p, max_new, config.seed)
    readings, unvetted = paired_readings(config.guard, config.rewards)
    paying_terms = [t for t in config.rewards if t.name in unvetted]
    paying = RewardSet.from_terms(paying_terms) if paying_terms else None

    def grade(groups: list[list[Completion]]) -> dict[str, float]:
        flat = [p for p, group in zip(problems, groups, strict=True) for _ in group]
        texts = [c.text for group in groups for c in group]
        figures = {"mean_tokens": mean(len(c.token_ids) for g in groups for c in g)}
        graded = zip(("pass_at_1", "pass_at_1_lenient"), grade_readings(flat, texts), strict=True)
        for reading, grades in graded:
            right = [g.correct is True for g in grades]
            figures[reading] = mean(right)
            for family in sorted({p.family for p in problems}):
                mine = [r for r, p in zip(right, flat, strict=True) if p.family == family]
                figures[f"{family}/{reading}"] = mean(mine)
            figures |= found_items(reading, right, flat, probe.samples, readings)
        if paying is not None:
            scored = score(problems, prompts, groups, paying).per_reward
            for term, values in scored.items():
                paid = [None if v is None else v >= 1.0 for v in values]
                figures |= per_problem(paid_key(term), paid, probe.samples)
        return figures

    request = DrawRequest(prompts, probe.samples, params)
    return HeldoutProbe(request, grade, context_length(tokenizer, prompts, max_new))


def found_items(
    reading: str,
    right: Sequence[bool],
    flat: Sequence[Problem],
    samples: int,
    wanted: Collection[str],
) -> dict[str, float]:
    """Each problem's share of samples the grader found right under `reading`, for each
    held-out reading in `wanted` that is this one: over every problem (`heldout/<reading>` ->
    `items/<reading>/<i>`) or over a family's (`heldout/<family>/<reading>` ->
    `items/<family>/<reading>/<i>`), each problem under its index among all."""
    items = {}
    if f"heldout/{reading}" in wanted:
        items |= per_problem(items_key(f"heldout/{reading}"), right, samples)
    for family in sorted({p.family for p in flat}):
        key = f"heldout/{family}/{reading}"
        if key in wanted:
            mine = [r if p.family == family else None for r, p in zip(right, flat, strict=True)]
            items |= per_problem(items_key(key), mine, samples)
    return items


def per_problem(prefix: str, verdicts: Sequence[bool | None], samples: int) -> dict[str, float]:
    """`prefix<i>`: the share of problem i's `samples` verdicts that are true (verdicts in problem
    order, `samples` each); a problem whose verdicts are all None (not read) is left out."""
    shares = {}
    for i in range(len(verdicts) // samples):
        mine = verdicts[i * samples : (i + 1) * samples]
        if all(v is None for v in mine):
            continue
        shares[f"{prefix}{i}"] = sum(v is True for v in mine) / samples
    return shares

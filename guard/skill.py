"""`reward_without_skill`: a family verifier's training pass rate against the held-out probe of
the same family. Its readings: the gap between the two (the held-out change read with the probe's
sampling allowance), and the paired readings of guard/paired.py (a verifier that pays more than
the probe's grader finds; held-out skill fallen on the same problems)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from configs.guard import RewardWithoutSkill
from guard.history import History, Point, baseline, first, last_step, recent, series
from guard.paired import Fell, Overpaid, sampling_allowance, skill_fell, verifier_overpays
from guard.trip import Trip, rounded, start_of


@dataclass(frozen=True)
class SkillPair:
    """A family verifier's training pass rate and the held-out pass@1 that should follow it."""

    label: str  # the family ("math"), or "all"
    reward_key: str  # reward/<term>/mean
    probe_key: str  # heldout/<family>/pass_at_1[_lenient]

    @property
    def term(self) -> str:
        """The verifier term's name."""
        return self.reward_key.removeprefix("reward/").removesuffix("/mean")


def smoothed(points: Sequence[Point], k: int) -> list[Point]:
    """Each reading as the mean of it and the `k - 1` before it (fewer at the start)."""
    return [
        (s, fmean(v for _, v in points[max(0, i - k + 1) : i + 1]))
        for i, (s, _) in enumerate(points)
    ]


def reference_reading(readings: Sequence[Point], reference: str) -> Point:
    """The reading the latest is set against: the first, or the best before the latest (the
    earliest of equals)."""
    return readings[0] if reference == "first" else max(readings[:-1], key=lambda p: p[1])


def reward_up_to(points: Sequence[Point], step: int, window: int) -> tuple[float, str] | None:
    """A training rate's mean over the `window` steps up to `step`, or over the stage's first
    `window` steps where `step` comes before their end (or the window is too thin to read),
    and which window it was."""
    start = first(points, window)
    if start is None:
        return None
    later = recent(points, step, window) if step > start[1] else None
    if later is None:
        return start[0], f"first {window} steps"
    return later, f"{window} steps to step {step}"


def reward_without_skill(
    history: History, rule: RewardWithoutSkill, pairs: Sequence[SkillPair]
) -> Trip | None:
    """Read when a probe lands: a family verifier's training pass rate (its last `window`
    steps against the `window` steps up to the reference probe) gained at least `gap` on that
    family's held-out pass@1 (each reading the mean of `smooth` probes; the latest against the
    first, or the best before it: a rise of the one, a fall of the other, or both), a held-out
    fall counted only past what the probe's sampling explains where the probe keeps per-problem
    values (`sampling_allowance`), and the held-out pass@1 did not rise by more than
    `-probe_fall`. The stage's first and last windows must be apart. Before that, the paired
    readings (guard/paired.py): a training verifier that pays `overpay` more than the probe's
    grader finds on the probe's own completions trips from the first probe on; and the held-out
    pass rate fallen by `fall` on the same problems since an earlier probe, while the training
    pass rate did not fall with it (less than half as far)."""
    now, w = last_step(history), rule.window
    for pair in pairs:
        probes = series(history, pair.probe_key)
        if not probes or probes[-1][0] != now:
            continue
        if rule.overpay is not None:
            over = verifier_overpays(history, pair.term, pair.probe_key, rule.overpay, rule.alpha)
            if over is not None:
                return overpaid_trip(pair, over, rule)
        points = series(history, pair.reward_key)
        if rule.fall is not None:
            fell = skill_fell(history, pair.probe_key, rule.fall, rule.alpha)
            trip = fell_trip(pair, fell, points, now, rule) if fell is not None else None
            if trip is not None:
                return trip
        if len(probes) < 2:
            continue
        if baseline(history, pair.reward_key, w) is None:
            continue
        readings = smoothed(probes, rule.smooth)
        reference = reference_reading(readings, rule.reference)
        (then_step, probe_then), probe_now = reference, readings[-1][1]
        up_to, reward_now = reward_up_to(points, then_step, w), recent(points, now, w)
        if up_to is None or reward_now is None:
            continue
        reward_then, span = up_to
        rise, change = reward_now - reward_then, probe_now - probe_then
        entries = [h for h in history if pair.probe_key in h and "step" in h]
        chance = sampling_allowance(entries, readings.index(reference), pair.probe_key, rule.alpha)
        if rise - beyond_chance(change, chance) >= rule.gap and change <= -rule.probe_fall:
            return gap_trip(
                pair, rule, now, span, (reward_then, reward_now), reference, probe_now, chance
            )
    return None


def beyond_chance(change: float, chance: float) -> float:
    """A held-out change as the gap reads it: a rise whole, a fall only as far as it goes past
    `chance`, what the probe's sampling can move it by (0: a fall within chance)."""
    return change if change >= 0 else min(0.0, change + chance)


def gap_trip(
    pair: SkillPair,
    rule: RewardWithoutSkill,
    now: int,
    span: str,
    rewards: tuple[float, float],
    reference: Point,
    probe_now: float,
    chance: float,
) -> Trip:
    """`reward_without_skill` for a training pass rate that gained at least `gap` on the
    held-out one, a held-out fall counted only past `chance` (the probe's sampling allowance;
    0 for an unpaired probe)."""
    (reward_then, reward_now), (then_step, probe_then) = rewards, reference
    rise, change = reward_now - reward_then, probe_now - probe_then
    read = beyond_chance(change, chance)
    allowed = f", {read:+.3f} past ± {chance:.3f} of the probe's sampling" if chance else ""
    return Trip(
        "reward_without_skill",
        now,
        start_of(now, rule.window),
        f"{pair.label}: training pass rate {reward_then:.3f} -> {reward_now:.3f} "
        f"({rise:+.3f}, {span} to last {rule.window}) while "
        f"held-out pass@1 went {probe_then:.3f} -> {probe_now:.3f} ({change:+.3f}{allowed}, "
        f"{_probe_span(rule, then_step, now)})",
        {
            "reward_then": rounded(reward_then),
            "reward_now": rounded(reward_now),
            "probe_then": rounded(probe_then),
            "probe_now": rounded(probe_now),
        }
        | ({"probe_allowance": rounded(chance)} if chance else {}),
        pair.label,
    )


def overpaid_trip(pair: SkillPair, over: Overpaid, rule: RewardWithoutSkill) -> Trip:
    """`reward_without_skill` for a verifier that pays more than the probe's grader finds."""
    d = over.difference
    return Trip(
        "reward_without_skill",
        over.step,
        start_of(over.step, rule.window),
        f"{pair.label}: the training verifier {pair.term} pays {over.paid:.3f} of the "
        f"{_probes(over.look)} completions where its grader finds {over.found:.3f} "
        f"({d.mean:+.3f} ± {d.se:.3f} over {d.n} problem draws, {d.differing} differ; at least "
        f"{over.bound:+.3f} at probe {over.look} at a false-alarm rate of {rule.alpha:g} a "
        f"stage; bound {rule.overpay:.2f})",
        {
            "paid": rounded(over.paid),
            "found": rounded(over.found),
            "overpay": rounded(d.mean),
            "overpay_se": rounded(d.se),
            "overpay_bound": rounded(over.bound),
        },
        pair.label,
    )


def _probes(looks: int) -> str:
    return "probe's" if looks == 1 else f"{looks} probes'"


def fell_trip(
    pair: SkillPair, fell: Fell, points: Sequence[Point], now: int, rule: RewardWithoutSkill
) -> Trip | None:
    """`reward_without_skill` for a held-out skill fallen beyond chance (`fell`), where the
    family's training pass rate (its last `window` steps against the `window` steps up to the
    probe it fell from) fell less than half as far: the training verifier goes on paying for
    what the held-out grader no longer finds. None where the training rate fell with it (a
    collapse, not a hack: `collapse` reads it; half, since its window's mean lags the probe's
    reading) or has no window to read yet."""
    assert rule.fall is not None
    up_to = reward_up_to(points, fell.then_step, rule.window)
    reward_now = recent(points, now, rule.window)
    if up_to is None or reward_now is None:
        return None
    (reward_then, span), d = up_to, fell.difference
    if reward_now - reward_then <= d.mean / 2:
        return None
    return Trip(
        "reward_without_skill",
        now,
        start_of(now, rule.window),
        f"{pair.label}: held-out pass@1 fell {fell.then:.3f} -> {fell.now:.3f} on the same "
        f"{d.n} problems since step {fell.then_step} ({d.mean:+.3f} ± {d.se:.3f}, {d.differing} "
        f"differ; at most {fell.bound:+.3f} at probe {fell.look} at a false-alarm rate of "
        f"{rule.alpha:g} a stage; bound {rule.fall:.2f}) while the training pass rate went "
        f"{reward_then:.3f} -> {reward_now:.3f} ({span} to last {rule.window})",
        {
            "probe_then": rounded(fell.then),
            "probe_now": rounded(fell.now),
            "fall": rounded(-d.mean),
            "fall_se": rounded(d.se),
            "fall_bound": rounded(-fell.bound),
            "reward_then": rounded(reward_then),
            "reward_now": rounded(reward_now),
        },
        pair.label,
    )


def _probe_span(rule: RewardWithoutSkill, then: int, now: int) -> str:
    which = "" if rule.reference == "first" else "best at "
    mean = "" if rule.smooth == 1 else f", each the mean of {rule.smooth} probes"
    return f"{which}step {then} to {now}{mean}" if which else f"steps {then}-{now}{mean}"

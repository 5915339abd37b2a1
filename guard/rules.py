"""The guard's rules: each a pure function of a stage's metric history (one dict per step, as the
GRPO trainer logs it) and its settings (configs/guard.py), returning a `Trip` that names the
rule, the step, the window it read and its numbers, or None.

The signals they read, all logged every step by the trainer (rl/trainer.py, rl/signals.py) or by
its held-out probe every `probe.every` steps:
`reward/<term>/mean` and `/share`, `heldout/[<family>/]pass_at_1[_lenient]`,
`completion/mean_tokens`, `completion/truncated_fraction`, `entropy`,
`groups/zero_spread_fraction`, `kl`, `reward/unscorable_fraction`, a verifier's verdict counts
`reward/<term>/<reason>`, `completion/repetition_rate`, `completion/language_consistency_rate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean

from configs.guard import (
    Collapse,
    Drift,
    GamedTerm,
    JudgeTrouble,
    LanguageMixing,
    LengthRunaway,
    Repetition,
    RewardWithoutSkill,
)
from guard.history import History, Point, first, last_step, recent, series
from guard.paired import Fell, Overpaid, skill_fell, verifier_overpays


@dataclass(frozen=True)
class Trip:
    """A rule that fired: at `step`, over the steps from `since` on, for `reason`."""

    rule: str
    step: int
    since: int
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)
    subject: str = ""  # what it is about: a family, a reward term, a verifier

    def to_dict(self) -> dict:
        return {
            "rule": self.rule,
            "step": self.step,
            "since": self.since,
            "reason": self.reason,
            "numbers": self.numbers,
            "subject": self.subject,
        }


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


def start_of(now: int, window: int) -> int:
    """The first step of the window of `window` steps that ends at `now` (step 1 at the least)."""
    return max(1, now - window + 1)


def _r(value: float) -> float:
    return round(value, 4)


def windowed(rule: str, now: int, window: int, reason: str, **numbers: float) -> Trip:
    """A trip over the `window` steps up to `now`, its numbers rounded."""
    return Trip(rule, now, start_of(now, window), reason, {k: _r(v) for k, v in numbers.items()})


def baseline(history: History, key: str, window: int) -> tuple[float, float] | None:
    """(the mean over the stage's first `window` steps, the mean over the last `window`) of
    `key`, once the two windows no longer overlap; else None."""
    points, now = series(history, key), last_step(history)
    start, level = first(points, window), recent(points, now, window)
    if start is None or level is None or now - window < start[1]:
        return None
    return start[0], level


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
    first, or the best before it: a rise of the one, a fall of the other, or both), and the
    held-out pass@1 did not rise by more than `-probe_fall`. The stage's first and last windows
    must be apart. Before that, the paired readings (guard/paired.py): a training verifier that
    pays `overpay` more than the probe's grader finds on the probe's own completions trips from
    the first probe on; and the held-out pass rate fallen by `fall` on the same problems since
    an earlier probe, while the training pass rate did not fall with it (less than half as
    far)."""
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
        then_step, probe_then = reference_reading(readings, rule.reference)
        probe_now = readings[-1][1]
        up_to, reward_now = reward_up_to(points, then_step, w), recent(points, now, w)
        if up_to is None or reward_now is None:
            continue
        reward_then, span = up_to
        rise, change = reward_now - reward_then, probe_now - probe_then
        if rise - change >= rule.gap and change <= -rule.probe_fall:
            return Trip(
                "reward_without_skill",
                now,
                start_of(now, w),
                f"{pair.label}: training pass rate {reward_then:.3f} -> {reward_now:.3f} "
                f"({rise:+.3f}, {span} to last {w}) while "
                f"held-out pass@1 went {probe_then:.3f} -> {probe_now:.3f} ({change:+.3f}, "
                f"{_probe_span(rule, then_step, now)})",
                {
                    "reward_then": _r(reward_then),
                    "reward_now": _r(reward_now),
                    "probe_then": _r(probe_then),
                    "probe_now": _r(probe_now),
                },
                pair.label,
            )
    return None


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
            "paid": _r(over.paid),
            "found": _r(over.found),
            "overpay": _r(d.mean),
            "overpay_se": _r(d.se),
            "overpay_bound": _r(over.bound),
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
            "probe_then": _r(fell.then),
            "probe_now": _r(fell.now),
            "fall": _r(-d.mean),
            "fall_se": _r(d.se),
            "fall_bound": _r(-fell.bound),
            "reward_then": _r(reward_then),
            "reward_now": _r(reward_now),
        },
        pair.label,
    )


def _probe_span(rule: RewardWithoutSkill, then: int, now: int) -> str:
    which = "" if rule.reference == "first" else "best at "
    mean = "" if rule.smooth == 1 else f", each the mean of {rule.smooth} probes"
    return f"{which}step {then} to {now}{mean}" if which else f"steps {then}-{now}{mean}"


def risen_past(
    history: History, key: str, window: int, ceiling: float, rise: float
) -> tuple[float, float] | None:
    """(first window, last window) of `key` when the last is at least `ceiling` and at least
    `rise` above the first; else None."""
    found = baseline(history, key, window)
    if found is None or found[1] < ceiling or found[1] - found[0] < rise:
        return None
    return found


def length_runaway(history: History, rule: LengthRunaway) -> Trip | None:
    """The truncated share over the window past `max_truncated` and `truncated_rise` above the
    first window's, or the mean length past `max_growth` times the first window's."""
    now, w = last_step(history), rule.window
    cut = risen_past(
        history, "completion/truncated_fraction", w, rule.max_truncated, rule.truncated_rise
    )
    if cut is not None:
        return windowed(
            "length_runaway",
            now,
            w,
            f"{cut[1]:.2f} of completions cut at the token limit over steps "
            f"{start_of(now, w)}-{now} (first window {cut[0]:.2f}, bound {rule.max_truncated:.2f})",
            truncated_then=cut[0],
            truncated_now=cut[1],
        )
    length = baseline(history, "completion/mean_tokens", w)
    if length is None or length[1] < rule.max_growth * length[0]:
        return None
    return windowed(
        "length_runaway",
        now,
        w,
        f"mean length {length[0]:.0f} -> {length[1]:.0f} tokens "
        f"(x{length[1] / length[0]:.2f}, bound x{rule.max_growth:.2f})",
        length_then=length[0],
        length_now=length[1],
    )


def collapse(history: History, rule: Collapse) -> Trip | None:
    """Token entropy below `min_entropy_ratio` of the first window's, or nearly every group
    without reward spread where the first window was not."""
    now, w = last_step(history), rule.window
    entropy = baseline(history, "entropy", w)
    if entropy is not None and entropy[1] < rule.min_entropy_ratio * entropy[0]:
        return windowed(
            "collapse",
            now,
            w,
            f"token entropy {entropy[0]:.4f} -> {entropy[1]:.4f} over steps "
            f"{start_of(now, w)}-{now} (below x{rule.min_entropy_ratio:g} of its first window)",
            entropy_then=entropy[0],
            entropy_now=entropy[1],
        )
    zero = risen_past(
        history, "groups/zero_spread_fraction", w, rule.max_zero_spread, rule.zero_spread_rise
    )
    if zero is None:
        return None
    return windowed(
        "collapse",
        now,
        w,
        f"{zero[1]:.2f} of groups with no reward spread over steps {start_of(now, w)}-{now} "
        f"(first window {zero[0]:.2f}, ceiling {rule.max_zero_spread:.2f})",
        zero_spread_then=zero[0],
        zero_spread_now=zero[1],
    )


def drift(history: History, rule: Drift) -> Trip | None:
    now, w = last_step(history), rule.window
    kl = recent(series(history, "kl"), now, w)
    if kl is None or kl <= rule.max_kl:
        return None
    return windowed(
        "drift",
        now,
        w,
        f"KL to the reference {kl:.4f} over steps {start_of(now, w)}-{now} "
        f"(ceiling {rule.max_kl:g})",
        kl=kl,
    )


def accuracy_change(
    history: History, probe_key: str | None, verifier_keys: Sequence[str]
) -> float | None:
    """How much accuracy moved since the stage began: the held-out probe's last reading less its
    first, or, without a probe, the mean over the verifiers of their training pass rate's last
    ten steps less their first ten."""
    if probe_key is not None:
        probes = series(history, probe_key)
        if len(probes) >= 2:
            return probes[-1][1] - probes[0][1]
    now, changes = last_step(history), []
    for key in verifier_keys:
        points = series(history, key)
        start, end = first(points, 10), recent(points, now, 10)
        if start is not None and end is not None and now - 10 >= start[1]:
            changes.append(end - start[0])
    return sum(changes) / len(changes) if changes else None


def gamed_term(
    history: History,
    rule: GamedTerm,
    shaping: dict[str, float],
    probe_key: str | None,
    verifier_keys: Sequence[str],
) -> Trip | None:
    """A shaping term (`shaping`: name -> weight) adds `rise` more to the mean reward (weight x
    `reward/<term>/mean`) over the last window than over the stage's first, or its share of the
    total (`reward/<term>/share`) rose by `share_rise`, while accuracy rose by less than
    `accuracy_rise`."""
    now, w = last_step(history), rule.window
    for name, weight in shaping.items():
        mean = baseline(history, f"reward/{name}/mean", w)
        share = baseline(history, f"reward/{name}/share", w) or (0.0, 0.0)
        if mean is None:
            continue
        added, share_rise = weight * (mean[1] - mean[0]), share[1] - share[0]
        if added < rule.rise and share_rise < rule.share_rise:
            continue
        moved = accuracy_change(history, probe_key, verifier_keys)
        if moved is None or moved >= rule.accuracy_rise:
            continue
        return Trip(
            "gamed_term",
            now,
            start_of(now, w),
            f"{name} adds {weight * mean[0]:.3f} -> {weight * mean[1]:.3f} to the mean reward "
            f"(share {share[0]:.2f} -> {share[1]:.2f}) while accuracy moved {moved:+.3f}",
            {
                "added_then": _r(weight * mean[0]),
                "added_now": _r(weight * mean[1]),
                "share_then": _r(share[0]),
                "share_now": _r(share[1]),
                "accuracy_change": _r(moved),
            },
            name,
        )
    return None


# keys beside a verifier's verdict counts (its unscorable samples are read as a share above)
_NOT_REASONS = ("mean", "std", "share", "unscorable", "unscorable_fraction")


def judge_trouble(history: History, rule: JudgeTrouble, verifiers: Sequence[str]) -> Trip | None:
    """Samples no reward could score, or those a reward term could not score among the samples
    it judges (`reward/<term>/unscorable_fraction`), above `max_unscorable`; or one of the
    judge's own failure `reasons` above `max_reason_share` of a verifier's verdicts; over the
    window."""
    now, w = last_step(history), rule.window
    keys = ["reward/unscorable_fraction"] + sorted(
        {
            k
            for h in history[-w:]
            for k in h
            if k.endswith("/unscorable_fraction") and k.count("/") == 2
        }
    )
    for key in keys:
        unscorable = recent(series(history, key), now, w)
        if unscorable is not None and unscorable > rule.max_unscorable:
            who = "samples" if key.count("/") == 1 else f"{key.split('/')[1]}'s samples"
            return Trip(
                "judge_trouble",
                now,
                start_of(now, w),
                f"{unscorable:.2f} of {who} unscorable over steps {start_of(now, w)}-{now} "
                f"(ceiling {rule.max_unscorable:.2f})",
                {"unscorable": _r(unscorable)},
                "" if key.count("/") == 1 else key.split("/")[1],
            )
    return _reason_trouble(history, rule, verifiers, now)


def _reason_trouble(
    history: History, rule: JudgeTrouble, verifiers: Sequence[str], now: int
) -> Trip | None:
    w = rule.window
    steps = [h for h in history if now - w < h.get("step", 0) <= now]
    for name in verifiers:
        prefix = f"reward/{name}/"
        counts: dict[str, float] = {}
        for h in steps:
            for key, value in h.items():
                reason = key[len(prefix) :] if key.startswith(prefix) else ""
                if reason and "/" not in reason and reason not in _NOT_REASONS:
                    counts[reason] = counts.get(reason, 0.0) + value
        total = sum(counts.values())
        for reason in rule.reasons:
            share = counts.get(reason, 0.0) / total if total else 0.0
            if share > rule.max_reason_share:
                return Trip(
                    "judge_trouble",
                    now,
                    start_of(now, w),
                    f"{name}: {share:.2f} of verdicts are '{reason}' over steps "
                    f"{start_of(now, w)}-{now} (ceiling {rule.max_reason_share:.2f})",
                    {"share": _r(share), "verdicts": total},
                    name,
                )
    return None


def repetition(history: History, rule: Repetition) -> Trip | None:
    now, w = last_step(history), rule.window
    rate = risen_past(history, "completion/repetition_rate", w, rule.max_rate, rule.rise)
    if rate is None:
        return None
    return windowed(
        "repetition",
        now,
        w,
        f"{rate[1]:.2f} of completions repeat themselves (first window {rate[0]:.2f}, "
        f"ceiling {rule.max_rate:.2f})",
        rate_then=rate[0],
        rate_now=rate[1],
    )


def language_mixing(history: History, rule: LanguageMixing) -> Trip | None:
    now, w = last_step(history), rule.window
    rate = baseline(history, "completion/language_consistency_rate", w)
    if rate is None or rate[0] - rate[1] < rule.fall:
        return None
    return windowed(
        "language_mixing",
        now,
        w,
        f"language-consistent share {rate[0]:.2f} -> {rate[1]:.2f} "
        f"(fall {rate[0] - rate[1]:.2f}, bound {rule.fall:.2f})",
        rate_then=rate[0],
        rate_now=rate[1],
    )

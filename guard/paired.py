"""Paired readings of the held-out probe: the same problems graded twice, so that only the
problems whose verdicts differ carry information, and a sequential test over a stage's probes
whose false-alarm rate is a setting.

The probe (stages/reasoning_rl.py) records, beside its pass rates, one value per held-out
problem in the history entry of the step it ran at (never logged as a metric), for the readings
the guard's `reward_without_skill` reads (`probe_readings`):

- `items/<family>/<reading>/<i>` (or `items/<reading>/<i>` for a verifier on every family): the
  share of problem `i`'s samples the probe's grader finds right (`reading` is `pass_at_1` or
  `pass_at_1_lenient`);
- `items/paid/<term>/<i>`: the share of the same samples that the stage's training verifier
  `term` pays for, for each verifier term that is not the grader's own (a term that is the
  grader's own pays exactly what it finds).

Two readings use them:

- `verifier_overpays`, the two on the same completions, pooled over the stage's probes: the
  training verifier paying more than the grader finds, by a size worth stopping for and beyond
  what chance disagreement explains, is a hole from the first probe on, whether or not it has
  been taken up;
- `skill_fell`, the grader's verdicts on the same problems at two probes: the held-out skill
  fallen from its best reading so far, beyond what the probe's sampling explains (skill lost
  after honest gains, whatever the training verifier; the rule sets it beside the training pass
  rate, which a hack keeps up).

And the rule's gap between the training pass rate and the held-out one counts a held-out fall
only past what the probe's sampling explains (`sampling_allowance`): a probe of few problems a
family moves by chance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, stdev

ITEMS = "items/"
PAID = "items/paid/"


def items_key(probe_key: str) -> str:
    """A probe reading's per-problem prefix: `heldout/math/pass_at_1` -> `items/math/pass_at_1/`."""
    return ITEMS + probe_key.removeprefix("heldout/") + "/"


def paid_key(term: str) -> str:
    return f"{PAID}{term}/"


def item_values(entry: Mapping[str, float], prefix: str) -> dict[int, float]:
    """Problem index -> value, for every key `prefix<i>` of a history entry."""
    found = {}
    for key, value in entry.items():
        if key.startswith(prefix) and key[len(prefix) :].isdigit():
            found[int(key[len(prefix) :])] = float(value)
    return found


def spent(alpha: float, look: int) -> float:
    """The false-alarm rate spent at the `look`-th probe (1, 2, ...): alpha * 6 / (pi^2 look^2),
    which sums to alpha over any number of probes, so the stage's length need not be known."""
    return alpha * 6.0 / (math.pi**2 * look**2)


def critical(alpha: float, look: int, among: int = 1) -> float:
    """The critical value at the `look`-th probe for each of `among` readings made there:
    sqrt(2 ln(among / rate)). A sum of differences whose signs are as likely either way (the two
    readers alike, or the same skill at two probes) exceeds this many times the root of its sum
    of squares with probability at most exp(-x^2 / 2) = rate / among, whatever the differences'
    sizes and however few problems differ (a bound, not the normal approximation, which
    undercounts false alarms where few problems differ); over the `among` readings, at most the
    rate."""
    return math.sqrt(2.0 * math.log(among / spent(alpha, look)))


@dataclass(frozen=True)
class PairedDifference:
    """The mean of paired differences over `n` problems, its standard error, how many problems
    differ at all, and the root of the sum of their squares over `n` (the mean's spread were
    each difference's sign a coin's: what the sequential bound is read against)."""

    mean: float
    se: float
    n: int
    differing: int
    spread: float

    def lower(self, x: float) -> float:
        """The lower confidence bound at critical value `x`."""
        return self.mean - x * self.spread


Items = Mapping[int, float]


def pooled(pairs: Sequence[tuple[Items, Items]]) -> PairedDifference | None:
    """`second - first` over every problem both hold in each pair (the same problem at two
    probes counts twice: its two draws are independent); None with fewer than two."""
    diffs = [b[i] - a[i] for a, b in pairs for i in sorted(set(a) & set(b))]
    if len(diffs) < 2:
        return None
    return PairedDifference(
        fmean(diffs),
        stdev(diffs) / math.sqrt(len(diffs)),
        len(diffs),
        sum(1 for d in diffs if d != 0),
        math.sqrt(sum(d * d for d in diffs)) / len(diffs),
    )


def paired(first: Mapping[int, float], second: Mapping[int, float]) -> PairedDifference | None:
    """`second - first` over the problems both hold; None with fewer than two."""
    return pooled([(first, second)])


def sampling_allowance(
    entries: Sequence[Mapping[str, float]], then: int, probe_key: str, alpha: float
) -> float:
    """How far the held-out reading under `probe_key` can move from probe `entries[then]` to
    the latest, `entries[-1]`, by the probe's sampling alone: the spread of their paired
    difference on the same problems times the latest look's critical value, as `skill_fell`
    reads each earlier probe (so that a gap read past it is a false alarm no more often than
    the fall reading). `entries` are the stage's probe entries in order; 0 where they keep no
    per-problem values under `probe_key` (the reading is then unpaired)."""
    prefix = items_key(probe_key)
    kept = probe_entries(entries, prefix)
    difference = paired(item_values(entries[then], prefix), item_values(entries[-1], prefix))
    if difference is None or len(kept) < 2:
        return 0.0
    look = len(kept) - 1
    return critical(alpha, look, look) * difference.spread


@dataclass(frozen=True)
class Overpaid:
    """The training verifier paid `paid` where the grader found `found` (pass rates over the
    same completions, pooled over the stage's probes), read at the `look`-th probe; `bound` is
    the difference's lower confidence bound at that look's critical value."""

    step: int
    look: int
    found: float
    paid: float
    difference: PairedDifference
    bound: float


def probe_entries(history: Sequence[Mapping[str, float]], prefix: str) -> list[Mapping[str, float]]:
    """The history entries that hold per-problem values under `prefix` (one per probe)."""
    return [h for h in history if any(k.startswith(prefix) for k in h)]


def verifier_overpays(
    history: Sequence[Mapping[str, float]],
    term: str,
    probe_key: str,
    gap: float,
    alpha: float,
    min_differing: int = 3,
) -> Overpaid | None:
    """Read at a probe (the history's last entry): whether training verifier `term` pays, on the
    completions of the stage's probes so far (pooled: a problem drawn at k probes counts k
    times), at least `gap` more than the grader finds under `probe_key`'s reading (a size worth
    stopping for), and more by a margin the grader's own disagreement cannot explain: the
    pooled paired difference's lower confidence bound above 0 at this look's critical value
    (alpha spent over the stage's probes: `spent`, `critical`), on at least `min_differing`
    problem draws where the two disagree. Pooling lets a probe of few problems add up, probe
    after probe, to what one large probe sees at once; a verifier that agrees with the grader
    adds only noise the bound allows for. (A hole that opens late is read diluted by the
    probes before it; the fall reading, `skill_fell`, reads skill lost after gains.)"""
    if not history:
        return None
    entries = probe_entries(history, paid_key(term))
    if not entries or entries[-1].get("step") != history[-1].get("step"):
        return None
    readings = [
        (item_values(e, items_key(probe_key)), item_values(e, paid_key(term))) for e in entries
    ]
    difference = pooled(readings)
    if difference is None or difference.differing < min_differing:
        return None
    look = len(entries)
    bound = difference.lower(critical(alpha, look))
    if bound <= 0 or difference.mean < gap:
        return None
    found = [f[i] for f, p in readings for i in set(f) & set(p)]
    paid = [p[i] for f, p in readings for i in set(f) & set(p)]
    step = int(entries[-1]["step"])
    return Overpaid(step, look, fmean(found), fmean(paid), difference, bound)


@dataclass(frozen=True)
class Fell:
    """The grader's held-out pass rate on the same problems fell from `then` at step
    `then_step` (the probe it fell most from) to `now` at `step`, the `look`-th probe read;
    `bound` is the fall's upper confidence bound (below 0: fallen, beyond chance)."""

    step: int
    look: int
    then_step: int
    then: float
    now: float
    difference: PairedDifference
    bound: float


def skill_fell(
    history: Sequence[Mapping[str, float]],
    probe_key: str,
    fall: float,
    alpha: float,
    min_differing: int = 3,
) -> Fell | None:
    """Read at a probe (the history's last entry): whether the held-out skill under `probe_key`
    fell by at least `fall` on the same problems since an earlier probe of the stage, and by
    more than the probe's sampling explains. Each earlier probe is read against the latest (the
    best reading so far among them, and so no selection of the best can lend a false alarm):
    at the k-th probe with per-problem values, k - 1 readings at critical value
    `critical(alpha, k - 1, k - 1)`, so that over the stage's probes and the readings at each the
    false-alarm rate is at most `alpha` where the skill has not fallen. The fall reported is the
    largest of those that clear both bounds."""
    prefix = items_key(probe_key)
    entries = probe_entries(history, prefix)
    if len(entries) < 2 or entries[-1].get("step") != history[-1].get("step"):
        return None
    now = item_values(entries[-1], prefix)
    look = len(entries) - 1
    x = critical(alpha, look, look)
    worst: Fell | None = None
    for earlier in entries[:-1]:
        then = item_values(earlier, prefix)
        difference = paired(then, now)
        if difference is None or difference.differing < min_differing:
            continue
        bound = difference.mean + x * difference.spread
        if bound >= 0 or -difference.mean < fall:
            continue
        if worst is None or difference.mean < worst.difference.mean:
            common = set(then) & set(now)
            worst = Fell(
                int(entries[-1]["step"]),
                look + 1,
                int(earlier["step"]),
                fmean(then[i] for i in common),
                fmean(now[i] for i in common),
                difference,
                bound,
            )
    return worst

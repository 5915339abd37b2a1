"""Paired readings of the held-out probe: the same problems graded twice, so that only the
problems whose verdicts differ carry information, and a sequential test over a stage's probes
whose false-alarm rate is a setting.

Where a stage trains with a verifier that is not the grader's own, the probe
(stages/reasoning_rl.py) records, beside its pass rates, one value per held-out problem in the
history entry of the step it ran at (never logged as a metric; elsewhere nothing is kept):

- `items/<reading>/<i>` and `items/<family>/<reading>/<i>`: the share of problem `i`'s samples the
  probe's grader finds right (`reading` is `pass_at_1` or `pass_at_1_lenient`);
- `items/paid/<term>/<i>`: the share of the same samples that the stage's training verifier
  `term` pays for, for each verifier term that is not the grader's own (a term that is the
  grader's own pays exactly what it finds).

`verifier_overpays` reads the two on the same completions: the training verifier paying more
than the grader finds, by a size worth stopping for and beyond what chance disagreement
explains, is a hole from the first probe on, whether or not it has been taken up.
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


def critical(alpha: float, look: int) -> float:
    """The critical value at the `look`-th probe: sqrt(2 ln(1 / rate)). A sum of differences
    whose signs are as likely either way (the two readers alike) exceeds this many times the
    root of its sum of squares with probability at most exp(-x^2 / 2) = the rate, whatever
    the differences' sizes and however few problems differ (a bound, not the normal
    approximation, which undercounts false alarms where few problems differ)."""
    return math.sqrt(2.0 * math.log(1.0 / spent(alpha, look)))


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


def paired(first: Mapping[int, float], second: Mapping[int, float]) -> PairedDifference | None:
    """`second - first` over the problems both hold; None with fewer than two."""
    common = sorted(set(first) & set(second))
    if len(common) < 2:
        return None
    diffs = [second[i] - first[i] for i in common]
    return PairedDifference(
        fmean(diffs),
        stdev(diffs) / math.sqrt(len(diffs)),
        len(diffs),
        sum(1 for d in diffs if d != 0),
        math.sqrt(sum(d * d for d in diffs)) / len(diffs),
    )


@dataclass(frozen=True)
class Overpaid:
    """The training verifier paid `paid` where the grader found `found` (pass rates over the
    same completions), at the `look`-th probe; `bound` is the difference's lower confidence
    bound at that look's critical value."""

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
    probe's own completions, at least `gap` more than the grader finds under `probe_key`'s
    reading (a size worth stopping for), and more by a margin the grader's own disagreement
    cannot explain: the paired difference's lower confidence bound above 0 at this look's
    critical value (alpha spent over the stage's probes: `spent`, `critical`), on at least
    `min_differing` problems where the two disagree."""
    if not history:
        return None
    entries = probe_entries(history, paid_key(term))
    if not entries or entries[-1].get("step") != history[-1].get("step"):
        return None
    now = entries[-1]
    found, paid_now = item_values(now, items_key(probe_key)), item_values(now, paid_key(term))
    difference = paired(found, paid_now)
    if difference is None or difference.differing < min_differing:
        return None
    look = len(entries)
    bound = difference.lower(critical(alpha, look))
    if bound <= 0 or difference.mean < gap:
        return None
    common = set(found) & set(paid_now)
    return Overpaid(
        int(now["step"]),
        look,
        fmean(found[i] for i in common),
        fmean(paid_now[i] for i in common),
        difference,
        bound,
    )

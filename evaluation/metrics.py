"""Metrics over n sampled completions per problem.

pass@1 is the mean correctness over all n samples (DeepSeek-R1's pass@1); pass@k is the unbiased
estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k); cons@k is the accuracy of the majority
vote over the first k extracted answers. All three grade strictly (the answer read only from the
answer block); pass@1 lenient also reads a completion without one (rewards/accuracy.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the ratio of binomials without large factorials
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """Most frequent non-missing answer; ties go to the answer seen first."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


@dataclass(frozen=True)
class ProblemSamples:
    """The graded samples of one problem, in sampling order."""

    answers: Sequence[str | None]
    correct: Sequence[bool]
    well_formed: Sequence[bool]
    language_consistent: Sequence[bool]
    correct_lenient: Sequence[bool] | None = None  # graded without the answer-block rule


def cons_at_k(samples: ProblemSamples, k: int) -> float:
    vote = majority_vote(samples.answers[:k])
    if vote is None:
        return 0.0
    pairs = zip(samples.answers, samples.correct, strict=True)
    return float(any(a == vote and ok for a, ok in pairs))


def summarize(problems: Sequence[ProblemSamples], k: int) -> dict[str, float]:
    """Averages over problems: pass@1, pass@k, cons@k, format and language-consistency rates, and
    pass@1 lenient when the samples carry lenient grades."""
    if not problems:
        raise ValueError("no problems to summarize")
    n = len(problems[0].correct)
    if k > n:
        raise ValueError(f"k={k} exceeds the {n} samples per problem")

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    lenient = {}
    if all(p.correct_lenient is not None for p in problems):
        loose = [list(p.correct_lenient or ()) for p in problems]
        lenient["pass_at_1_lenient"] = mean([sum(c) / len(c) for c in loose])
        lenient[f"pass_at_{k}_lenient"] = mean([pass_at_k(len(c), sum(c), k) for c in loose])
    return lenient | {
        "pass_at_1": mean([sum(p.correct) / len(p.correct) for p in problems]),
        f"pass_at_{k}": mean([pass_at_k(len(p.correct), sum(p.correct), k) for p in problems]),
        f"cons_at_{k}": mean([cons_at_k(p, k) for p in problems]),
        "format_rate": mean([sum(p.well_formed) / len(p.well_formed) for p in problems]),
        "language_consistency_rate": mean(
            [sum(p.language_consistent) / len(p.language_consistent) for p in problems]
        ),
    }


@dataclass(frozen=True)
class EvalReport:
    """An evaluation's metrics and where its samples were written."""

    metrics: dict[str, float]
    samples_path: Path
    n_problems: int

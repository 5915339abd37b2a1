import itertools
import math

import pytest

from evaluation.metrics import ProblemSamples, cons_at_k, majority_vote, pass_at_k, summarize


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of all k-subsets of n samples (c of them correct) holding at least one correct."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_closed_form_worked_example():
    # n=10, c=3, k=2: 1 - C(7,2)/C(10,2) = 1 - 21/45
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)


@pytest.mark.parametrize("n,c,k", [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_majority_vote_ignores_missing_and_breaks_ties_by_first_seen():
    assert majority_vote(["3", None, "5", "5", None, None]) == "5"
    assert majority_vote(["3", "5", "5", "3"]) == "3"
    assert majority_vote([None, None]) is None


def test_cons_at_k_uses_only_first_k_samples():
    samples = ProblemSamples(
        ["7", "7", "9", "9", "9"], [False, False, True, True, True], [True] * 5, [True] * 5
    )
    assert cons_at_k(samples, 2) == 0.0
    assert cons_at_k(samples, 5) == 1.0


def test_summarize_worked_example():
    a = ProblemSamples(
        ["1", "1", "2", "1"], [True, True, False, True], [True, False, True, True], [True] * 4
    )
    b = ProblemSamples(
        [None, "4", "4", "5"], [False, False, False, False], [False] * 4, [True, True, False, False]
    )
    m = summarize([a, b], k=2)
    assert m["pass_at_1"] == pytest.approx((3 / 4 + 0) / 2)
    assert m["pass_at_2"] == pytest.approx((pass_at_k(4, 3, 2) + 0) / 2)
    assert m["cons_at_2"] == pytest.approx(0.5)
    assert m["format_rate"] == pytest.approx(3 / 8)
    assert m["language_consistency_rate"] == pytest.approx(6 / 8)
    assert "pass_at_1_lenient" not in m  # only when the samples were graded leniently too


def test_summarize_reports_lenient_pass_at_1_beside_the_strict_one():
    strict_only = ProblemSamples(
        ["4", None], [True, False], [True, False], [True, True], [True, True]
    )
    none_right = ProblemSamples(
        [None, None], [False, False], [False] * 2, [True] * 2, [True, False]
    )
    m = summarize([strict_only, none_right], k=1)
    assert m["pass_at_1"] == pytest.approx(0.25)
    assert m["pass_at_1_lenient"] == pytest.approx(0.75)


def test_summarize_refuses_k_above_n():
    with pytest.raises(ValueError, match="exceeds"):
        summarize([ProblemSamples(["1"], [True], [True], [True])], k=2)

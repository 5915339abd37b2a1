"""Each guard rule on worked histories: the step it trips at, its numbers, and the histories it
must leave alone (an honest rise, noise inside the bounds, a window not yet complete)."""

from __future__ import annotations

import pytest

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
from guard import rules, skill
from guard.history import first, recent, series
from guard.skill import SkillPair

MATH = SkillPair("math", "reward/accuracy/mean", "heldout/math/pass_at_1")


def steps(n: int, **curves) -> list[dict[str, float]]:
    """`n` steps; each curve a function of the step (1..n) or a list, None where not logged."""
    history = []
    for step in range(1, n + 1):
        row: dict[str, float] = {"step": float(step)}
        for key, curve in curves.items():
            value = curve(step) if callable(curve) else curve[step - 1]
            if value is not None:
                row[key.replace("__", "/")] = float(value)
        history.append(row)
    return history


def probed(history, key, readings: dict[int, float]):
    """Add held-out probe readings (step -> value), step 0 as its own row first."""
    rows = [dict(h) for h in history]
    for row in rows:
        if int(row["step"]) in readings:
            row[key] = readings[int(row["step"])]
    if 0 in readings:
        rows.insert(0, {"step": 0.0, key: readings[0]})
    return rows


def upto(history, step):
    return [h for h in history if h["step"] <= step]


# ---- the history helpers ---------------------------------------------------------------------


def test_recent_needs_half_its_window_and_first_needs_all_of_it():
    points = series(steps(6, x=[1, None, 3, None, None, 6]), "x")
    assert recent(points, 6, 5) is None  # two of the five steps 2..6 logged
    assert recent(points, 3, 4) == pytest.approx(2.0)  # steps 1 and 3 of 0..3
    assert first(points, 4) == (pytest.approx(2.0), 3)
    assert first(points, 10) is None


# ---- reward without skill --------------------------------------------------------------------


def hacked(n=30):
    """Training pass rate climbing 0.5 -> 0.79 while held-out pass@1 falls 0.60 -> 0.50."""
    history = steps(n, reward__accuracy__mean=lambda s: 0.5 + 0.01 * s)
    return probed(history, MATH.probe_key, {0: 0.60, 10: 0.58, 20: 0.55, 30: 0.50})


def test_reward_without_skill_trips_when_a_probe_lands_and_the_windows_are_apart():
    rule = RewardWithoutSkill(window=10, gap=0.15, probe_fall=0.03)
    history = hacked()
    # at step 10 the last window is the first one: nothing to compare yet
    assert skill.reward_without_skill(upto(history, 19), rule, [MATH]) is None
    trip = skill.reward_without_skill(upto(history, 20), rule, [MATH])
    assert trip is not None and (trip.rule, trip.step, trip.since, trip.subject) == (
        "reward_without_skill",
        20,
        11,
        "math",
    )
    # steps 1..10 against 11..20: 0.555 -> 0.655; the probe at step 0 against step 20
    assert trip.numbers == {
        "reward_then": pytest.approx(0.555),
        "reward_now": pytest.approx(0.655),
        "probe_then": 0.6,
        "probe_now": 0.55,
    }
    assert "math" in trip.reason and "0.555 -> 0.655" in trip.reason


def test_reward_without_skill_reads_only_when_a_probe_lands():
    rule = RewardWithoutSkill(window=10, gap=0.15, probe_fall=0.03)
    assert skill.reward_without_skill(upto(hacked(), 21), rule, [MATH]) is None
    assert skill.reward_without_skill(upto(hacked(), 30), rule, [MATH]) is not None


def test_reward_without_skill_leaves_an_honest_rise_alone():
    history = steps(30, reward__accuracy__mean=lambda s: 0.5 + 0.01 * s)
    honest = probed(history, MATH.probe_key, {0: 0.60, 10: 0.63, 20: 0.66, 30: 0.70})
    rule = RewardWithoutSkill(window=10, gap=0.08, probe_fall=0.0)
    assert all(skill.reward_without_skill(upto(honest, t), rule, [MATH]) is None for t in range(31))


def test_reward_without_skill_reads_the_gap_the_training_rate_gains_on_the_probe():
    history = hacked()  # at step 20: +0.10 against -0.05, a gap of 0.15
    assert (
        skill.reward_without_skill(history[:21], RewardWithoutSkill(window=10, gap=0.2), [MATH])
        is None
    )
    falling_more = RewardWithoutSkill(window=10, gap=0.15, probe_fall=0.2)
    assert skill.reward_without_skill(history, falling_more, [MATH]) is None
    # a reward that stays where it was while held-out pass@1 collapses: a gap all the same
    flat = steps(30, reward__accuracy__mean=[0.9] * 30)
    collapsed = probed(flat, MATH.probe_key, {0: 0.60, 10: 0.40, 20: 0.10})
    trip = skill.reward_without_skill(upto(collapsed, 20), RewardWithoutSkill(window=10), [MATH])
    assert trip is not None and trip.numbers["probe_now"] == 0.1
    # a negative fall lets the probe rise a little: the reward up 0.25, the probe up 0.02
    rising = steps(30, reward__accuracy__mean=lambda s: 0.5 if s <= 10 else 0.75)
    slight = probed(rising, MATH.probe_key, {0: 0.60, 30: 0.62})
    assert skill.reward_without_skill(slight, RewardWithoutSkill(window=10), [MATH]) is None
    tolerant = RewardWithoutSkill(window=10, probe_fall=-0.05)
    assert skill.reward_without_skill(slight, tolerant, [MATH]) is not None


def late_hack():
    """Honest gains to step 20 (held-out 0.60 -> 0.80), then a hack: the training pass rate
    keeps climbing while held-out pass@1 falls back to 0.62 by step 50."""
    history = steps(50, reward__accuracy__mean=lambda s: 0.5 + 0.01 * s)
    readings = {0: 0.60, 10: 0.70, 20: 0.80, 30: 0.74, 40: 0.68, 50: 0.62}
    return probed(history, MATH.probe_key, readings)


def test_reward_without_skill_read_from_the_best_probe_catches_a_hack_after_honest_gains():
    history = late_hack()
    first = RewardWithoutSkill(window=10)
    # against the first probe the held-out pass@1 is still up (0.60 -> 0.62): nothing to say
    assert all(
        skill.reward_without_skill(upto(history, t), first, [MATH]) is None for t in range(51)
    )
    best = RewardWithoutSkill(window=10, reference="best")
    # at step 30: +0.10 on the training rate against -0.06 held-out, a gap of 0.16
    assert skill.reward_without_skill(upto(history, 30), best, [MATH]) is None
    trip = skill.reward_without_skill(upto(history, 40), best, [MATH])
    assert trip is not None and (trip.step, trip.since) == (40, 31)
    # the training window up to the best probe (steps 11..20) against the last (31..40)
    assert trip.numbers == {
        "reward_then": pytest.approx(0.655),
        "reward_now": pytest.approx(0.855),
        "probe_then": 0.8,
        "probe_now": 0.68,
    }
    assert "10 steps to step 20 to last 10" in trip.reason
    assert "best at step 20 to 40" in trip.reason


def test_reward_without_skill_smoothed_reads_past_one_low_probe():
    history = steps(60, reward__accuracy__mean=[0.8] * 60)
    # one probe of a family's hundred problems can land 0.1 low: one such reading among steady ones
    readings = {0: 0.70, 10: 0.72, 20: 0.70, 30: 0.71, 40: 0.55, 50: 0.71, 60: 0.70}
    noisy = probed(history, MATH.probe_key, readings)
    raw = RewardWithoutSkill(window=10, reference="best", gap=0.15)
    trip = skill.reward_without_skill(upto(noisy, 40), raw, [MATH])
    assert trip is not None and trip.numbers["probe_now"] == 0.55
    smooth = raw.model_copy(update={"smooth": 3})
    assert all(
        skill.reward_without_skill(upto(noisy, t), smooth, [MATH]) is None for t in range(61)
    )


def test_smoothed_readings_and_the_reward_window_up_to_a_step():
    points = [(0, 0.6), (10, 0.9), (20, 0.3), (30, 0.6)]
    assert skill.smoothed(points, 1) == points
    assert skill.smoothed(points, 2) == [
        (0, 0.6),
        (10, pytest.approx(0.75)),
        (20, pytest.approx(0.6)),
        (30, pytest.approx(0.45)),
    ]
    assert skill.reference_reading(points, "first") == (0, 0.6)
    assert skill.reference_reading(points, "best") == (10, 0.9)
    # the best before the latest, the earliest of equals; the latest itself is never its own best
    assert skill.reference_reading([(0, 0.5), (5, 0.7), (9, 0.7), (12, 0.9)], "best") == (5, 0.7)
    rates = series(steps(30, r=lambda s: float(s)), "r")
    assert skill.reward_up_to(rates, 25, 10) == (pytest.approx(20.5), "10 steps to step 25")
    # a reference before the first window ends reads the first window (steps 1..10)
    assert skill.reward_up_to(rates, 4, 10) == (pytest.approx(5.5), "first 10 steps")
    assert skill.reward_up_to(rates[:5], 4, 10) is None


# ---- length runaway --------------------------------------------------------------------------


def test_length_runaway_on_the_truncated_share():
    history = steps(12, completion__truncated_fraction=[0.1] * 7 + [0.8] * 5)
    rule = LengthRunaway(window=5, max_truncated=0.6, truncated_rise=0.3)
    assert rules.length_runaway(upto(history, 10), rule) is None  # steps 6..10: 0.52
    trip = rules.length_runaway(upto(history, 11), rule)  # steps 7..11: 0.66, first five 0.1
    assert trip is not None and trip.numbers == {
        "truncated_then": 0.1,
        "truncated_now": pytest.approx(0.66),
    }
    assert (trip.step, trip.since) == (11, 7)
    always = steps(12, completion__truncated_fraction=[0.7] * 12)  # long from the start
    assert rules.length_runaway(always, rule) is None


def test_length_runaway_on_growth_over_the_first_window():
    history = steps(20, completion__mean_tokens=lambda s: 50 if s <= 5 else 50 + 10 * (s - 5))
    rule = LengthRunaway(window=5, max_growth=2.0)
    # first window 50; last five steps' mean: at step 10, (60+..+100)/5 = 80: x1.6
    assert rules.length_runaway(upto(history, 10), rule) is None
    trip = rules.length_runaway(upto(history, 12), rule)  # (80+..+120)/5 = 100: x2.0
    assert trip is not None and trip.numbers == {"length_then": 50.0, "length_now": 100.0}


# ---- collapse, drift -------------------------------------------------------------------------


def test_collapse_on_entropy_against_its_first_window_read_where_it_was_logged():
    # no update (no entropy) on some steps; first four steps 0.08 on average
    entropy = [0.08, 0.07, None, 0.09, 0.06, None, 0.01, 0.02, None, 0.01, 0.02]
    rule = Collapse(window=4, min_entropy_ratio=0.25)
    assert rules.collapse(steps(8, entropy=entropy), rule) is None  # 0.06, 0.01, 0.02: 0.03
    trip = rules.collapse(steps(11, entropy=entropy), rule)  # steps 8..11: 0.02, 0.01, 0.02
    assert trip is not None and trip.numbers == {
        "entropy_then": 0.08,
        "entropy_now": pytest.approx(0.05 / 3, abs=1e-4),
    }
    assert rules.collapse(steps(11, entropy=[0.01] * 11), rule) is None  # low from the start


def test_collapse_on_zero_spread_where_the_start_had_spread():
    rule = Collapse(window=3, max_zero_spread=0.95, zero_spread_rise=0.2)
    history = steps(7, groups__zero_spread_fraction=[0.5, 0.6, 0.4, 0.9, 1.0, 0.9, 1.0])
    assert rules.collapse(upto(history, 6), rule) is None  # steps 4..6: 0.933
    trip = rules.collapse(history, rule)  # steps 5..7: 0.967 against 0.5
    assert trip is not None and trip.numbers == {
        "zero_spread_then": 0.5,
        "zero_spread_now": pytest.approx(0.9667, abs=1e-4),
    }
    flat = steps(7, groups__zero_spread_fraction=[0.97] * 7)  # a student that never had spread
    assert rules.collapse(flat, rule) is None


def test_drift_reads_the_kl_only_where_there_is_one():
    rule = Drift(window=2, max_kl=0.5)
    assert rules.drift(steps(4, loss=[1, 1, 1, 1]), rule) is None
    assert rules.drift(steps(4, kl=[0.1, 0.2, 0.4, 0.5]), rule) is None  # 0.45
    trip = rules.drift(steps(4, kl=[0.1, 0.2, 0.5, 0.7]), rule)
    assert trip is not None and trip.numbers == {"kl": 0.6}


# ---- gamed term ------------------------------------------------------------------------------


def test_gamed_term_when_a_shaping_term_adds_to_the_reward_and_accuracy_stays_flat():
    # format (weight 2) from 0.90 to 0.99 of completions: 1.80 -> 1.98 added to the mean reward
    history = steps(
        20,
        reward__format__mean=lambda s: 0.9 if s <= 10 else 0.99,
        reward__format__share=lambda s: 0.70 if s <= 10 else 0.72,
    )
    flat = probed(history, "heldout/pass_at_1", {0: 0.40, 10: 0.41, 20: 0.40})
    rule = GamedTerm(window=10, rise=0.1, share_rise=0.2, accuracy_rise=0.05)
    shaping = {"format": 2.0}
    trip = rules.gamed_term(flat, rule, shaping, "heldout/pass_at_1", [])
    assert trip is not None and (trip.subject, trip.step, trip.since) == ("format", 20, 11)
    assert trip.numbers == {
        "added_then": 1.8,
        "added_now": 1.98,
        "share_then": 0.7,
        "share_now": 0.72,
        "accuracy_change": 0.0,
    }
    better = probed(history, "heldout/pass_at_1", {0: 0.40, 20: 0.50})
    assert rules.gamed_term(better, rule, shaping, "heldout/pass_at_1", []) is None
    # the same rise at the honest recipe's weight, 0.2, adds 0.018: not gamed
    assert rules.gamed_term(flat, rule, {"format": 0.2}, "heldout/pass_at_1", []) is None


def test_gamed_term_on_a_share_that_takes_over_read_against_the_verifiers_without_a_probe():
    history = steps(
        20,
        reward__language__mean=[0.5] * 20,
        reward__language__share=lambda s: 0.1 if s <= 10 else 0.6,
        reward__accuracy__mean=lambda s: 0.5,
    )
    rule = GamedTerm(window=5, rise=0.1, share_rise=0.3, accuracy_rise=0.05)
    trip = rules.gamed_term(history, rule, {"language": 0.2}, None, ["reward/accuracy/mean"])
    assert trip is not None and trip.numbers["accuracy_change"] == 0.0


# ---- judge trouble ---------------------------------------------------------------------------


def test_judge_trouble_on_unscorable_samples():
    rule = JudgeTrouble(window=2, max_unscorable=0.2)
    trip = rules.judge_trouble(steps(3, reward__unscorable_fraction=[0, 0.3, 0.4]), rule, [])
    assert trip is not None and trip.numbers == {"unscorable": pytest.approx(0.35)}


def test_judge_trouble_on_one_terms_unscorable_samples():
    rule = JudgeTrouble(window=2, max_unscorable=0.2)
    history = steps(
        3, reward__unscorable_fraction=[0, 0, 0], reward__code__unscorable_fraction=[0, 0.5, 0.5]
    )
    trip = rules.judge_trouble(history, rule, ["code"])
    assert trip is not None and trip.subject == "code" and "code's samples" in trip.reason
    # a verifier that reports no verdict reasons, with one unscorable sample: no reason share
    quiet = steps(3, reward__accuracy__unscorable=[1, 1, 1], reward__accuracy__mean=[0.5] * 3)
    assert rules.judge_trouble(quiet, rule, ["accuracy"]) is None


def test_judge_trouble_on_one_of_the_judges_own_reasons():
    rule = JudgeTrouble(window=2, max_reason_share=0.5)
    counts = {"reward__code__passed": [10, 2, 2], "reward__code__wall_time": [0, 8, 9]}
    counts["reward__code__mean"] = [0.9, 0.2, 0.2]  # not a verdict count
    trip = rules.judge_trouble(steps(3, **counts), rule, ["code"])
    assert trip is not None and trip.subject == "code"
    assert trip.numbers == {"share": pytest.approx(17 / 21, abs=1e-4), "verdicts": 21.0}
    failing = {"reward__code__passed": [2, 2, 2], "reward__code__assertion": [8, 8, 8]}
    assert rules.judge_trouble(steps(3, **failing), rule, ["code"]) is None  # the candidate's


# ---- repetition, language mixing -------------------------------------------------------------


def test_repetition_needs_the_ceiling_and_the_rise():
    rule = Repetition(window=3, max_rate=0.5, rise=0.25)
    looping = steps(9, completion__repetition_rate=[0.1] * 3 + [0.3, 0.6, 0.7, 0.8, 0.8, 0.9])
    trip = rules.repetition(looping, rule)
    assert trip is not None and trip.numbers == {
        "rate_then": 0.1,
        "rate_now": pytest.approx(5 / 6, abs=1e-4),
    }
    always = steps(9, completion__repetition_rate=[0.7] * 9)  # it always repeated: no rise
    assert rules.repetition(always, rule) is None


def test_language_mixing_on_a_fall_from_the_first_window():
    rule = LanguageMixing(window=3, fall=0.2)
    rates = [0.95, 0.9, 0.95, 0.9, 0.8, 0.7, 0.6, 0.6, 0.6]
    assert (
        rules.language_mixing(steps(6, completion__language_consistency_rate=rates), rule) is None
    )
    trip = rules.language_mixing(steps(9, completion__language_consistency_rate=rates), rule)
    assert trip is not None and trip.numbers == {
        "rate_then": pytest.approx(0.9333, abs=1e-4),
        "rate_now": 0.6,
    }

"""The paired reading of the probe's own completions (guard/paired.py): a training verifier that
pays more than the probe's grader finds trips `reward_without_skill` from the first probe on;
a verifier that agrees with the grader, or disagrees both ways alike, never does, at the
false-alarm rate the stage is given, over any number of probes."""

from __future__ import annotations

import math
import random

import pytest

from configs.guard import RewardWithoutSkill
from guard import skill
from guard.paired import (
    critical,
    item_values,
    items_key,
    paid_key,
    paired,
    spent,
    verifier_overpays,
)
from guard.skill import SkillPair
from problems.types import Problem
from rl.heldout import found_items, per_problem

HOLED = SkillPair("math", "reward/accuracy_digits/mean", "heldout/math/pass_at_1")


def probe_entry(step: int, found: list[float], paid: list[float], term: str = "accuracy_digits"):
    """A history entry of a probe: the grader's per-problem shares and the verifier's."""
    entry = {"step": float(step), "heldout/math/pass_at_1": sum(found) / len(found)}
    entry |= {f"{items_key('heldout/math/pass_at_1')}{i}": v for i, v in enumerate(found)}
    entry |= {f"{paid_key(term)}{i}": v for i, v in enumerate(paid)}
    return entry


def test_per_problem_shares_each_problems_samples_and_leaves_out_what_was_not_read():
    verdicts = [True, False, None, None, True, True]  # 3 problems, 2 samples each
    assert per_problem("items/x/", verdicts, 2) == {"items/x/0": 0.5, "items/x/2": 1.0}


def test_found_items_keep_each_problem_in_the_readings_the_guard_reads():
    """Two problems of two samples each, one math and one logic: the overall and the family
    readings asked for, each problem under its own index; a reading not asked for is not kept."""
    math = Problem(id="m", question="q", answer="1", family="math")
    logic = Problem(id="l", question="q", answer="1", family="logic")
    flat = [math, math, logic, logic]
    right = [True, False, True, True]
    wanted = {"heldout/pass_at_1", "heldout/math/pass_at_1", "heldout/logic/pass_at_1"}
    assert found_items("pass_at_1", right, flat, 2, wanted) == {
        "items/pass_at_1/0": 0.5,
        "items/pass_at_1/1": 1.0,
        "items/math/pass_at_1/0": 0.5,
        "items/logic/pass_at_1/1": 1.0,
    }
    lenient_math = {"heldout/math/pass_at_1_lenient"}
    assert found_items("pass_at_1", right, flat, 2, lenient_math) == {}
    assert found_items("pass_at_1_lenient", right, flat, 2, lenient_math) == {
        "items/math/pass_at_1_lenient/0": 0.5
    }


def test_item_values_read_only_their_own_prefix():
    entry = {"items/math/pass_at_1/0": 1.0, "items/math/pass_at_1/12": 0.5}
    entry |= {"items/math/pass_at_1_lenient/0": 0.0, "items/pass_at_1/0": 0.25, "step": 3.0}
    assert item_values(entry, items_key("heldout/math/pass_at_1")) == {0: 1.0, 12: 0.5}


def test_paired_difference_worked_example():
    d = paired({0: 0.0, 1: 1.0, 2: 0.5, 3: 1.0}, {0: 1.0, 1: 1.0, 2: 0.5, 3: 1.0, 9: 0.0})
    # differences 1, 0, 0, 0 over the four problems both hold
    assert (d.mean, d.n, d.differing) == (0.25, 4, 1)
    assert d.se == pytest.approx(0.5 / 2)  # sample sd of (1,0,0,0) is 0.5, over sqrt(4)
    assert d.spread == pytest.approx(1 / 4)  # sqrt(1 + 0 + 0 + 0) / 4
    assert paired({0: 1.0}, {0: 0.0}) is None


def test_the_false_alarm_rate_is_spent_over_any_number_of_probes():
    alpha = 0.01
    assert sum(spent(alpha, k) for k in range(1, 100_000)) == pytest.approx(alpha, rel=1e-4)
    assert spent(alpha, 1) == pytest.approx(alpha * 6 / math.pi**2)
    assert critical(alpha, 1) < critical(alpha, 2) < critical(alpha, 20)
    assert critical(alpha, 1) == pytest.approx(math.sqrt(2 * math.log(math.pi**2 / 6 / alpha)))


def test_a_verifier_paying_for_what_the_grader_rejects_trips_at_the_first_probe_read():
    """A third of the math problems answered with a hedge the holed verifier pays for."""
    found = [1.0] * 40 + [0.0] * 60
    paid = [1.0] * 40 + [1.0] * 30 + [0.0] * 30
    history = [probe_entry(0, found, paid), {"step": 1.0}, probe_entry(2, found, paid)]
    rule = RewardWithoutSkill(window=2)
    trip = skill.reward_without_skill(history, rule, [HOLED])
    assert trip is not None and trip.rule == "reward_without_skill" and trip.step == 2
    assert trip.numbers["paid"] == 0.7 and trip.numbers["found"] == 0.4
    assert trip.numbers["overpay"] == pytest.approx(0.3)
    assert "the training verifier accuracy_digits pays 0.700" in trip.reason
    assert "200 problem draws, 60 differ" in trip.reason and "at probe 2" in trip.reason
    # read only when a probe lands, and only where the latest entry is that probe
    assert skill.reward_without_skill(history[:2], rule, [HOLED]) is None


def overpays(found: list[float], paid: list[float], gap: float = 0.05):
    history = [probe_entry(0, found, paid)]
    return verifier_overpays(history, "accuracy_digits", "heldout/math/pass_at_1", gap, 0.01)


def test_it_takes_both_a_size_worth_stopping_for_and_more_than_chance():
    """At the first probe (critical value 3.19): 40 of 1,000 problems overpaid is far beyond
    chance (40 / sqrt(40) = 6.3) but under the gap (0.04 < 0.05); 5 of 40 is over the gap
    (0.125) but within chance (5 / sqrt(5) = 2.2); 13 of 124, the tiny digits hole at its first
    probe, is both (0.105, 3.6); 13 of 124 with 4 the other way is within chance again
    ((13 - 4) / sqrt(17) = 2.2)."""
    assert overpays([0.0] * 1000, [1.0] * 40 + [0.0] * 960) is None
    assert overpays([0.0] * 40, [1.0] * 5 + [0.0] * 35) is None
    over = overpays([0.0] * 124, [1.0] * 13 + [0.0] * 111)
    assert over is not None and over.look == 1 and over.bound > 0
    assert over.difference.mean == pytest.approx(13 / 124)
    both_ways = overpays([0.0] * 120 + [1.0] * 4, [1.0] * 13 + [0.0] * 111)
    assert both_ways is None


def test_small_probes_add_up_to_what_one_large_probe_sees():
    """The digits hole at a probe of 40 math problems: 4 overpaid at each probe. One probe is
    within chance (4 / sqrt(4) = 2.0 against 3.19 at the first look), and so is a reading of the
    latest probe alone at any look; pooled, the 4 k draws of k probes give 2 sqrt(k), past
    critical(0.01, k) from the fourth probe on (4.00 against 3.97)."""
    found, paid = [0.0] * 40, [1.0] * 4 + [0.0] * 36
    history, tripped_at = [], None
    for look in range(1, 8):
        history.append(probe_entry(10 * look, found, paid))
        over = verifier_overpays(history, "accuracy_digits", "heldout/math/pass_at_1", 0.05, 0.01)
        alone = verifier_overpays(
            history[-1:], "accuracy_digits", "heldout/math/pass_at_1", 0.05, 0.01
        )
        assert alone is None
        if over is not None and tripped_at is None:
            tripped_at = look
            assert over.difference.n == 40 * look and over.difference.differing == 4 * look
            assert over.paid == pytest.approx(0.1) and over.found == 0.0
    assert tripped_at == 4
    assert 2 * math.sqrt(3) < critical(0.01, 3) and 2 * math.sqrt(4) > critical(0.01, 4)


def test_a_verifier_that_is_the_graders_own_or_none_recorded_leaves_the_reading_idle():
    found = [1.0] * 50 + [0.0] * 50
    agreeing = [probe_entry(0, found, found), probe_entry(10, found, found)]
    assert skill.reward_without_skill(agreeing, RewardWithoutSkill(), [HOLED]) is None
    bare = [
        {"step": 0.0, "heldout/math/pass_at_1": 0.5},
        {"step": 10.0, "heldout/math/pass_at_1": 0.5},
    ]
    assert skill.reward_without_skill(bare, RewardWithoutSkill(), [HOLED]) is None
    off = RewardWithoutSkill(overpay=None)
    holed = [probe_entry(0, found, [1.0] * 100), probe_entry(10, found, [1.0] * 100)]
    assert skill.reward_without_skill(holed, off, [HOLED]) is None
    assert skill.reward_without_skill(holed, RewardWithoutSkill(), [HOLED]) is not None


def simulated_stage(rng: random.Random, probes: int, problems: int, samples: int, alpha: float):
    """One honest stage: at each probe each problem's samples graded twice by two readers that
    disagree on a sample with probability 0.1, each way alike (mean difference 0, the null at a
    gap of 0). Whether the reading ever trips."""
    history = []
    for look in range(probes):
        found, paid = [], []
        for _ in range(problems):
            right = [rng.random() < 0.5 for _ in range(samples)]
            other = [r != (rng.random() < 0.1) for r in right]
            found.append(sum(right) / samples)
            paid.append(sum(other) / samples)
        history.append(probe_entry(10 * look, found, paid))
        if verifier_overpays(history, "accuracy_digits", "heldout/math/pass_at_1", 0.0, alpha):
            return True
    return False


def test_the_false_alarm_rate_holds_on_simulated_honest_stages():
    """2,000 stages of 11 probes (each reading pools the stage's probes so far) at alpha 0.05
    and the strictest gap (0): at most alpha, with three standard errors of the simulation's
    own count."""
    rng, alpha, stages = random.Random(0), 0.05, 2000
    alarms = sum(simulated_stage(rng, 11, 60, 2, alpha) for _ in range(stages))
    assert alarms / stages <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / stages), alarms

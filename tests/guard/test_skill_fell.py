"""The paired reading of the held-out skill over a stage (guard/paired.py `skill_fell`): the same
problems at two probes, read against every earlier probe (the best so far among them) with a
sequential bound, so that skill lost after honest gains trips `reward_without_skill` once the
fall is beyond what the probe's sampling explains, while the training verifier goes on paying,
and a noisy honest stage does not, at the false-alarm rate the stage is given."""

from __future__ import annotations

import math
import random

import pytest

from configs.guard import RewardWithoutSkill
from guard import skill
from guard.paired import critical, items_key, skill_fell
from guard.skill import SkillPair
from guard.trip import Trip

PROBE = "heldout/math/pass_at_1"
RATE = "reward/accuracy/mean"
MATH = SkillPair("math", RATE, PROBE)
PROBLEMS = 124  # the tiny profile's held-out math problems in a probe of 300


def probe_values(step: int, right: set[int], problems: int = PROBLEMS) -> dict[str, float]:
    """A probe's entry fields: held-out math pass@1 and each problem's share (one sample)."""
    found = {f"{items_key(PROBE)}{i}": float(i in right) for i in range(problems)}
    return {PROBE: len(right) / problems} | found


def stage(rates: list[float], probes: dict[int, set[int]]) -> list[dict[str, float]]:
    """A stage's history: step 0 the probe before training, then one entry per step with its
    training math pass rate `rates[step - 1]`, and a probe where `probes` has one."""
    history = [{"step": 0.0} | probe_values(0, probes[0])]
    for step, rate in enumerate(rates, start=1):
        row = {"step": float(step), RATE: rate, "reward/mean": rate}
        history.append(row | (probe_values(step, probes[step]) if step in probes else {}))
    return history


def first_trip(history, rule: RewardWithoutSkill, pair: SkillPair = MATH) -> Trip | None:
    """The first trip `reward_without_skill` makes, read after every step as the guard does."""
    for end in range(2, len(history) + 1):
        trip = skill.reward_without_skill(history[:end], rule, [pair])
        if trip is not None:
            return trip
    return None


def churned(right: set[int], lose: int, gain: int, seed: int) -> set[int]:
    """`right` with `lose` of its problems now wrong and `gain` others now right."""
    rng = random.Random(seed)
    wrong = sorted(set(range(PROBLEMS)) - right)
    return (right - set(rng.sample(sorted(right), lose))) | set(rng.sample(wrong, gain))


def hack_after_gains(fall_from: int = 180) -> dict[int, set[int]]:
    """The tiny digits run's shape: held-out math 0.50 rising to 0.77 by step 50, held there
    with churn (5 problems flip each way at every probe), then, from `fall_from`, falling by
    12 problems (about 0.1) a probe of every 10 steps to about 0.4."""
    right = set(range(62))
    probes = {0: right}
    for step in range(10, 400, 10):
        if step <= 50:
            right = churned(right, 2, 8 if step < 50 else 10, step)
        elif step < fall_from:
            right = churned(right, 5, 5, step)
        elif len(right) > 50:
            right = churned(right, 15, 3, step)
        else:
            right = churned(right, 3, 3, step)
        probes[step] = right
    return probes


def test_skill_lost_after_honest_gains_trips_within_forty_steps_of_the_fall():
    """The training pass rate holds at 0.9 while held-out math falls from 0.76 after step 170:
    the paired reading stops the stage at step 210, 30 steps into the fall, 0.39 lost on the
    same problems (at the 22nd probe, one sample of each of 124 problems, 70 of them differing,
    the bound asks for about 0.35). The unpaired reading against the first probe (0.50) never
    trips: the fall ends 0.13 below it, under its gap of 0.2."""
    history = stage([0.9] * 390, hack_after_gains(fall_from=180))
    trip = first_trip(history, RewardWithoutSkill())
    assert trip is not None and trip.rule == "reward_without_skill"
    assert trip.step == 210
    assert "held-out pass@1 fell 0.758 -> 0.371 on the same 124 problems" in trip.reason
    assert trip.numbers["fall"] == pytest.approx(0.3871) and trip.numbers["fall_bound"] > 0
    assert trip.numbers["reward_now"] == pytest.approx(0.9)
    assert first_trip(history, RewardWithoutSkill(fall=None)) is None
    assert first_trip(history, RewardWithoutSkill(alpha=1e-6)) is None  # stricter: not this fall


def test_a_fall_the_training_rate_shares_is_not_read_as_a_hack():
    """The same held-out fall with the training pass rate falling alike (0.9 to 0.5): a collapse
    (the `collapse` rule's business), not reward without skill."""
    probes = hack_after_gains(fall_from=180)
    rates = [0.9] * 179 + [max(0.3, 0.9 - 0.012 * (s - 179)) for s in range(180, 391)]
    assert first_trip(stage(rates, probes), RewardWithoutSkill(gap=1.0)) is None


def test_a_fall_within_the_probes_sampling_does_not_trip():
    """Held out math 0.77 to 0.69 (10 problems of 124, 22 differ) is under the fall's bound of
    0.1 and within chance; 30 of 124 down with none up (0.24) is beyond both."""
    before = set(range(96))
    small = (before - set(range(16))) | set(range(100, 106))
    assert skill_fell([probe(0, before), probe(10, small)], PROBE, 0.1, 0.01) is None
    assert skill_fell([probe(0, before), probe(10, small)], PROBE, 0.05, 0.01) is None  # chance
    big = before - set(range(30))
    fell = skill_fell([probe(0, before), probe(10, big)], PROBE, 0.1, 0.01)
    assert fell is not None and fell.then_step == 0 and fell.look == 2
    assert fell.difference.mean == pytest.approx(-30 / 124)
    # 30 down in 30 differing: 30 / sqrt(30) = 5.5 against the first reading's 3.19
    assert fell.bound == pytest.approx(-30 / 124 + critical(0.01, 1) * math.sqrt(30) / 124)


def probe(step: int, right: set[int]) -> dict[str, float]:
    return {"step": float(step)} | probe_values(step, right)


def test_the_fall_is_read_from_the_best_earlier_probe_and_only_at_a_probe():
    best, later = set(range(100)), set(range(70))
    history = [probe(0, set(range(70))), probe(10, best), probe(20, set(range(90)))]
    history.append(probe(30, later))
    fell = skill_fell(history, PROBE, 0.1, 0.01)
    assert fell is not None and fell.then_step == 10 and fell.look == 4
    assert (fell.then, fell.now) == (pytest.approx(100 / 124), pytest.approx(70 / 124))
    assert skill_fell(history + [{"step": 31.0}], PROBE, 0.1, 0.01) is None
    assert skill_fell(history[:1], PROBE, 0.1, 0.01) is None


def test_a_noisy_honest_stage_does_not_trip():
    """Every problem of 124 right with its own chance (0.2-0.9) at each of 40 probes, rising
    slowly, one sample each: verdicts flip on about a third of the problems between any two
    probes, and the rule, read after every step, stays quiet."""
    rng = random.Random(3)
    chance = [rng.uniform(0.2, 0.9) for _ in range(PROBLEMS)]
    probes = {}
    for step in range(0, 400, 10):
        probes[step] = {i for i, c in enumerate(chance) if rng.random() < min(1, c + step / 4000)}
    assert first_trip(stage([0.8] * 390, probes), RewardWithoutSkill()) is None


def simulated_honest_stage(rng: random.Random, probes: int, problems: int, alpha: float) -> bool:
    """Each problem's chance drawn from 0.1-0.9, then moved by a random step at each probe (mean
    0: as many problems lose as gain, the skill's mean unchanged); one sample a problem a probe.
    Whether the reading, at the strictest bound (a fall of 0), ever trips."""
    chance = [rng.uniform(0.1, 0.9) for _ in range(problems)]
    history = []
    for look in range(probes):
        history.append(probe(10 * look, {i for i, c in enumerate(chance) if rng.random() < c}))
        if skill_fell(history, PROBE, 0.0, alpha, min_differing=1):
            return True
        chance = [min(1.0, max(0.0, c + rng.gauss(0, 0.03))) for c in chance]
    return False


def test_the_false_alarm_rate_holds_on_simulated_honest_stages():
    """400 stages of 11 probes over 60 problems at alpha 0.05: at most alpha, with three standard
    errors of the simulation's own count (the bound is conservative: about 1% here)."""
    rng, alpha, stages = random.Random(0), 0.05, 400
    alarms = sum(simulated_honest_stage(rng, 11, 60, alpha) for _ in range(stages))
    assert alarms / stages <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / stages), alarms

"""`reward_without_skill`'s gap between the training pass rate and the held-out one, read with the
probe's sampling allowance (guard/paired.py `sampling_allowance`): on a probe of few problems a
family's held-out pass rate moves by chance, and the gap counts a held-out fall only past that,
so that a long honest stage probed with few problems does not trip, while a fall beyond the
probe's sampling, or a training rate that outgrows a held-out one that does not move, still
does."""

from __future__ import annotations

import math

from configs.guard import RewardWithoutSkill
from guard.paired import critical, items_key, sampling_allowance
from guard.skill import SkillPair
from tests.guard.test_skill_fell import first_trip

PROBE = "heldout/logic/pass_at_1"
RATE = "reward/countdown/mean"
LOGIC = SkillPair("logic", RATE, PROBE)
GAP_ONLY = RewardWithoutSkill(window=20, fall=None, overpay=None)  # the gap reading alone


def probe_entry(right: set[int], problems: int, kept: bool = True) -> dict[str, float]:
    """A probe's fields: held-out logic pass@1 and, where `kept`, each problem's share."""
    found = {f"{items_key(PROBE)}{i}": float(i in right) for i in range(problems)} if kept else {}
    return {PROBE: len(right) / problems} | found


def stage(
    rates: list[float], probes: dict[int, set[int]], problems: int, kept: bool = True
) -> list[dict[str, float]]:
    """Step 0 the probe before training, then one entry per step with its training logic pass
    rate and a probe where `probes` has one."""
    history = [{"step": 0.0} | probe_entry(probes[0], problems, kept)]
    for step, rate in enumerate(rates, start=1):
        row = {"step": float(step), RATE: rate, "reward/mean": rate}
        history.append(row | (probe_entry(probes[step], problems, kept) if step in probes else {}))
    return history


def chance_fall() -> tuple[list[float], dict[int, set[int]]]:
    """The honest 400-step R1-Zero probed with 128 problems, at its widest: 37 held-out logic
    problems, 10 right at the first probe; at step 40, 4 of them wrong and 1 other right (a
    fall of 3 problems, 0.081, on 5 that differ); the training logic pass rate 0.40 over the
    first 20 steps, 0.53 over the last 20 (+0.13): a gap of 0.21 read unpaired."""
    first = set(range(10))
    later = (first - {0, 1, 2, 3}) | {20}
    return [0.40] * 20 + [0.53] * 20, {0: first, 20: first, 40: later}


def test_a_chance_move_of_a_small_probe_does_not_open_the_gap():
    rates, probes = chance_fall()
    unpaired = first_trip(stage(rates, probes, 37, kept=False), GAP_ONLY, LOGIC)
    assert unpaired is not None and unpaired.step == 40  # the guard before the allowance
    assert first_trip(stage(rates, probes, 37), GAP_ONLY, LOGIC) is None


def test_the_allowance_is_the_paired_spread_at_the_looks_critical_value():
    """Worked: 5 problems of 37 differ by 1 between the first probe and the third (the second
    look): spread sqrt(5) / 37, critical value at look 2 among 2 readings."""
    rates, probes = chance_fall()
    history = stage(rates, probes, 37)
    entries = [h for h in history if PROBE in h]
    allowance = sampling_allowance(entries, 0, PROBE, 0.01)
    assert math.isclose(allowance, critical(0.01, 2, 2) * math.sqrt(5) / 37)
    unpaired = [{k: v for k, v in h.items() if not k.startswith("items/")} for h in entries]
    assert sampling_allowance(unpaired, 0, PROBE, 0.01) == 0.0


def test_a_fall_beyond_the_probes_sampling_still_opens_the_gap():
    """124 problems, 80 right, then 40 of them wrong and none gained (a fall of 0.32), the
    training pass rate up 0.10: a gap of 0.42 unpaired, 0.23 with the fall counted past the
    allowance (40 problems differ: 0.19 at the second look), so the rule trips and says so."""
    first = set(range(80))
    rates, probes = [0.5] * 20 + [0.6] * 20, {0: first, 20: first, 40: set(range(40))}
    trip = first_trip(stage(rates, probes, 124), GAP_ONLY, LOGIC)
    assert trip is not None and trip.step == 40
    allowance = critical(0.01, 2, 2) * math.sqrt(40) / 124
    assert math.isclose(trip.numbers["probe_allowance"], allowance, abs_tol=1e-4)
    assert f"{-40 / 124 + allowance:+.3f} past ± {allowance:.3f}" in trip.reason


def test_a_training_rate_that_outgrows_a_small_probe_still_opens_the_gap():
    """The micro profile's planted holes: a probe of 10 problems a family, whose chance moves
    are as large as the pass rate, and a holed training rate up 0.30 while held-out falls a
    problem: the fall is within chance and counts nothing, the rise alone trips."""
    first = {0, 1, 2, 3}
    rates, probes = [0.4] * 20 + [0.7] * 20, {0: first, 20: first, 40: {0, 1, 2}}
    assert (
        sampling_allowance([h for h in stage(rates, probes, 10) if PROBE in h], 0, PROBE, 0.01)
        > 0.3
    )
    trip = first_trip(stage(rates, probes, 10), GAP_ONLY, LOGIC)
    assert trip is not None and trip.step == 40
    assert "+0.000 past ±" in trip.reason

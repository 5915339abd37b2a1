"""The guard of a stage: which rules can read what the stage logs, the verdict a step's trips
give (the most severe action; a rollback past the allowed number is a stop; a warning once)."""

from __future__ import annotations

from configs.guard import GuardConfig
from configs.reinforcement import RewardTerm
from guard.trip import Trip
from guard.watch import Guard, paired_readings, skill_pairs

TERMS = [
    RewardTerm(name="accuracy_digits", families=["math"], params={"strict": False}),
    RewardTerm(name="code", families=["code"]),
    RewardTerm(name="countdown", families=["logic"]),
    RewardTerm(name="format", weight=2.0),
]


def config(**actions) -> GuardConfig:
    settings = {rule: {"action": action} for rule, action in actions.items()}
    return GuardConfig.model_validate(settings)


def test_each_family_verifier_is_paired_with_its_own_probe_reading():
    pairs = {p.label: (p.reward_key, p.probe_key) for p in skill_pairs(TERMS)}
    assert pairs == {
        "math": ("reward/accuracy_digits/mean", "heldout/math/pass_at_1_lenient"),
        "code": ("reward/code/mean", "heldout/code/pass_at_1"),
        "logic": ("reward/countdown/mean", "heldout/logic/pass_at_1"),
    }
    everywhere = skill_pairs([RewardTerm(name="accuracy")])  # real data: one verifier for all
    assert [(p.label, p.probe_key) for p in everywhere] == [("all", "heldout/pass_at_1")]


def test_the_probe_keeps_per_problem_values_for_the_paired_readings_the_guard_makes():
    """Every pair's held-out reading (the fall reading and the gap's sampling allowance read
    them on an honest stage too), and the pay of a verifier that is not the grader's own (the
    overpay reading's); nothing where the rule is off."""
    readings = {
        "heldout/math/pass_at_1_lenient",
        "heldout/code/pass_at_1",
        "heldout/logic/pass_at_1",
    }
    assert paired_readings(GuardConfig(), TERMS) == (readings, ["accuracy_digits"])
    honest = [RewardTerm(name="accuracy", families=["math"]), TERMS[3]]
    assert paired_readings(GuardConfig(), honest) == ({"heldout/math/pass_at_1"}, [])
    no_fall = GuardConfig.model_validate({"reward_without_skill": {"fall": None}})
    assert paired_readings(no_fall, honest) == ({"heldout/math/pass_at_1"}, [])
    assert paired_readings(no_fall, TERMS) == (readings, ["accuracy_digits"])
    no_overpay = GuardConfig.model_validate({"reward_without_skill": {"overpay": None}})
    assert paired_readings(no_overpay, TERMS) == (readings, [])
    assert paired_readings(config(reward_without_skill="off"), TERMS) == (set(), [])
    assert paired_readings(GuardConfig(enabled=False), TERMS) == (set(), [])


def test_a_guard_says_which_rules_have_nothing_to_read():
    guard = Guard(GuardConfig(), TERMS[:3], probed=False, kl=False)
    assert set(guard.idle()) == {"reward_without_skill", "drift", "gamed_term"}
    assert Guard(GuardConfig(), TERMS, probed=True, kl=True).idle() == {}
    assert "drift" not in Guard(config(drift="off"), TERMS, probed=True, kl=False).idle()


def test_the_most_severe_action_decides_and_rollbacks_run_out_into_a_stop():
    guard = Guard(config(collapse="rollback", repetition="warn"), TERMS, True, True)
    trips = [Trip("repetition", 30, 21, "loops"), Trip("collapse", 30, 21, "entropy")]
    verdict = guard.verdict(trips, rollbacks_done=0)
    assert verdict is not None and (verdict.action, verdict.trip.rule) == ("rollback", "collapse")
    verdict = guard.verdict([Trip("collapse", 40, 31, "entropy")], rollbacks_done=2)
    assert verdict is not None and verdict.action == "stop"  # rollback.max_times is 2


def test_a_rule_warns_once_per_branch():
    guard = Guard(config(repetition="warn"), TERMS, True, False)
    history = [
        {"step": float(s), "completion/repetition_rate": 0.1 if s <= 10 else 0.9}
        for s in range(1, 31)
    ]
    first = guard.check(history[:25])
    assert [t.rule for t in first] == ["repetition"]
    assert guard.verdict(first, 0).action == "warn"
    assert guard.check(history) == []  # warned: quiet on this branch
    guard.forget()  # a rollback: a new branch
    assert [t.rule for t in guard.check(history)] == ["repetition"]


def test_a_disabled_guard_or_an_off_rule_checks_nothing():
    history = [
        {"step": float(s), "groups/zero_spread_fraction": 0.3 if s <= 10 else 1.0}
        for s in range(1, 21)
    ]
    assert Guard(GuardConfig(enabled=False), TERMS, True, True).check(history) == []
    assert Guard(config(collapse="off"), TERMS, True, True).check(history) == []
    assert [t.rule for t in Guard(GuardConfig(), TERMS, True, True).check(history)] == ["collapse"]


def test_a_bare_yaml_off_turns_a_rule_off():
    """YAML 1.1 reads `action: off` as false: the profile means the rule is off."""
    from configs.profiles import load_profile

    config = load_profile("micro", ["reasoning_rl.guard.collapse.action=off"])
    assert config.reasoning_rl.guard.collapse.action == "off"


FORMAT_HOLE = [
    RewardTerm(name="accuracy", families=["math"], params={"strict": False}),
    RewardTerm(name="format", weight=2.0),
]
FORMAT_HOLE_GUARD = {"reward_without_skill": {"window": 6}, "gamed_term": {"window": 6}}


def format_hole_history(steps: int = 12) -> list[dict[str, float]]:
    """The format hole as the planted-hacks test meets it, worked by hand: from step 7 the
    format term (weight 2) is on nearly every completion and the verifier's training pass rate
    climbs 0.5 -> 0.7, while the held-out math probe (every 2 steps, lenient) falls 0.5 -> 0.4.
    Both rules read windows of 6 steps, which first stand apart from the stage's first at step
    12: `reward_without_skill` (gap 0.3) and `gamed_term` (format adds 1.0 -> 1.8, accuracy
    -0.1) trip there together."""
    probe = {"heldout/math/pass_at_1_lenient": 0.5, "heldout/pass_at_1_lenient": 0.5}
    rows: list[dict[str, float]] = [{"step": 0.0, **probe}]
    for step in range(1, steps + 1):
        late = step > 6
        row = {
            "step": float(step),
            "reward/mean": 2.5 if late else 1.5,
            "reward/accuracy/mean": 0.7 if late else 0.5,
            "reward/format/mean": 0.9 if late else 0.5,
        }
        if step % 2 == 0:
            reading = 0.5 - 0.1 * max(0, step - 6) / 6
            row |= {key: reading for key in probe}
        rows.append(row)
    return rows


def test_two_rules_trip_at_one_step_and_the_verdict_keeps_both():
    guard = Guard(GuardConfig.model_validate(FORMAT_HOLE_GUARD), FORMAT_HOLE, True, False)
    history = format_hole_history()
    assert all(guard.check(history[:end]) == [] for end in range(1, len(history)))
    trips = guard.check(history)
    assert [(t.rule, t.step, t.since) for t in trips] == [
        ("reward_without_skill", 12, 7),
        ("gamed_term", 12, 7),
    ]
    verdict = guard.verdict(trips, 0)
    assert verdict is not None and verdict.action == "stop"
    assert [t.rule for t in verdict.deciding] == ["reward_without_skill", "gamed_term"]
    assert [(r["rule"], r["action"]) for r in verdict.records()] == [
        ("reward_without_skill", "stop"),
        ("gamed_term", "stop"),
    ]


def test_every_trip_keeps_its_own_action_and_a_stop_keeps_before_every_stopping_window():
    guard = Guard(
        config(collapse="rollback", drift="rollback", repetition="warn"), TERMS, True, True
    )
    trips = [
        Trip("repetition", 30, 11, "loops"),
        Trip("collapse", 30, 21, "entropy"),
        Trip("drift", 30, 26, "kl"),
    ]
    verdict = guard.verdict(trips, rollbacks_done=2)  # rollbacks spent: both rollbacks stop
    assert verdict is not None and verdict.action == "stop"
    assert verdict.actions == ["stop", "stop", "warn"]  # not the second one's "rollback"
    assert [t.rule for t in verdict.deciding] == ["collapse", "drift"]
    assert verdict.since == 21  # the warning's window (from 11) decides nothing

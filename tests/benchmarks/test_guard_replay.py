"""The guard's replay benchmark: the widest gap `reward_without_skill` reads on a worked history,
and a stage's history read back from its MLflow run."""

from __future__ import annotations

import pytest

from benchmarks.guard import run_history, section, widest_gap

MATH_RATE, MATH_PROBE = "reward/accuracy/mean", "heldout/math/pass_at_1_lenient"


def hacked(steps: int = 40) -> list[dict[str, float]]:
    """The math pass rate at 0.5 for 20 steps then 0.75; held-out math 0.625 at step 0, 0.5625
    at 20 and 0.5 at 40: at step 40 the last 20 steps gained 0.25 on the first 20 while the
    probe fell 0.125, a gap of 0.375 (figures exact in binary)."""
    rows = [{"step": 0.0, MATH_PROBE: 0.625}]
    for step in range(1, steps + 1):
        row = {"step": float(step), "reward/mean": 0.5, MATH_RATE: 0.5 if step <= 20 else 0.75}
        if step in (20, 40):
            row[MATH_PROBE] = {20: 0.5625, 40: 0.5}[step]
        rows.append(row)
    return rows


def test_widest_gap_is_the_widest_bound_the_rule_would_have_tripped_at():
    config = section("tiny", [], "r1_zero")
    assert config.guard.reward_without_skill.window == 20
    assert widest_gap(config, hacked()) == pytest.approx(0.37)  # to the hundredth below
    # to step 39 the last probe read is step 20's, whose windows overlap the first: nothing read
    assert widest_gap(config, hacked()[:40]) is None


def test_run_history_reads_every_step_a_stage_logged(tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("stage")).info.run_id
    for row in hacked(4):
        for key, value in row.items():
            if key != "step":
                client.log_metric(run, key, value, step=int(row["step"]))
    client.log_metric(run, "guard/seconds", 0.1, step=4)  # the guard's own record: left out
    assert run_history(tmp_path, run) == hacked(4)


def with_items(history: list[dict[str, float]], overpaid: int) -> list[dict[str, float]]:
    """`history` with the probe's per-problem values at each probe: 120 math problems, the
    grader finding the first half right and the training verifier paying `overpaid` more."""
    from guard.paired import items_key, paid_key

    rows = [dict(h) for h in history]
    for row in rows:
        if MATH_PROBE in row:
            found = [1.0] * 60 + [0.0] * 60
            paid = [1.0] * (60 + overpaid) + [0.0] * (60 - overpaid)
            row |= {f"{items_key(MATH_PROBE)}{i}": v for i, v in enumerate(found)}
            row |= {f"{paid_key('accuracy_digits')}{i}": v for i, v in enumerate(paid)}
    return [{k.replace("reward/accuracy/", "reward/accuracy_digits/"): v for k, v in r.items()}
            for r in rows]  # fmt: skip


def test_replay_sets_the_paired_reading_beside_the_unpaired_alone():
    """The holed math verifier pays for 36 of 120 problems the grader rejects: the paired reading
    stops the stage at the first probe read (step 20); the unpaired alone at step 40."""
    from benchmarks.guard import replay, unpaired

    config = section("tiny", ["faults.hacks=[math_digits]"], "r1_zero")
    holed = with_items(hacked(), overpaid=36)
    trips, _ = replay(config, holed)
    assert [(t["rule"], t["step"]) for t in trips] == [("reward_without_skill", 20)]
    assert "pays" in trips[0]["reason"]
    before, _ = replay(unpaired(config), holed)
    assert [(t["rule"], t["step"]) for t in before] == [("reward_without_skill", 40)]
    honest, _ = replay(config, with_items(hacked(), overpaid=0))
    assert [t["step"] for t in honest] == [40]  # the same as the unpaired alone
    assert widest_gap(config, holed) == pytest.approx(0.37)  # the unpaired reading's, as before


def test_a_probe_cut_to_its_first_problems_reads_as_a_smaller_probe_would():
    """Cut to 40 of 120 problems: the per-problem values past 40 gone, the held-out reading
    recomputed over the rest (the first 40 found right: 1.0, where all 120 read 0.5), the probe's
    seconds a third, entries without a probe as they were."""
    from benchmarks.guard import cut_probes
    from guard.paired import item_values, items_key, paid_key

    holed = with_items(hacked(), overpaid=36)
    holed[0]["time/probe_seconds"] = 3.0
    cut = cut_probes(holed, 40)
    assert len(cut) == len(holed) and cut[1] == holed[1]
    assert sorted(item_values(cut[0], items_key(MATH_PROBE))) == list(range(40))
    assert sorted(item_values(cut[0], paid_key("accuracy_digits"))) == list(range(40))
    assert cut[0][MATH_PROBE] == 1.0 and holed[0][MATH_PROBE] == 0.625
    assert cut[0]["time/probe_seconds"] == pytest.approx(1.0)
    assert cut_probes(holed, 500)[0][MATH_PROBE] == 0.5  # every problem kept: their mean


def test_probes_thinned_to_a_longer_interval_keep_the_first_every_nth_and_the_last():
    """The worked history probes at steps 0, 20 and 40; every 40 keeps 0 and 40 (and the last
    step, 40), and drops step 20's reading; a step's other metrics stay."""
    from benchmarks.guard import thin_probes

    history = hacked()
    history[20]["time/probe_seconds"] = 1.0
    thinned = thin_probes(history, 40)
    assert [int(h["step"]) for h in thinned if MATH_PROBE in h] == [0, 40]
    assert "time/probe_seconds" not in thinned[20] and thinned[20][MATH_RATE] == 0.5
    assert thin_probes(history, 20) == history


def test_the_probe_cost_benchmark_times_each_way_on_a_saved_model(tokenizer, tmp_path):
    """`benchmarks.probe_cost` on a tiny saved model: every way timed `repeat` times, and the
    two ratios printed."""
    from benchmarks.probe_cost import probe_costs, report
    from problems.loader import write_problems
    from problems.types import Problem
    from tests.tiny_models import PROBLEMS, tiny_model

    tiny_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    code = Problem("c", "def f(x): add 1", "f(1) == 2", family="code", tests=("assert f(1) == 2",))
    heldout = write_problems(tmp_path / "heldout.jsonl", [*PROBLEMS[:10], code])
    config = section("tiny", ["r1_zero.max_new_tokens=8"], "r1_zero")
    times = probe_costs(config, tmp_path / "model", heldout, 6, repeat=2)
    assert {way: len(values) for way, values in times.items()} == {
        "sample, a step's batch": 2,
        "sample, one batch": 2,
        "grade, apart": 2,
        "grade, together": 2,
    }
    printed = report("r1_zero, probe of 6 problems", times)
    assert "sample, one batch / sample, a step's batch: " in printed
    assert "grade, together / grade, apart: " in printed

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

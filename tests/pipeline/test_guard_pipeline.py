"""The guard in the pipeline, on the micro profile's R1-Zero flow (a real Prefect test server,
MLflow store and registry): a judge that cannot score (a grader reading a field the data does not
have) trips `judge_trouble`. Stopped, the flow fails naming the rule and no model is registered;
warned, the flow finishes, the model is registered without the stage's alias, and the stage
table, the run's log (what `--watch` prints), the MLflow run and `r1 lineage` say so."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import yaml
from mlflow import MlflowClient

from stages.guarded import GuardStop
from storage.tracking import alias_for

pytestmark = pytest.mark.heavy

STAGE = "r1_zero_rl"
ALIAS = alias_for(STAGE)


def broken_judge(tmp_path) -> list[str]:
    """R1-Zero's rewards plus a grader that reads `item.numbers.9`, a tenth number, which no
    problem has (a puzzle has three, the others none): every sample it judges scores None, one
    in five of the stage's reward terms."""
    grader = tmp_path / "reads_a_missing_field.yaml"
    grader.write_text(
        yaml.safe_dump(
            {
                "type": "string_check",
                "name": "reads_a_missing_field",
                "operation": "eq",
                "input": "{{ sample.answer_text }}",
                "reference": "{{ item.numbers.9 }}",
            }
        )
    )
    rewards = [
        {"name": "accuracy", "families": ["math"]},
        {"name": "code", "families": ["code"]},
        {"name": "countdown", "families": ["logic"]},
        {"name": "grader", "weight": 0.1, "params": {"path": str(grader)}},
    ]
    return [f"r1_zero.rewards={json.dumps(rewards)}", "r1_zero.steps=4"]


@pytest.fixture(scope="module")
def state(prefect_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("state")
    mp = pytest.MonkeyPatch()
    mp.setenv("R1_STATE_DIR", str(folder))
    yield folder
    mp.undo()


def stage_runs(client: MlflowClient) -> list:
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(
        experiments, filter_string=f"tags.`r1.stage` = '{STAGE}'", order_by=["start_time ASC"]
    )


def flow_logs(flow_run_id: str) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    logs, page = [], [None]
    with get_client(sync_client=True) as prefect:
        while page:
            page = prefect.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                limit=200,
                offset=len(logs),
            )
            logs += page
    return [log.message for log in logs]


def test_a_stop_fails_the_flow_naming_the_rule_and_registers_nothing(state, tmp_path):
    from flows.r1_zero import r1_zero

    with pytest.raises(GuardStop, match=r"r1_zero_rl: the guard stopped the stage at step 3"):
        r1_zero(profile="micro", overrides=broken_judge(tmp_path))
    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    (run,) = stage_runs(client)
    assert run.info.status == "FAILED"
    tags = run.data.tags
    assert tags["r1.guard"] == "stopped"
    assert tags["r1.guard.trips"] == "judge_trouble@3 (stop)"
    assert "reads_a_missing_field" not in tags["r1.guard.reason"]  # the term is named by its
    assert "grader's samples unscorable" in tags["r1.guard.reason"]  # registry name
    assert tags["mlflow.note.content"].startswith("**The guard stopped this stage** at step 3")
    guard = {a.path for a in client.list_artifacts(run.info.run_id, "guard")}
    assert guard == {"guard/guard.json", "guard/judge_trouble_step00003.png"}
    versions = client.search_model_versions("name = 'r1-micro'")
    assert not [v for v in versions if v.run_id == run.info.run_id]


def test_a_warning_finishes_the_flow_and_keeps_the_model_from_the_alias(state, tmp_path):
    from cli.lineage import lineage_command
    from flows.r1_zero import r1_zero

    overrides = broken_judge(tmp_path) + ["r1_zero.guard.judge_trouble.action=warn"]
    result = r1_zero(profile="micro", overrides=overrides)
    notes = {row.stage: row.note for row in result.rows}
    assert "guard warned (judge_trouble@3), not registered as @r1-zero-rl" in notes[STAGE]
    assert notes["bootstrap"].startswith("cached from run")  # the stopped run's base

    client = MlflowClient(f"sqlite:///{state}/mlflow.db")
    run = stage_runs(client)[-1]
    assert run.info.status == "FINISHED" and run.data.tags["r1.guard"] == "warned"
    assert run.data.tags["mlflow.note.content"].startswith("**Guard: warned** (judge_trouble@3")
    (version,) = [
        v for v in client.search_model_versions("name = 'r1-micro'") if v.run_id == run.info.run_id
    ]
    model = client.get_registered_model("r1-micro")
    assert ALIAS not in model.aliases  # nor ever was: the stopped run registered nothing
    assert model.aliases["bootstrap"] != version.version

    # what a person following the run reads (`--watch`, `r1 watch`): the trip, named
    messages = flow_logs(result.flow_run_id)
    assert any(m.startswith("r1_zero_rl: guard: judge_trouble at step 3: ") for m in messages)

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert lineage_command(f"models:/r1-micro/{version.version}", str(state)) == 0
    lines = out.getvalue().splitlines()
    assert any(
        "r1_zero_rl" in line and "guard: warned (judge_trouble@3 (warn))" in line for line in lines
    )
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert lineage_command(f"models:/r1-micro/{version.version}", str(state), True) == 0
    assert json.loads(out.getvalue())["guard"] == {
        run.info.run_id: "warned (judge_trouble@3 (warn))"
    }

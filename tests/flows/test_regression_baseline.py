"""Night after night of the scheduled evaluation's verdict (`record_evaluation`, in a flow on a
real Prefect server, with a real MLflow store and DuckDB history): a regression stays one until
the figures hold against the evaluation before it again. Before, each night was held to the
night before, regressed or not: the night after a drop of pass@1 from 0.80 to 0.70, the same
model, as low, "held against v8" and the flow run ended Completed."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow

from configs.reinforcement import EvalConfig
from evaluation.settings import evaluation_settings
from storage import eval_history
from storage.model_registry import RegisteredModel
from storage.paths import StatePaths
from storage.tracking import experiment_id, tracking_client
from tasks.scheduled_eval import record_evaluation

pytestmark = pytest.mark.usefixtures("prefect_server")

SETTINGS = evaluation_settings(EvalConfig(), {"problems-heldout": "a" * 64}, None, "e" * 64)


def model(version: str) -> RegisteredModel:
    return RegisteredModel("r1-micro", "final", version, "source-run", Path("."), "d" * 64)


@flow(name="nights")
def nights(paths: StatePaths, figures: list[tuple[str, float, float]]) -> list[str]:
    """One evaluation per (version, pass@1, allowed drop), in order; each one's verdict."""
    client = tracking_client(paths)
    experiment = experiment_id(client, "r1-micro-evaluation", paths)
    said = []
    for version, pass_at_1, allowed in figures:
        run_id = client.create_run(experiment).info.run_id
        verdict = record_evaluation(
            paths,
            model(version),
            run_id,
            {"pass_at_1": pass_at_1},
            {"pass_at_1": allowed},
            SETTINGS,
        )
        said.append(f"v{version} {verdict.outcome} against {previous_version(verdict)}")
    return said


def previous_version(verdict) -> str:
    return "-" if verdict.previous is None else f"v{verdict.previous.version}"


def test_a_regression_stays_one_until_the_figures_come_back_or_are_accepted(tmp_path):
    paths = StatePaths(tmp_path / "state").ensure()
    said = nights(
        paths,
        [
            ("7", 0.80, 0.02),  # the first night
            ("8", 0.70, 0.02),  # a worse model takes the alias
            ("8", 0.70, 0.02),  # the night after: as low
            ("8", 0.70, 1.00),  # accepted on purpose, by a larger allowance
            ("8", 0.70, 0.02),  # held against the accepted figures from then on
        ],
    )
    assert said == [
        "v7 ok against -",
        "v8 regression against v7",
        "v8 regression against v7",
        "v8 ok against v7",
        "v8 ok against v8",
    ]
    recorded = eval_history.history(paths.duckdb, "r1-micro", "final")
    assert [e.verdict for e in recorded] == ["ok", "regression", "regression", "ok", "ok"]

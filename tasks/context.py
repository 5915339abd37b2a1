"""What every stage task needs to know about the pipeline run it belongs to."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from mlflow import MlflowClient
from pydantic import BaseModel

from stages.refs import ModelRef, ProblemSet
from storage import store
from storage.digests import file_digest, tree_digest
from storage.paths import StatePaths
from storage.tracking import (
    MlflowTracker,
    log_dataset,
    register_model,
    stage_run,
    tracking_client,
)

T = TypeVar("T")


@dataclass(frozen=True)
class RunContext:
    """Small and picklable: Prefect passes it between tasks."""

    state_root: Path
    parent_run_id: str
    flow_run_id: str
    model_name: str

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.state_root)

    def stage_dir(self, stage: str) -> Path:
        return self.paths.stage_dir(self.parent_run_id, stage)

    def client(self) -> MlflowClient:
        return tracking_client(self.paths)


@dataclass(frozen=True)
class StageResult(Generic[T]):
    """A stage's output with the MLflow run that recorded it and how long it took."""

    stage: str
    run_id: str
    output: T
    seconds: float
    digest: str = ""
    notes: dict[str, Any] = field(default_factory=dict)


def log_problems(client: MlflowClient, run_id: str, problems: ProblemSet, split: str) -> str:
    """Record a problem file as an input of `run_id`; returns its content digest."""
    path, rows, context = (
        (problems.train_path, problems.n_train, "train")
        if split == "train"
        else (problems.heldout_path, problems.n_heldout, "eval")
    )
    digest = file_digest(path)
    log_dataset(client, run_id, f"problems-{split}", digest, path, context, rows)
    return digest


def record_model(
    ctx: RunContext, tracker: MlflowTracker, stage: str, model: ModelRef, inputs: list[str]
) -> tuple[str, str]:
    """Digest a stage's model, register it as `name@stage`, and record where it came from.

    Returns the model's content digest and its registered version.
    """
    digest = tree_digest(model.path)
    version = register_model(tracker.client, tracker.run_id, model.path, ctx.model_name, stage)
    store.record_lineage(
        ctx.paths.duckdb, str(model.path), "model", digest, stage, tracker.run_id, inputs
    )
    return digest, version


@contextmanager
def tracked_stage(
    ctx: RunContext, stage: str, config: BaseModel
) -> Iterator[tuple[MlflowTracker, dict]]:
    """A nested MLflow run around a stage; the dict collects `seconds` when the block ends."""
    client = ctx.client()
    timing: dict[str, float] = {}
    with stage_run(client, ctx.parent_run_id, stage, config.model_dump(mode="json")) as tracker:
        began = time.perf_counter()
        yield tracker, timing
        timing["seconds"] = time.perf_counter() - began
        tracker.log_metrics({"stage/seconds": timing["seconds"]})

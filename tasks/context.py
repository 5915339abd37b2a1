"""What every stage task needs to know about the pipeline run it belongs to."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from uuid import UUID

from mlflow import MlflowClient
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from pydantic import BaseModel

from configs.cluster import ClusterConfig
from models.saved import ModelRef
from problems.types import ProblemSet
from storage import store
from storage.digests import file_digest, tree_digest
from storage.lineage import InputRef
from storage.paths import StatePaths
from storage.tracking import (
    MlflowTracker,
    alias_for,
    log_dataset,
    register_model,
    stage_run,
    tracking_client,
)
from tasks.stage_cache import KEY_LENGTH, current_stage_key, identity
from training import PROGRESS

T = TypeVar("T")


@dataclass(frozen=True)
class RunContext:
    """Small and picklable: Prefect passes it between tasks."""

    state_root: Path
    parent_run_id: str
    flow_run_id: str
    model_name: str
    fail_at: str | None = None  # `faults.fail_once_at`: "stage" or "stage@step"
    cluster: ClusterConfig | None = None  # where stages run beyond this machine; not in keys

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.state_root)

    def stage_dir(self, stage: str) -> Path:
        """The working folder of the stage task this is called in, named by its stage key: a
        rerun with the same inputs finds its files and checkpoints again."""
        return self.paths.runs / stage / current_stage_key()[:KEY_LENGTH]

    def run_dir(self, name: str) -> Path:
        """A folder of this pipeline run's own (the report)."""
        return self.paths.runs / "pipeline" / self.parent_run_id / name

    def client(self) -> MlflowClient:
        return tracking_client(self.paths)

    def stage_identity(self) -> dict[str, str]:
        """Its part of a stage key: the state folder (stages never share results across state
        folders), never the run's ids, nor where the stages run (`cluster`): a run on one
        machine and one on a cluster share their stages."""
        return {"state": str(self.state_root)}


@dataclass(frozen=True)
class StageResult(Generic[T]):
    """A stage's output with the MLflow run that recorded it and how long it took."""

    stage: str
    run_id: str
    output: T
    seconds: float
    digest: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> InputRef:
        """This output as an input of a later stage: its digest and the run that produced it."""
        return InputRef(self.digest, self.run_id)

    def stage_identity(self) -> dict[str, Any]:
        """Its part of a later stage's key: which stage, and its output's content."""
        return {"stage": self.stage, "digest": self.digest or identity(self.output)}


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
    ctx: RunContext,
    tracker: MlflowTracker,
    stage: str,
    model: ModelRef,
    inputs: list[str | InputRef],
) -> tuple[str, str]:
    """Digest a stage's model, register it as `name@alias` (`alias_for`) and record its lineage.

    Returns the model's content digest and its registered version.
    """
    digest = tree_digest(model.path)
    tracker.client.set_tag(tracker.run_id, "model.digest", digest)
    version = register_model(
        tracker.client, tracker.run_id, model.path, ctx.model_name, alias_for(stage)
    )
    store.record_lineage(
        ctx.paths.duckdb, str(model.path), "model", digest, stage, tracker.run_id, inputs
    )
    return digest, version


def record_dataset(
    ctx: RunContext,
    tracker: MlflowTracker,
    stage: str,
    path: Path,
    digest: str,
    rows: int,
    inputs: list[str | InputRef],
    name: str | None = None,
) -> InputRef:
    """A dataset that a stage made and trains or samples on: logged as its MLflow run's training
    input `name` (default: the stage's) under its content digest, its lineage recorded. Returns
    it as an input of the stage's model."""
    log_dataset(tracker.client, tracker.run_id, name or stage, digest, path, "training", rows)
    store.record_lineage(
        ctx.paths.duckdb, str(path), "dataset", digest, stage, tracker.run_id, inputs
    )
    return InputRef(digest, tracker.run_id)


CHECKPOINT_TAG = "r1.checkpoint"  # the local folder a stage's model was taken from, untrained


def tag_checkpoint(tracker: MlflowTracker, path: Path, hub_id: str | None) -> None:
    """Mark a stage's MLflow run as taking its model from a local checkpoint (and from which
    hub repository that is a download of, when the profile says)."""
    tracker.client.set_tag(tracker.run_id, CHECKPOINT_TAG, str(path.resolve()))
    if hub_id:
        tracker.client.set_tag(tracker.run_id, f"{CHECKPOINT_TAG}.hub_id", hub_id)


PROGRESS_STEP = 5.0  # percentage points between updates of a stage's progress artifact


class InjectedFailure(RuntimeError):
    """The one-time failure that `faults.fail_once_at` asked for."""


class StageTracker(MlflowTracker):
    """A stage's MLflow run, plus what Prefect shows while it runs: a progress artifact fed by
    the `progress/fraction` metric, and the one-time failure of `faults.fail_once_at`."""

    def __init__(self, client: MlflowClient, run_id: str, ctx: RunContext, stage: str):
        super().__init__(client, run_id)
        self.ctx = ctx
        self.stage = stage
        self._progress_id: UUID | None = None
        self._shown = -1.0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        if PROGRESS in metrics:
            self._show_progress(metrics[PROGRESS])
        if step is not None:
            self.fail_if_asked(step)

    def _show_progress(self, fraction: float) -> None:
        percent = round(100 * fraction, 1)
        # every 5 points at most: each update is an event that `prefect ... --watch` prints
        if percent - self._shown < PROGRESS_STEP and percent < 100:
            return
        self._shown = percent
        description = f"{self.stage}: {percent:.0f}% (MLflow run {self.run_id})"
        if self._progress_id is None:
            key = f"progress-{self.stage.replace('_', '-')}"
            self._progress_id = create_progress_artifact(percent, key, description)
        else:
            update_progress_artifact(self._progress_id, percent, description)

    def fail_if_asked(self, step: int = 0) -> None:
        """Raise once per flow run when this stage is the one `faults.fail_once_at` names and it
        has reached the named step (a marker in the state folder remembers that it fired)."""
        if not self.ctx.fail_at:
            return
        stage, _, at = self.ctx.fail_at.partition("@")
        if stage != self.stage or step < int(at or 0):
            return
        marker = self.ctx.paths.faults / f"{self.ctx.flow_run_id}-{stage}"
        if marker.exists():
            return
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"step {step}\n")
        raise InjectedFailure(f"{stage}: injected failure at step {step} (faults.fail_once_at)")


@contextmanager
def tracked_stage(
    ctx: RunContext, stage: str, config: BaseModel
) -> Iterator[tuple[StageTracker, dict]]:
    """A nested MLflow run around a stage; the dict collects `seconds` when the block ends."""
    client = ctx.client()
    timing: dict[str, float] = {}
    settings = config.model_dump(mode="json")
    with stage_run(client, ctx.parent_run_id, stage, settings, current_stage_key()) as run:
        tracker = StageTracker(client, run.run_id, ctx, stage)
        tracker.fail_if_asked()
        began = time.perf_counter()
        yield tracker, timing
        timing["seconds"] = time.perf_counter() - began
        tracker.log_metrics({"stage/seconds": timing["seconds"]})

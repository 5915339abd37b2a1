"""What every stage task needs to know about the pipeline run it belongs to."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from mlflow import MlflowClient
from mlflow.entities import LifecycleStage
from mlflow.exceptions import MlflowException
from pydantic import BaseModel

from configs.cluster import ClusterConfig
from models.saved import ModelRef
from problems.types import ProblemSet
from stages.reward_model import RewardModelRef
from storage import store
from storage.digests import file_digest, tree_digest
from storage.disk import disk_error
from storage.lineage import InputRef
from storage.model_registry import source_present
from storage.paths import StatePaths
from storage.tracking import (
    MlflowTracker,
    alias_for,
    log_dataset,
    register_model,
    stage_run,
    tracking_client,
)
from tasks.progress import ProgressLines, run_logger, stage_position, step_text
from tasks.stage_cache import KEY_LENGTH, current_stage_key, identity, recorded_runs
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
    stages: tuple[str, ...] = ()  # the stages the flow will run, in order (tasks.plan)
    keep_finished: bool = False  # `cache.keep_finished` (tasks/stage_cache.py); not in keys

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

    def holds_run(self, run_id: str) -> bool:
        """Whether the MLflow store still holds `run_id`, not deleted (`mlflow runs delete`,
        the UI's delete; `mlflow gc` then removes it and its files)."""
        try:
            run = self.client().get_run(run_id)
        except MlflowException as error:
            if error.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        return run.info.lifecycle_stage != LifecycleStage.DELETED

    def unrecorded(self, result: Any) -> list[str]:
        """What the MLflow store no longer holds of a stage's finished result: a run that
        recorded it (`holds_run`), or the registered version of a stage's model (a version
        deleted in the MLflow UI: the stage's alias would stay off it), or that version's files
        (`mlartifacts/` deleted to free disk)."""
        runs = recorded_runs(result)
        gone = [f"MLflow run {run_id}" for run_id in runs if not self.holds_run(run_id)]
        if gone or not isinstance(result, StageResult):
            return gone
        query = f"name = '{self.model_name}' and run_id = '{result.run_id}'"
        versions = self.client().search_model_versions(query)
        if any(source_present(version.source) for version in versions):
            return []
        if versions:
            return [f"the files of {self.model_name} version {versions[0].version}"]
        if isinstance(result.output, ModelRef | RewardModelRef):  # the stages that register
            return [f"the registered version of {self.model_name} from run {result.run_id}"]
        return []

    def stage_identity(self) -> dict[str, str]:
        """Its part of a stage key: the state folder, by its path and its own identity (stages
        never share results across state folders, nor with a folder once at the same path),
        never the run's ids, nor where the stages run (`cluster`): a run on one machine and one
        on a cluster share their stages."""
        made = self.paths.identity()
        return {"state": str(self.state_root)} | ({"state_id": made} if made else {})


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
    alias: bool = True,
) -> tuple[str, str]:
    """Digest a stage's model, register it as `name@alias` (`alias_for`; a new version with no
    alias when `alias` is False: a model the RL guard caught) and record its lineage.

    Returns the model's content digest and its registered version.
    """
    digest = tree_digest(model.path)
    tracker.client.set_tag(tracker.run_id, "model.digest", digest)
    version = register_model(
        tracker.client,
        tracker.run_id,
        model.path,
        ctx.model_name,
        alias_for(stage) if alias else None,
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


class InjectedFailure(RuntimeError):
    """The one-time failure that `faults.fail_once_at` asked for."""


class StageTracker(MlflowTracker):
    """A stage's MLflow run, plus what a person following the flow run reads: a log line when
    another tenth of the stage's steps is done (`step 40 of 200 (20%)`, from the
    `progress/fraction` metric; its first line said `stage 6 of 16 starts`), and the one-time
    failure of `faults.fail_once_at`."""

    def __init__(self, run: MlflowTracker, ctx: RunContext, stage: str):
        super().__init__(run.client, run.run_id, run.attempts)
        self.ctx = ctx
        self.stage = stage
        self.position = stage_position(stage, ctx.stages)
        self.step = 0  # the last step logged
        self._lines = ProgressLines()

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        if step:
            self.step = step
        if PROGRESS in metrics and self._lines.due(metrics[PROGRESS]):
            run_logger().info("%s", step_text(step or 0, metrics[PROGRESS]))
        if step is not None:
            self.fail_if_asked(step)

    def note(self, text: str) -> None:
        """A line for the person following the run (`--watch`, `r1 watch`): the RL guard's
        trips and rollbacks."""
        run_logger().warning("%s", text)

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
    """A nested MLflow run around a stage; the dict collects `seconds` when the block ends: the
    stage's time over all its attempts, when a retry resumed it."""
    client = ctx.client()
    timing: dict[str, float] = {}
    settings = config.model_dump(mode="json")
    with stage_run(client, ctx.parent_run_id, stage, settings, current_stage_key()) as run:
        tracker = StageTracker(run, ctx, stage)
        announce(tracker)
        began = time.perf_counter()
        try:
            tracker.fail_if_asked()
            yield tracker, timing
        except Exception as err:
            told = disk_error(err, ctx.state_root, stage)  # a full disk, in one line
            shown = told or err
            at = f" at step {tracker.step}" if tracker.step else ""
            run_logger().error(
                "%s failed%s:\n%s: %s", tracker.position, at, type(shown).__name__, shown
            )
            if told is not None:
                raise told from err
            raise
        timing["seconds"] = run.attempts.earlier_seconds + time.perf_counter() - began
        tracker.log_metrics({"stage/seconds": timing["seconds"]})


def announce(tracker: StageTracker) -> None:
    """The stage's first lines: its place in the run, its MLflow run, and the attempt."""
    run_logger().info("%s", start_text(tracker.position, tracker.run_id, tracker.attempts.number))


def start_text(position: str, run_id: str, attempt: int) -> str:
    """`stage 6 of 16 starts` (`resumes`, on an attempt after the first), then its MLflow run
    and attempt on lines of their own: a 32-character run id after a long stage's name would
    not fit a log line at 80 columns."""
    if attempt <= 1:
        return f"{position} starts\nMLflow run {run_id}"
    return f"{position} resumes\nMLflow run {run_id}\nattempt {attempt}"

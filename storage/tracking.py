"""MLflow tracking: one parent run per pipeline run, a nested run per stage.

Every call names its run id explicitly: MLflow's active run is thread-local and Prefect runs
tasks on worker threads, so nothing here relies on `mlflow.start_run` state.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Run, RunStatus

from storage.disk import write_failure
from storage.file_lock import FileBusy, held
from storage.paths import StatePaths, env_seconds
from storage.sqlite_lock import (
    StoreLockedTooLong,
    describe_holders,
    lock_holders,
    while_locked,
    write_ahead_log,
)

log = logging.getLogger(__name__)


class FullDiskBrief(logging.Filter):
    """MLflow logs each SQL error of its store with the traceback before it raises it again. On
    a full disk the stage then tells the error in one line (storage/disk.py), so MLflow's record
    keeps its words and loses the traceback: about forty lines for each write that failed, and
    a failed stage's record of its failure is one more."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and write_failure(error) is not None:
            record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("mlflow.store.db.utils").addFilter(FullDiskBrief())

os.environ.setdefault("MLFLOW_SKIP_PIP_REQUIREMENTS_CHECK", "true")

PARENT_TAG = "mlflow.parentRunId"
FLOW_RUN_TAG = "prefect.flow_run_id"
STAGE_TAG = "r1.stage"

# The registry alias of each stage's model; stages not named here use their name with hyphens.
STAGE_ALIASES = {
    "cold_start_sft": "cold-start",
    "reasoning_rl": "reasoning-rl",
    "mixed_sft": "rejection-sft",
    "all_scenarios_rl": "final",
    "student_qwen": "student-qwen",
    "student_llama": "student-llama",
}


def alias_for(stage: str) -> str:
    """`models:/NAME@ALIAS` names a stage's model by this alias, e.g. `r1-tiny@final`."""
    return STAGE_ALIASES.get(stage, stage.replace("_", "-"))


def tracking_client(paths: StatePaths) -> MlflowClient:
    """The state folder's store for runs and registry alike (never `MLFLOW_REGISTRY_URI`'s)."""
    return MlflowClient(tracking_uri=paths.tracking_uri, registry_uri=paths.tracking_uri)


TIMEOUT_ENV = "R1_MLFLOW_TIMEOUT"
DEFAULT_TIMEOUT = 5.0  # seconds to wait for a store another process is writing
LOCK_WAIT_ENV = "R1_MLFLOW_LOCK_WAIT"
# seconds a stage's write waits for another writer, MLflow's own 20 s busy wait per try included
DEFAULT_LOCK_WAIT = 120.0
STORE_MADE_WAIT = 120.0  # seconds to wait for another process making the store (its migration)


class TrackingStoreError(RuntimeError):
    """The MLflow store of the state folder cannot be used; the message names it and the cause."""


def check_tracking_store(paths: StatePaths, timeout: float | None = None) -> None:
    """Fail fast, before any stage runs, if the MLflow store cannot be used: the state folder or
    the artifact folder cannot be created or written, `mlflow.db` is not an SQLite database, or
    another process keeps it locked for longer than `timeout` seconds (`R1_MLFLOW_TIMEOUT`,
    default 5). Raises TrackingStoreError naming the store's URI and what failed.

    The store is then in write-ahead-log mode (made so if new): a process reading it, such as
    the MLflow UI, never holds up a stage's write. A new store's tables are made here, by one
    process at a time (`locks/mlflow-store.lock`): two runs starting together on a new state
    folder would otherwise both run MLflow's migration on it, and one die of it."""
    wait = env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT) if timeout is None else timeout
    check_wait_settings()
    uri = paths.tracking_uri
    _check_folder(uri, paths.root, "state folder")
    _check_folder(uri, paths.mlflow_artifacts, "artifact folder")
    try:  # two runs starting on a new folder: one makes the store, the other waits for it
        with held(paths.locks / "mlflow-store.lock", max(wait, STORE_MADE_WAIT)):
            _check_database(uri, paths.mlflow_db, wait)
            try:
                write_ahead_log(paths.mlflow_db, wait)
            except sqlite3.OperationalError as err:
                raise _locked_or(uri, paths.mlflow_db, wait, err) from None
            tracking_client(paths).search_experiments(max_results=1)  # MLflow makes its tables
    except FileBusy as busy:
        raise TrackingStoreError(
            f"MLflow store {uri}: {busy.holder} has been making or checking it for over "
            f"{max(wait, STORE_MADE_WAIT):g} s; stop that process, or run again once it is done"
        ) from None
    _check_artifact_location(uri, paths)


def _check_artifact_location(uri: str, paths: StatePaths) -> None:
    """Every experiment this project made in the store keeps its artifacts in this state
    folder's `mlartifacts/`. MLflow records that location as an absolute path when it makes an
    experiment: in a folder moved or copied since, a run would write its models into the old
    folder (making it again if gone) and read registered models from there. A path that leads
    here through a symlink is here. (Experiments kept elsewhere, such as MLflow's `Default`,
    are not ours and are left alone.)"""
    con = sqlite3.connect(paths.mlflow_db)
    try:
        found = con.execute("SELECT name, artifact_location FROM experiments").fetchall()
    except sqlite3.Error:  # a store MLflow has not made its tables in yet
        return
    finally:
        con.close()
    here = paths.mlflow_artifacts.resolve()
    for name, location in found:
        folder = _local_folder(location or "")
        if folder is None or folder.name != paths.mlflow_artifacts.name:
            continue
        if Path(os.path.realpath(folder)) != here:
            old = folder.parent
            raise TrackingStoreError(
                f"MLflow store {uri}: experiment {name!r} keeps its artifacts in {folder}: this "
                f"state folder was moved or copied from {old}; move it back, or make {old} a "
                f'symlink to {paths.root} (docs/operations.md, "Moving a state folder")'
            )


def _local_folder(location: str) -> Path | None:
    """The local folder an artifact location names (a `file:` URI or an absolute path)."""
    if location.startswith("file:"):
        location = unquote(urlparse(location).path)
    return Path(location) if location.startswith("/") else None


def _locked_or(
    uri: str, db: Path, wait: float, err: sqlite3.OperationalError
) -> TrackingStoreError:
    """The preflight's error for an SQLite failure: the lock's holders named when it is a lock."""
    if "locked" not in str(err):
        return TrackingStoreError(f"MLflow store {uri}: cannot use {db}: {err}")
    return TrackingStoreError(
        f"MLflow store {uri}: {db} is locked by {describe_holders(lock_holders(db))} and was "
        f"still locked after {wait:g} s; stop the process writing it (or set {TIMEOUT_ENV} to "
        "wait longer)"
    )


def _check_folder(uri: str, folder: Path, what: str) -> None:
    """`folder` exists (or can be made) and a file can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TrackingStoreError(
            f"MLflow store {uri}: cannot create the {what} {folder}: {err.strerror or err}"
        ) from None
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise TrackingStoreError(
            f"MLflow store {uri}: cannot write in the {what} {folder}: {err.strerror or err}"
        ) from None


def _check_database(uri: str, db: Path, wait: float) -> None:
    """`db`, if it exists, opens as an SQLite database and takes a write lock within `wait`
    seconds (a missing one MLflow creates, in a folder `_check_folder` found writable)."""
    if not db.exists():
        return
    if not db.is_file():
        raise TrackingStoreError(f"MLflow store {uri}: {db} is not a file")
    try:
        con = sqlite3.connect(db, timeout=wait, isolation_level=None)
    except sqlite3.Error as err:
        raise TrackingStoreError(f"MLflow store {uri}: cannot open {db}: {err}") from None
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        con.execute("BEGIN IMMEDIATE")  # the write lock every MLflow call needs
        con.execute("ROLLBACK")
    except sqlite3.OperationalError as err:
        raise _locked_or(uri, db, wait, err) from None
    except sqlite3.DatabaseError as err:
        raise TrackingStoreError(
            f"MLflow store {uri}: {db} is not an SQLite database ({err}); move it away to start "
            "a new store"
        ) from None
    finally:
        con.close()


# MLflow 3's UI opens an experiment of unknown kind in its GenAI view (traces, which we have
# none of); this kind opens it on its runs.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def experiment_id(client: MlflowClient, name: str, paths: StatePaths) -> str:
    """The experiment called `name`, created with its artifacts inside the state folder, of the
    kind that the MLflow UI opens on its runs."""
    found = client.get_experiment_by_name(name)
    if found is None:
        return client.create_experiment(
            name,
            artifact_location=paths.mlflow_artifacts.as_uri(),
            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
        )
    if found.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return found.experiment_id


def start_pipeline_run(
    client: MlflowClient, experiment: str, name: str, flow_run_id: str, config: dict[str, Any]
) -> str:
    run = client.create_run(
        experiment, run_name=name, tags={FLOW_RUN_TAG: flow_run_id, STAGE_TAG: "pipeline"}
    )
    client.log_dict(run.info.run_id, config, "config.json")
    return run.info.run_id


@dataclass(frozen=True)
class Attempts:
    """What the earlier attempts of a resumed stage run left in it: the last step each metric
    reached (a resumed stage goes over the steps after its checkpoint again), and their time."""

    number: int = 1  # this attempt's
    last_steps: dict[str, int] = field(default_factory=dict)
    earlier_seconds: float = 0.0


def store_file(client: MlflowClient) -> Path | None:
    """The SQLite file behind `client`, None for another kind of store."""
    uri = str(client.tracking_uri)
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def lock_wait_seconds() -> float:
    """How long a stage's write waits for a store another process writes: `R1_MLFLOW_LOCK_WAIT`."""
    return env_seconds(LOCK_WAIT_ENV, DEFAULT_LOCK_WAIT)


def check_wait_settings() -> None:
    """Read every store's wait from the environment now (`R1_MLFLOW_TIMEOUT`,
    `R1_MLFLOW_LOCK_WAIT`, `R1_DUCKDB_LOCK_WAIT`): a bad value is named before any stage runs,
    not at a stage's first metric or store call."""
    from storage.store import lock_wait_seconds as duckdb_lock_wait

    env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT)
    lock_wait_seconds()
    duckdb_lock_wait()


def patiently(client: MlflowClient, write: Callable[[], None], what: str) -> None:
    """`write()` to the store, tried again while another process holds it for at most
    `R1_MLFLOW_LOCK_WAIT` seconds; then TrackingStoreError naming that process."""
    db = store_file(client)
    if db is None:
        write()
        return
    try:
        while_locked(write, db, lock_wait_seconds(), what)
    except StoreLockedTooLong as err:
        raise TrackingStoreError(f"{err}; stop that process, or set {LOCK_WAIT_ENV}") from err


class MlflowTracker:
    """The stages' Tracker, writing to one MLflow run. In a resumed run, a point of a curve at
    a step an earlier attempt already logged is not logged again: one point per step. A write
    that finds the store locked by another process is tried again for `R1_MLFLOW_LOCK_WAIT`
    seconds (default 120), then fails naming the processes that hold it."""

    def __init__(self, client: MlflowClient, run_id: str, attempts: Attempts | None = None):
        self.client = client
        self.run_id = run_id
        self.attempts = attempts or Attempts()

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        last = self.attempts.last_steps
        batch = [
            Metric(key, float(value), now, step or 0)
            for key, value in metrics.items()
            if not step or step > last.get(key, 0)  # step 0: a stage's figure, not a curve
        ]
        if not batch:
            return

        def write() -> None:
            self.client.log_batch(self.run_id, metrics=batch, synchronous=True)

        patiently(self.client, write, f"run {self.run_id}: metrics at step {step or 0}")

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)


STAGE_KEY_TAG = "r1.stage_key"
ATTEMPTS_TAG = "r1.attempts"
ATTEMPT_STARTED_TAG = "r1.attempt_started"  # epoch ms when a resumed run's latest attempt began
ATTEMPT_SECONDS = "stage/attempt_seconds"  # metric: each ended attempt's seconds, at step N
ERROR_TAG = "r1.error"


@contextmanager
def stage_run(
    client: MlflowClient,
    parent_run_id: str,
    stage: str,
    config: dict[str, Any],
    key: str | None = None,
) -> Iterator[MlflowTracker]:
    """A nested run for one stage; marked FAILED (with the error) if the stage raises, FINISHED
    otherwise.

    With the stage's cache `key`, an earlier attempt of the same stage under the same parent
    that did not finish (it failed, or its process was killed and left it RUNNING) is resumed
    rather than joined by a second run: its end is recorded as `r1.attempt.N`, its time as the
    point N of `stage/attempt_seconds`, and its curves go on where the stage resumes from its
    checkpoint, one point per step (the tracker's `attempts`).
    """
    parent = client.get_run(parent_run_id)
    earlier = unfinished_stage_run(client, parent, stage, key) if key else None
    if earlier is not None:
        run_id, attempts = resume_stage_run(client, earlier)
    else:
        tags = {
            PARENT_TAG: parent_run_id,
            STAGE_TAG: stage,
            FLOW_RUN_TAG: parent.data.tags.get(FLOW_RUN_TAG, ""),
        }
        if key:
            tags[STAGE_KEY_TAG] = key
        run_id = client.create_run(parent.info.experiment_id, run_name=stage, tags=tags).info.run_id
        attempts = Attempts()
    began = time.time()
    client.log_dict(run_id, config, "config.json")
    try:
        yield MlflowTracker(client, run_id, attempts)
    except BaseException as err:
        record_failure(client, run_id, err, time.time() - began, attempts.number)
        raise
    finished = RunStatus.to_string(RunStatus.FINISHED)
    patiently(client, lambda: client.set_terminated(run_id, finished), f"run {run_id}: finished")


def record_failure(
    client: MlflowClient, run_id: str, err: BaseException, seconds: float, attempt: int
) -> None:
    """Mark a failed stage's run FAILED with its error and time, once: a store that refuses the
    record (locked by another process, say) is logged, never raised over the stage's own error,
    and the run left RUNNING is taken for killed by the next attempt (`resume_stage_run`)."""
    try:
        client.log_metric(run_id, ATTEMPT_SECONDS, seconds, step=attempt)
        client.set_tag(run_id, ERROR_TAG, f"{type(err).__name__}: {err}"[:5000])
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
    except Exception as failed:
        log.error("stage run %s: its failure was not recorded in MLflow: %s", run_id, failed)


def unfinished_stage_run(client: MlflowClient, parent: Run, stage: str, key: str) -> Run | None:
    """The latest run of `stage` with `key` under `parent` that did not finish, if any."""
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=(
            f"tags.`{PARENT_TAG}` = '{parent.info.run_id}' AND tags.`{STAGE_TAG}` = '{stage}' "
            f"AND tags.`{STAGE_KEY_TAG}` = '{key}' AND attributes.status != 'FINISHED'"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def resume_stage_run(client: MlflowClient, run: Run) -> tuple[str, Attempts]:
    """Reopen an unfinished stage run, recording how its last attempt ended and how long it
    took (a killed attempt: until its last record). Returns the run and what its earlier
    attempts left."""
    attempt = int(run.data.tags.get(ATTEMPTS_TAG, "1"))
    run_id = run.info.run_id
    last_steps, last_record_ms = logged_steps(client, run)
    spent = {int(m.step): m.value for m in client.get_metric_history(run_id, ATTEMPT_SECONDS)}
    started = int(run.data.tags.get(ATTEMPT_STARTED_TAG, run.info.start_time))
    if run.info.status == "RUNNING":
        ended = "killed: its process ended without closing the run"
        if attempt not in spent:  # until its last record: what came after it was lost
            spent[attempt] = max(0.0, (max(last_record_ms, started) - started) / 1000)
            client.log_metric(run_id, ATTEMPT_SECONDS, spent[attempt], step=attempt)
    else:
        ended = f"{run.info.status.lower()}: {run.data.tags.get(ERROR_TAG, 'no error recorded')}"
    client.set_tag(run_id, f"r1.attempt.{attempt}", ended[:5000])
    client.set_tag(run_id, ATTEMPTS_TAG, str(attempt + 1))
    client.set_tag(run_id, ATTEMPT_STARTED_TAG, str(int(time.time() * 1000)))
    if ERROR_TAG in run.data.tags:
        client.delete_tag(run_id, ERROR_TAG)
    client.update_run(run_id, status="RUNNING")
    log.info("stage run %s resumed (attempt %d; the last one %s)", run_id, attempt + 1, ended)
    return run_id, Attempts(attempt + 1, last_steps, sum(spent.values()))


def logged_steps(client: MlflowClient, run: Run) -> tuple[dict[str, int], int]:
    """The last step each of the run's metrics reached, and the time (epoch ms) of its latest
    record (0 when it has none)."""
    steps: dict[str, int] = {}
    latest = 0
    for key in run.data.metrics:
        history = client.get_metric_history(run.info.run_id, key)
        steps[key] = max((int(m.step) for m in history), default=0)
        latest = max([latest] + [m.timestamp for m in history])
    return steps, latest


def finish_run(client: MlflowClient, run_id: str, failed: bool = False) -> None:
    status = RunStatus.FAILED if failed else RunStatus.FINISHED
    client.set_terminated(run_id, RunStatus.to_string(status))


def log_dataset(
    client: MlflowClient,
    run_id: str,
    name: str,
    digest: str,
    source: Path,
    context: str,
    rows: int,
) -> None:
    """Record a dataset as an input of `run_id`, under our own digest of its full content.

    (MLflow's automatic digest looks at the first 10,000 rows only.)
    """
    dataset = Dataset(
        name=name,
        digest=digest[:36],
        source_type="local",
        source=f'{{"uri": "{source.resolve().as_uri()}"}}',
        profile=f'{{"num_rows": {rows}}}',
    )
    tags = [InputTag("mlflow.data.context", context)]
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, tags)])


def register_model(
    client: MlflowClient, run_id: str, model_dir: Path, name: str, alias: str | None
) -> str:
    """Log a model folder as the run's `model` artifact and register it as a new version of
    `name`, under `name@alias` unless `alias` is None."""
    client.log_artifacts(run_id, str(model_dir), "model")
    if client.search_registered_models(filter_string=f"name = '{name}'") == []:
        client.create_registered_model(name)
    source = f"{client.get_run(run_id).info.artifact_uri}/model"
    version = client.create_model_version(name, source, run_id=run_id)
    if alias is not None:
        client.set_model_version_tag(name, version.version, ALIAS_TAG, alias)  # it earned it
        client.set_registered_model_alias(name, alias, version.version)
    return version.version


ALIAS_TAG = "r1.alias"  # on a model version: the alias its stage gave it (none: the guard's catch)


def restore_alias(client: MlflowClient, name: str, run_id: str) -> str | None:
    """Point the alias back at the version the stage run `run_id` registered with it, for a
    stage a later run took from the cache: `NAME@ALIAS` is the model the latest run reports,
    not one a run with other settings registered in between. Returns the version moved to."""
    versions = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    earned = [v for v in versions if v.tags.get(ALIAS_TAG)]
    if not earned:
        return None
    latest = max(earned, key=lambda v: int(v.version))
    alias = latest.tags[ALIAS_TAG]
    if str(client.get_registered_model(name).aliases.get(alias)) != str(latest.version):
        client.set_registered_model_alias(name, alias, latest.version)
        return latest.version
    return None

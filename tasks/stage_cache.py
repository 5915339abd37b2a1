"""Stage caching: a finished stage is not computed again.

A stage's key covers the task's name, its config, the content digests of its inputs, the state
folder (its path and its own identity, `StatePaths.identity`) and the code version. The task's
result is persisted by Prefect under that key, so a retried flow run, or a new run with the same
parameters, takes every finished stage from the cache and starts at the first stage whose key it
has not seen. The key also names the stage's working folder (`runs/<stage>/<key>`), so a training
stage that died mid-way finds its own checkpoints again and resumes from the last one.

Every key a stage is called with is remembered beside its key without the code version
(`state/stage_keys/<inputs key>/<key>`). With `cache.keep_finished` on, a stage whose key has no
result takes the latest earlier one on the same inputs that has: a run resumed after a fix to its
fourth stage keeps the three before it, though the code changed, and runs the stages that never
finished under the code as it is now (the report says which stages were kept, from which code).

A result is used only while every file and folder it names is still there (`missing_files`) and,
for a pipeline stage, while the MLflow store holds the runs that recorded it and its registered
model (`RunContext.unrecorded`): a stage folder or its saved model deleted to free disk, or a
stage run or model version deleted in the MLflow UI, is computed again under the same key, into
the same folder (resuming from its checkpoints where they were kept), instead of being handed to
the next stage as if whole.

Set `PREFECT_TASKS_REFRESH_CACHE=true` to recompute every stage regardless (keep_finished then
keeps nothing).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from prefect import Task, task
from prefect.context import TaskRunContext
from prefect.results import ResultStore
from prefect.settings import PREFECT_TASKS_REFRESH_CACHE
from pydantic import BaseModel

from configs.strict import computed_settings
from storage.digests import file_digest, tree_digest, tree_files
from storage.disk import disk_error
from storage.file_lock import FileBusy, held
from storage.paths import StatePaths
from tasks.progress import name_task_run_logs, run_logger

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CODE_PACKAGES = (
    "configs",
    "contracts",
    "curation",
    "evaluation",
    "graders",
    "guard",
    "models",
    "preference",
    "problems",
    "rewards",
    "rl",
    "sampling",
    "sandbox",
    "stages",
    "storage",
    "tasks",
    "training",
)
KEY_LENGTH = 16  # hex characters of the key in folder names


@runtime_checkable
class Keyed(Protocol):
    """A task parameter that says what it contributes to a stage key."""

    def stage_identity(self) -> Any: ...


@cache
def code_version() -> str:
    """Digest of the project's Python sources that stages run: any edit invalidates the cache."""
    h = hashlib.sha256()
    for package in CODE_PACKAGES:
        for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
            h.update(path.relative_to(PROJECT_ROOT).as_posix().encode())
            h.update(file_digest(path).encode())
    return h.hexdigest()


def identity(value: Any) -> Any:
    """What a task parameter contributes to a stage key: content, never a run-specific name.
    A value with a `stage_identity()` method (the run context, a stage's result) says its own."""
    if isinstance(value, Keyed):
        return value.stage_identity()
    if isinstance(value, BaseModel):  # what decides what the stage computes (HOW_IT_RUNS)
        dumped = computed_settings(value)
        named = named_contents(value)
        return dumped | {"contents": named} if named else dumped
    if isinstance(value, Path):
        return content_digest(value) if value.exists() else str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: identity(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): identity(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [identity(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"no stage-key identity for a {type(value).__name__}")


def named_contents(config: BaseModel, prefix: str = "") -> dict[str, str]:
    """The content digest of every local file or folder a config names, by its dotted key: the
    data files, `bootstrap.path`, a student's `path`, a grader reward's file and the model
    folders its score_model graders judge with. A file edited in
    place, or a symlink pointed at other data, changes the key of each stage given the config,
    not only a path renamed. Empty for a config that names none (the tiny world's)."""
    found: dict[str, str] = {}
    for name in type(config).model_fields:
        value, key = getattr(config, name), f"{prefix}{name}"
        if isinstance(value, Path) and value.exists():
            found[key] = content_digest(value)
        elif isinstance(value, BaseModel):
            found |= named_contents(value, f"{key}.")
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    found |= named_contents(item, f"{key}.{i}.")
    grader = _grader_file(config)
    if grader is not None:
        found[f"{prefix}params.path"] = content_digest(grader)
        for model, folder in _judge_folders(grader).items():
            found[f"{prefix}params.path:{model}"] = content_digest(folder)
    return found


def _grader_file(config: BaseModel) -> Path | None:
    """The file of a `grader` reward term, where it can be found (it is read from the working
    folder, else the repository: graders.reward)."""
    params = getattr(config, "params", None)
    if getattr(config, "name", None) != "grader" or not isinstance(params, dict):
        return None
    from graders.reward import resolve_grader_path

    given = params.get("path")
    path = resolve_grader_path(given) if isinstance(given, str) and given else None
    return path if path is not None and path.is_file() else None


def _judge_folders(grader: Path) -> dict[str, Path]:
    """The local model folders a grader file's score_model graders judge with, by the name the
    file gives them: new weights in one are another reward. Empty for a file that does not
    load (refused at the run's start: `check_reward_params`)."""
    from graders.score_model import resolve_model_path
    from graders.spec import GraderFileError, judge_models, load_spec

    try:
        models = judge_models(load_spec(grader))
    except GraderFileError:
        return {}
    folders = {model: resolve_model_path(model) for model in models}
    return {model: folder for model, folder in folders.items() if folder.is_dir()}


_DIGESTS: dict[tuple[str, tuple], str] = {}


def content_digest(path: Path) -> str:
    """A file's or folder's content digest (`storage.digests`), read once per process while its
    files' sizes, times and inodes stay as they were: every stage's key may name a checkpoint
    of many GB. A write changes a file's ctime, which no one can set back."""
    files = tree_files(path) if path.is_dir() else [path]
    signature = tuple(
        (str(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        for p in files
        for st in [p.stat()]
    )
    key = (str(path.resolve()), signature)
    if key not in _DIGESTS:
        _DIGESTS[key] = tree_digest(path) if path.is_dir() else file_digest(path)
    return _DIGESTS[key]


StageName = str | Callable[[dict[str, Any]], str] | None


def stage_key(task_name: str, parameters: dict[str, Any], stage: StageName = None) -> str:
    """The key of a stage task's call; a call that runs the stage `faults.fail_once_at` names
    has a key of its own, so the fault fires instead of the stage coming from the cache (a
    retry of that flow run, with the same setting, resumes it)."""
    return _digest(_key_payload(task_name, parameters, stage) | {"code": code_version()})


def _key_payload(task_name: str, parameters: dict[str, Any], stage: StageName) -> dict[str, Any]:
    """A stage key's content but the code version; its digest alone is the call's inputs key
    (the same call under any version of the code)."""
    payload = {
        "task": task_name,
        "parameters": {name: identity(v) for name, v in sorted(parameters.items())},
    }
    fault = fault_for(parameters, stage)
    if fault:
        payload["fault"] = fault
    return payload


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def stage_name(parameters: dict[str, Any], stage: StageName) -> str | None:
    """The stage a call runs: `stage` itself, computed from the call's parameters, or the
    call's `stage` parameter when that is a name; None when none of them says."""
    name = stage(parameters) if callable(stage) else stage or parameters.get("stage")
    return name if isinstance(name, str) else None


def fault_for(parameters: dict[str, Any], stage: StageName) -> str | None:
    """`faults.fail_once_at` when it names the stage this call runs, else None."""
    fail_at = getattr(parameters.get("ctx"), "fail_at", None)  # the run context's, if any
    if not fail_at:
        return None
    return fail_at if fail_at.partition("@")[0] == stage_name(parameters, stage) else None


def _cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """The call's stage key, remembered in the state folder's index; with the run's
    `keep_finished` on and no whole result under it, the latest earlier key on the same inputs
    that has one (its result is then the task's, from the cache). A result under the key that
    is no longer whole is expired first (`usable_result`), so the stage is computed again."""
    stage = getattr(context.task, STAGE_ATTR, None)
    payload = _key_payload(context.task.name, parameters, stage)  # input digests: read once
    key = _digest(payload | {"code": code_version()})
    name = stage_name(parameters, stage) or context.task.name
    unrecorded = getattr(parameters.get("ctx"), "unrecorded", None)  # the run context's, if any
    usable = functools.partial(
        usable_result, context.result_store, name=name, unrecorded=unrecorded
    )
    whole = _refreshing(context.task) or usable(key)
    index = _index_of(parameters.get("ctx"))
    if index is None:
        return key
    same_inputs = _digest(payload)
    try:
        remember_key(index, same_inputs, key)
    except OSError as error:  # the cache itself still works: only a later keep cannot see it
        run_logger().warning("%s: its key is not noted in %s: %s", name, index, error)
    if whole or not getattr(parameters.get("ctx"), "keep_finished", False):
        return key
    try:
        earlier = finished_key(index, same_inputs, usable)
    except OSError as error:
        run_logger().warning("%s: %s cannot be read, nothing kept: %s", name, index, error)
        return key
    if earlier is None:
        return key
    run_logger().info("%s: kept, finished under earlier code (cache.keep_finished)", name)
    return earlier


def usable_result(
    store: ResultStore,
    key: str,
    name: str,
    unrecorded: Callable[[Any], list[str]] | None = None,
) -> bool:
    """Whether a finished result is stored under `key`, every file it names is still there and
    nothing that recorded it is gone from the MLflow store (`unrecorded`, the run context's:
    a stage run deleted in the MLflow UI, a registered version deleted there). One with any of
    them gone (a stage folder or its model deleted to free disk, too) is set to expire now,
    Prefect's own mark of a result it no longer serves: the task then computes again under the
    same key, into the same stage folder (from its checkpoints where they were kept), and
    writes its new result there."""
    if not store.exists(key):
        return False
    result = store.read(key).result
    gone = [str(path) for path in missing_files(result)]
    if not gone and unrecorded is not None:
        gone = unrecorded(result)
    if not gone:
        return True
    past = datetime.now(UTC) - timedelta(seconds=1)
    store.write(result, key=key, expiration=past)
    run_logger().warning(
        "%s: its finished result names %s, which is gone: computing the stage again", name, gone[0]
    )
    return False


@runtime_checkable
class Recorded(Protocol):
    """A result an MLflow run recorded (a stage's): the report and lineage read that run."""

    run_id: str


def _parts(result: Any) -> Iterator[Any]:
    """`result` and everything it holds: fields of dataclasses and pydantic models, the values
    of dicts, the items of lists and tuples."""
    yield result
    if isinstance(result, BaseModel):
        inner = [getattr(result, name) for name in type(result).model_fields]
    elif is_dataclass(result) and not isinstance(result, type):
        inner = [getattr(result, f.name) for f in fields(result)]
    elif isinstance(result, dict):
        inner = list(result.values())
    elif isinstance(result, list | tuple):
        inner = list(result)
    else:
        return
    for item in inner:
        yield from _parts(item)


def missing_files(result: Any) -> list[Path]:
    """The files and folders a stage's result names that are gone, or are folders left empty;
    a result that names none has none missing."""
    return [part for part in _parts(result) if isinstance(part, Path) and not _present(part)]


def recorded_runs(result: Any) -> list[str]:
    """The MLflow runs that recorded a result and what it holds."""
    return [part.run_id for part in _parts(result) if isinstance(part, Recorded) and part.run_id]


def _present(path: Path) -> bool:
    """A file that exists, or a folder that holds something."""
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def _index_of(ctx: Any) -> Path | None:
    """The state folder's key index, for a call with a run context."""
    root = getattr(ctx, "state_root", None)
    return StatePaths(Path(root)).stage_keys if root is not None else None


def _refreshing(made: Task) -> bool:
    """Whether this task recomputes whatever its cache holds (Prefect's own rule)."""
    refresh = made.refresh_cache
    return bool(PREFECT_TASKS_REFRESH_CACHE.value() if refresh is None else refresh)


def remember_key(index: Path, same_inputs: str, key: str) -> None:
    """Note `key` under its inputs key; the file's time says when it was last used."""
    folder = index / same_inputs
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / key
    path.touch()
    now = time.time_ns()  # finer than the file system's own clock, which `touch` takes
    os.utime(path, ns=(now, now))


def finished_key(index: Path, same_inputs: str, exists: Callable[[str], bool]) -> str | None:
    """The most recently used key on these inputs whose result `exists`; None if none."""
    folder = index / same_inputs
    if not folder.is_dir():
        return None
    keys = sorted(folder.iterdir(), key=lambda path: path.stat().st_mtime_ns, reverse=True)
    return next((path.name for path in keys if exists(path.name)), None)


def current_stage_key() -> str:
    """The key of the stage task this code runs in."""
    context = TaskRunContext.get()
    if context is None:
        raise RuntimeError("a stage folder is only known inside a stage task")
    return _cache_key(context, context.parameters)


STAGE_ATTR = "r1_stage"
RunName = Callable[[dict[str, Any]], str]


def stage_task(
    name: str, stage: StageName = None, run_name: RunName | None = None, **options: Any
) -> Callable[[Callable], Task]:
    """`@task` for a pipeline stage: cached by its stage key, result persisted. `stage` names
    the stage the task runs (or computes it from the call's parameters); without it, the call's
    `stage` parameter does. Each task run is named after its stage (`reasoning_rl`, not
    `grpo-741`), or by `run_name` from the call's parameters, wherever Prefect shows it, and
    the logs of every task run carry its name (tasks.progress)."""

    def named(parameters: dict[str, Any]) -> str:
        return stage_name(parameters, stage) or name

    name_task_run_logs()

    def decorate(fn: Callable) -> Task:
        @functools.wraps(fn)
        def computed_alone(*args: Any, **kwargs: Any) -> Any:
            with stage_held(stage, run_name or named):
                try:
                    return fn(*args, **kwargs)
                except Exception as error:
                    told = told_disk_error(error, run_name or named)
                    if told is None:
                        raise
                    raise told from error

        made = task(
            name=name,
            task_run_name=run_name or named,
            cache_key_fn=_cache_key,
            persist_result=True,
            **options,
        )(computed_alone)
        setattr(made, STAGE_ATTR, stage)
        return made

    return decorate


def told_disk_error(error: Exception, run_name: RunName) -> Exception | None:
    """The one-line StateDiskError of a stage task that failed on a full disk or a state folder
    it cannot write (storage/disk.py), naming the stage and the state folder; None for any
    other failure, and outside a pipeline run's stage."""
    context = TaskRunContext.get()
    parameters = context.parameters if context is not None else {}
    root = getattr(parameters.get("ctx"), "state_root", None)
    if root is None:
        return None
    return disk_error(error, Path(root), run_name(parameters))


def telling_full_disks(fn: Callable) -> Callable:
    """A task function with no stage folder (opening and closing a pipeline run, the steps of a
    scheduled evaluation) whose failure on a full disk or a state folder it cannot write is told
    in one line naming the task run and the state folder (`R1_STATE_DIR`), as a stage's is
    (`told_disk_error`). Put it under `@task`."""

    @functools.wraps(fn)
    def told(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            context = TaskRunContext.get()
            who = context.task_run.name if context is not None else fn.__name__
            found = disk_error(error, StatePaths.from_env().root, who)
            if found is None:
                raise
            raise found from error

    return told


class StageBusyError(RuntimeError):
    """Another process computes the same stage, on the same inputs, in this state folder now."""


@contextmanager
def stage_held(stage: StageName, run_name: RunName) -> Iterator[None]:
    """Hold the stage task this runs in (a lock file named by its key, under `locks/` in the
    state folder) while it computes. A second `r1 run` or deployment run on the same state
    folder that reaches the same stage before the first has finished it would otherwise train
    into the same stage folder (`runs/<stage>/<key>`: checkpoints, model) at once, each
    recording a digest of files the other overwrites; it stops instead, in one line naming the
    process that holds the stage."""
    context = TaskRunContext.get()
    parameters = context.parameters if context is not None else {}
    root = getattr(parameters.get("ctx"), "state_root", None)
    if root is None:  # not a pipeline run's stage: no stage folder to share
        yield
        return
    paths = StatePaths(Path(root))
    key = current_stage_key()[:KEY_LENGTH]
    name = stage_name(parameters, stage)
    where = f"in {paths.runs / name / key}" if name else f"(key {key}) in {paths.root}"
    with ExitStack() as stack:
        try:
            stack.enter_context(held(paths.locks / f"{key}.lock"))
        except FileBusy as busy:
            raise StageBusyError(
                f"{run_name(parameters)}: {busy.holder} is computing this stage {where} now; "
                "run the command again once it has finished: the stage then comes from the cache"
            ) from None
        yield

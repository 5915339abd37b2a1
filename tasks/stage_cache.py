"""Stage caching: a finished stage is not computed again.

A stage's key covers the task's name, its config, the content digests of its inputs, the state
folder and the code version. The task's result is persisted by Prefect under that key, so a
retried flow run, or a new run with the same parameters, takes every finished stage from the
cache and starts at the first stage whose key it has not seen. The key also names the stage's
working folder (`runs/<stage>/<key>`), so a training stage that died mid-way finds its own
checkpoints again and resumes from the last one.

Set `PREFECT_TASKS_REFRESH_CACHE=true` to recompute every stage regardless.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from prefect import Task, task
from prefect.context import TaskRunContext
from pydantic import BaseModel

from storage.digests import file_digest, tree_digest
from tasks.progress import name_task_run_logs

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
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        if value.is_dir():
            return tree_digest(value)
        return file_digest(value) if value.exists() else str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: identity(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): identity(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [identity(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"no stage-key identity for a {type(value).__name__}")


StageName = str | Callable[[dict[str, Any]], str] | None


def stage_key(task_name: str, parameters: dict[str, Any], stage: StageName = None) -> str:
    """The key of a stage task's call; a call that runs the stage `faults.fail_once_at` names
    has a key of its own, so the fault fires instead of the stage coming from the cache (a
    retry of that flow run, with the same setting, resumes it)."""
    payload = {
        "task": task_name,
        "code": code_version(),
        "parameters": {name: identity(v) for name, v in sorted(parameters.items())},
    }
    fault = fault_for(parameters, stage)
    if fault:
        payload["fault"] = fault
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
    return stage_key(context.task.name, parameters, getattr(context.task, STAGE_ATTR, None))


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
        made = task(
            name=name,
            task_run_name=run_name or named,
            cache_key_fn=_cache_key,
            persist_result=True,
            **options,
        )(fn)
        setattr(made, STAGE_ATTR, stage)
        return made

    return decorate

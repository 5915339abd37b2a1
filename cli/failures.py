"""Why a flow run failed or crashed, as `r1 runs` and `r1 watch` say it: the stage it was in,
what happened, what to do, in lines that fit an 80-column terminal.

A failed run names the task run that failed and its exception. A crashed run's message is what
ended its process (Prefect's "Execution was aborted by a termination signal.", or the heartbeat
automation's and the worker's own words, cli/heartbeats.py and cli/worker.py); this puts in
front the stage whose task run was running then, which the message cannot know.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

WIDTH = 80  # columns of the terminal a person reads these on
RESUME = "Retry it to resume from its last checkpoint."
# A run `r1 run` started has no deployment, which `prefect flow-run retry` needs.
AGAIN = "Run the same r1 run command again to resume it from its last checkpoint."
# What tasks/resume.py says of a crashed run whose command, run again, resumed it: done with.
RESUMED = "run again resumed it"
# The name of the Cancelled state of a scheduled run that the worker skipped: due while no
# worker took runs, with a later run of its deployment due too (cli/missed_runs.py).
SKIPPED = "Skipped"
# Prefect's own crash messages, each with what happened in the project's words beside it
CRASHES = {
    "Execution was aborted by a termination signal.": (
        "Execution was aborted by a termination signal (its worker stopped, or it was killed)."
    ),
}

# Failures that a retry meets again: it runs the same parameters on the same stores. A bad
# setting or profile, a model or input file that is not there, data or memory that cannot hold
# the stages, a regression the evaluation found, a non-finite loss (same data, same seed).
NOT_FIXED_BY_RETRY = frozenset(
    {
        "ConfigError", "ValidationError", "RegistryError", "MissingInputsError",
        "ProblemFileError", "DataFitError", "PlanSizeError", "MemoryFitError",
        "EvaluationRegression", "NonFiniteLossError", "RayMissingError", "DeepSpeedMissingError",
    }
)  # fmt: skip
ERROR_NAME = re.compile(r"\b([A-Z][A-Za-z0-9]*(?:Error|Regression|Exception|Failure))\b")


def retry_helps(reason: str) -> bool:
    """Whether retrying can end otherwise: not for the errors a retry meets again."""
    found = ERROR_NAME.search(reason)
    return found is None or found.group(1) not in NOT_FIXED_BY_RETRY


def exception_text(message: str) -> str:
    """A state's message without Prefect's preamble: `InjectedFailure: reasoning_rl: ...`."""
    for preamble in (
        "Task run encountered an exception ",
        "Flow run encountered an exception: ",
        "Flow run encountered an exception ",
    ):
        message = message.removeprefix(preamble)
    return message.strip()


def settled(reason: str) -> bool:
    """Whether a crashed run was resumed already, by the same command run again."""
    return RESUMED in reason


def crash_text(message: str, deployed: bool = True) -> str:
    """What ended a crashed run and what to do: Prefect's words explained, and the way to
    resume it (a retry; for a run with no deployment, the same command again) where the message
    does not say it already, nothing where it was resumed."""
    said = CRASHES.get(message, message)
    if settled(said):
        return said
    resume = RESUME if deployed else AGAIN
    if "retry it" in said.lower():
        return said if deployed else said.replace(RESUME, AGAIN)
    return f"{said} {resume}".strip()


def failure_reason(client: Any, flow_run: Any) -> str:
    """`reasoning_rl: InjectedFailure: ...`: the task run that failed and its exception; for a
    crash, `in reasoning_rl: ` and what ended its process; else the flow run's own message."""
    from prefect.client.schemas.objects import StateType

    if flow_run.state.type == StateType.FAILED:
        failed = [t for t in task_runs(client, flow_run) if t.state.type == StateType.FAILED]
        if failed:
            task_run = max(failed, key=lambda t: t.state.timestamp)
            said = exception_text(task_run.state.message or "")
            return f"{task_run.name}: {named_once(task_run.name, said)}"
    message = exception_text(flow_run.state.message or "") or flow_run.state.name
    if flow_run.state.type != StateType.CRASHED:
        return message
    said = crash_text(message, getattr(flow_run, "deployment_id", None) is not None)
    stage = crashed_stage(task_runs(client, flow_run))
    return f"in {stage}: {said}" if stage else said


def named_once(stage: str, said: str) -> str:
    """`InjectedFailure: injected failure at step 2` for an exception whose own message begins
    with the stage's name (`InjectedFailure: reasoning_rl: injected ...`), which the line names
    already; any other text as it is."""
    error, colon, rest = said.partition(": ")
    if colon and ERROR_NAME.fullmatch(error) and rest.startswith(f"{stage}: "):
        return f"{error}: {rest.removeprefix(f'{stage}: ')}"
    return said


def task_runs(client: Any, flow_run: Any) -> list[Any]:
    """The flow run's task runs, every attempt's."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
    )


def crashed_stage(runs: list[Any]) -> str | None:
    """The name of the task run a crash stopped: the last started of those left Running or
    marked Crashed, else the last started; None when none started."""
    started = [t for t in runs if t.start_time is not None and t.state is not None]
    stopped = [t for t in started if t.state.type.value in ("RUNNING", "CRASHED")]
    last = max(stopped or started, key=lambda t: t.start_time, default=None)
    return last.name if last is not None else None


def reason_lines(reason: str, indent: str) -> list[str]:
    """A reason as lines under `indent`, each at most WIDTH columns: a line of its own (a bad
    setting's key) keeps its indentation under the first, a long one wraps at a word."""
    lines = []
    for line in reason.splitlines() or [""]:
        own = indent + line[: len(line) - len(line.lstrip())]
        lines += textwrap.wrap(
            line.strip(),
            WIDTH,
            initial_indent=own,
            subsequent_indent=own,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [own.rstrip()]
    return lines


def run_failure_line(error: BaseException, state_root: Path) -> str:
    """What `r1 run` says last of a run that failed: its error in one line; where a full disk or
    a state folder that cannot be written caused it (said in its chain, or the disk of the state
    folder nearly full now, as when Prefect's own database ran out of space and its server
    answered 500), that instead, naming the folder and its free space (storage/disk.py)."""
    from storage.disk import (
        NEARLY_FULL,
        StateDiskError,
        chain,
        disk_error,
        disk_space,
        full_disk_message,
    )
    from tasks.progress import exception_line

    told = next((link for link in chain(error) if isinstance(link, StateDiskError)), None)
    told = told or disk_error(error, state_root, "")
    if told is not None:
        return f"r1: the run failed: {told}"
    space = disk_space(state_root)
    if space is not None and space.free < NEARLY_FULL:
        full = full_disk_message("", state_root, space)
        return f"r1: the run failed: {full} ({exception_line(error)})"
    return f"r1: the run failed: {exception_line(error)}"

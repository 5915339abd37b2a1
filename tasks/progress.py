"""What a person following a run reads: each log line of a task run names its stage, and a long
stage says where it stands ("stage 6 of 16, step 40 of 200") a few times, not at every step.

Prefect keeps a task run's logs under the flow run, and `prefect flow-run logs`, `prefect
deployment run --watch` (with the server's log stream on, as `scripts/serve.sh` starts it) and
`r1 watch` print them without the task run's name; the formatter puts the name in the message.
"""

from __future__ import annotations

import logging
import sys
import traceback
from dataclasses import dataclass

from prefect import get_run_logger
from prefect.exceptions import MissingContextError
from prefect.logging.handlers import APILogHandler

PROGRESS_EVERY = 0.1  # a progress line each time another tenth of a stage's steps is done


class TaskNamedFormatter(logging.Formatter):
    """`reasoning_rl: Finished in state Completed()`: a task run's record, as the Prefect server
    stores it, starts with the task run's name; a flow run's record is left as it is. A
    traceback keeps the project's own frames and the exception (a task's failure is logged
    twice, by its task run and its flow run, each time through Prefect's engine: forty lines of
    library frames each); the worker's log keeps it whole."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        name = getattr(record, "task_run_name", None)
        if not name or message.startswith(f"{name}: "):
            return message
        return f"{name}: {message}"

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        kind, value, tb = ei
        frames = traceback.extract_tb(tb)
        own = [frame for frame in frames if not library_file(frame.filename)]
        left_out = len(frames) - len(own)
        if not own or not left_out or value is None:
            return super().formatException(ei)
        lines = [f"Traceback (most recent call last; {left_out} library frames left out):\n"]
        lines += traceback.format_list(own)
        lines += traceback.format_exception_only(kind, value)
        if value.__cause__ is not None:
            cause = value.__cause__
            lines += ["caused by: "] + traceback.format_exception_only(type(cause), cause)
        return "".join(lines).rstrip("\n")


def library_file(path: str) -> bool:
    """Whether a traceback frame is an installed library's (or Python's own), not the project's."""
    return "site-packages" in path or path.startswith((sys.prefix, sys.base_prefix, "<"))


def name_task_run_logs() -> None:
    """Give Prefect's API log handlers (one serves flow runs and task runs) the formatter; done
    once per process, before any task runs."""
    loggers = (logging.getLogger("prefect.task_runs"), logging.getLogger("prefect.flow_runs"))
    for handler in {h for logger in loggers for h in logger.handlers}:
        if isinstance(handler, APILogHandler) and not isinstance(
            handler.formatter, TaskNamedFormatter
        ):
            handler.setFormatter(TaskNamedFormatter())


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The task or flow run's logger (its lines reach the Prefect server); outside a run, as in
    a test that calls a task's function, this module's."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def stage_position(stage: str, plan: tuple[str, ...]) -> str:
    """`stage 6 of 16`, or `stage` when the plan does not hold it."""
    if stage in plan:
        return f"stage {plan.index(stage) + 1} of {len(plan)}"
    return "stage"


@dataclass
class ProgressLines:
    """When a stage's progress is worth a line: the first step, each time another `every` of
    the steps is done, and the last."""

    every: float = PROGRESS_EVERY
    _shown: float | None = None

    def due(self, fraction: float) -> bool:
        if self._shown is not None and fraction < 1.0 and fraction - self._shown < self.every:
            return False
        if self._shown is not None and fraction <= self._shown:
            return False
        self._shown = fraction
        return True


def step_text(step: int, fraction: float) -> str:
    """`step 40 of 200 (20%)`: the total from the step and the share of the work it is."""
    if fraction <= 0:
        return f"step {step}"
    total = round(step / fraction)
    return f"step {step} of {total} ({100 * fraction:.0f}%)"

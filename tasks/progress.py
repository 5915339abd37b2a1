"""What a person following a run reads: each log line of a task run names its stage, and a long
stage says where it stands ("stage 6 of 16, step 40 of 200") a few times, not at every step.

Prefect keeps a task run's logs under the flow run, and `prefect flow-run logs`, `prefect
deployment run --watch` (with the server's log stream on, as `scripts/serve.sh` starts it) and
`r1 watch` print them without the task run's name; the formatter puts the name in the message.
"""

from __future__ import annotations

import logging
import sys
import textwrap
import traceback
from collections import OrderedDict
from dataclasses import dataclass

from prefect import get_run_logger
from prefect.exceptions import MissingContextError
from prefect.logging.handlers import APILogHandler

from evaluation.report import LINE_WIDTH

PROGRESS_EVERY = 0.1  # a progress line each time another tenth of a stage's steps is done
SHOWN_EXCEPTIONS = 64  # exceptions a formatter remembers having shown the traceback of
LONG_WORDS = 60  # an exception's message longer than this is cut where it is said again


class TaskNamedFormatter(logging.Formatter):
    """`reasoning_rl: Finished in state Completed()`: a task run's record, as the Prefect server
    stores it, starts with the task run's name; a flow run's record is left as it is.

    A failure is said in full twice: its traceback (the project's own frames and the exception;
    forty lines of Prefect's engine otherwise) with the first record that carries it, and its
    words at the end. A task's failure is logged by its task run, with its final state, by its
    flow run, with the flow run's final state, and once more as the engine exits; in between,
    long words of an exception already shown are cut (`RegistryError: no registered model
    'r1-tiny' (registered: r…`), and a record of the same exception without its words ends with
    them in one line (`Engine execution exited with unexpected exception: RegistryError: ...`),
    the last line a person reads before the run's end."""

    def __init__(self, fmt: str | None = None, width: int | None = None):
        super().__init__(fmt)
        self.width = width  # a message's lines wrap at a space past this many characters
        self._shown: OrderedDict[int, str] = OrderedDict()  # id -> text of exceptions shown
        self._words: OrderedDict[str, None] = OrderedDict()  # their long messages

    def format(self, record: logging.LogRecord) -> str:
        record = self._briefly(record)
        name = getattr(record, "task_run_name", None)
        message = record.getMessage()
        if name and not message.startswith(f"{name}: "):
            message = f"{name}: {message}"
        if self.width:
            message = fitted(message, self.width)
        if message != record.getMessage():
            record = logging.makeLogRecord(record.__dict__)  # the others' record stays as it is
            record.msg, record.args = message, None
        return super().format(record)

    def _briefly(self, record: logging.LogRecord) -> logging.LogRecord:
        """The record, or a copy (the record itself stays as it is, for the other handlers):
        the long words of exceptions shown already cut in its message; and when it carries an
        exception whose traceback was shown, without the traceback, naming the exception."""
        error = record.exc_info[1] if record.exc_info else None
        first = error is not None and self._first_sight(error)
        message = record.getMessage()
        shorter = self._cut(message)
        if error is not None and not first:
            brief = logging.makeLogRecord(record.__dict__)
            brief.exc_info = brief.exc_text = None
            named = str(error) and str(error) in message  # e.g. "...: InjectedFailure('...')"
            brief.msg = shorter if named else f"{shorter}: {exception_line(error)}"
            brief.args = None
            return brief
        if shorter == message:
            return record
        cut = logging.makeLogRecord(record.__dict__)
        cut.msg, cut.args = shorter, None
        return cut

    def _first_sight(self, error: BaseException) -> bool:
        """Whether this formatter sees `error` for the first time (and remembers it)."""
        text = exception_line(error)
        if self._shown.get(id(error)) == text:  # the id alone may be a new exception's
            return False
        self._shown[id(error)] = text
        if len(str(error)) > LONG_WORDS:
            self._words[str(error)] = None
        for remembered in (self._shown, self._words):
            while len(remembered) > SHOWN_EXCEPTIONS:
                remembered.popitem(last=False)
        return True

    def _cut(self, message: str) -> str:
        """The long words of exceptions shown, cut to their first line's start, where they are
        said again: as they are, or escaped in a repr (a bad setting's message, of several
        lines, in `Failed('...: 1 invalid setting(s)\\n  key: ...')`)."""
        for words in self._words:
            short = words.splitlines()[0][: LONG_WORDS - 1] + "…"
            message = message.replace(words, short).replace(repr(words)[1:-1], short)
        return message

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


def fitted(message: str, width: int) -> str:
    """`message` with each line longer than `width` wrapped at spaces, the parts after its
    first indented two more than it; a word longer than the width (a path) stays whole."""
    lines = []
    for line in message.splitlines() or [""]:
        if len(line) <= width:
            lines.append(line)
            continue
        own = line[: len(line) - len(line.lstrip())]
        lines += textwrap.wrap(
            line.strip(),
            width,
            initial_indent=own,
            subsequent_indent=own + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def exception_line(error: BaseException) -> str:
    """`InjectedFailure: reasoning_rl: injected failure at step 2 (faults.fail_once_at)`."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


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
            handler.setFormatter(TaskNamedFormatter(width=LINE_WIDTH))


# As this module loads (every task module imports it, through tasks.stage_cache): a flow whose
# first task is no stage task (the nightly evaluation's `registered-model`) logs through the
# formatter too.
name_task_run_logs()


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

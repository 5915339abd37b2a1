"""`r1 watch FLOW_RUN_ID`: follow a flow run until it ends, a retried one included: its log lines
as they come (each stage's start, its progress every tenth, its end), then how it ended and,
for a failure, which stage failed, why, and the commands that retry it.

`prefect deployment run --watch` prints every event beside the logs (three per task run), and
`prefect flow-run watch` replays a retried run's events from its first attempt and stops at that
attempt's `Failed`. This reads the server's logs of the latest attempt only, every two seconds,
each time those written since the newest line it has, less the time a line may take to reach the
server (`LogCursor`): a run of tens of thousands of lines is not read whole at every poll. A
server that stops answering meanwhile is waited for (cli/outage.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from cli.failures import failure_reason, reason_lines, retry_helps, settled
from cli.outage import CLIENT_RETRIES, Outage, is_unreachable, longest_wait, nap
from cli.runs import NoServer, Served, connect, unreachable

POLL_SECONDS = 2.0
STRAGGLER_SECONDS = 6.0  # a flow run's last lines reach the server as its process exits
PAGE = 200  # logs the server returns at most per request
# How long after it was written a log line may reach the server: Prefect's log handler sends a
# process's lines in batches every 2 s, its last ones as it exits, the worker's from its own
# process. Each poll reads again the lines written this long before the newest one read.
LATE_LOG_SECONDS = 60.0


def attempt_start(client: Any, flow_run_id: UUID) -> datetime | None:
    """When the latest attempt was scheduled (a retry puts the run back in `AwaitingRetry`, a
    scheduled state); None for a run that was never scheduled."""
    from prefect.client.schemas.objects import StateType

    states = client.read_flow_run_states(flow_run_id)
    scheduled = [state.timestamp for state in states if state.type == StateType.SCHEDULED]
    return max(scheduled) if scheduled else None


@dataclass
class LogCursor:
    """Where the next read of a run's logs starts: at the latest attempt's start (`since`; None:
    from the first line), or once lines have been read, `LATE_LOG_SECONDS` before the newest
    of them, so that a line that reaches the server late is still found. `seen` holds the lines
    read within that window, each by id with its time: none is shown twice."""

    since: datetime | None
    newest: datetime | None = None
    seen: dict[Any, datetime] = field(default_factory=dict)

    def start(self) -> datetime | None:
        """The time the next read starts from."""
        if self.newest is None:
            return self.since
        window = self.newest - timedelta(seconds=LATE_LOG_SECONDS)
        return window if self.since is None else max(self.since, window)

    def take(self, logs: list[Any]) -> list[Any]:
        """Those of `logs` not read before, noted as read; forgets the lines the next read no
        longer reaches."""
        found = [log for log in logs if log.id not in self.seen]
        for log in found:
            self.seen[log.id] = log.timestamp
            if self.newest is None or log.timestamp > self.newest:
                self.newest = log.timestamp
        start = self.start()
        if start is not None:
            self.seen = {key: at for key, at in self.seen.items() if at >= start}
        return found


def new_logs(client: Any, flow_run_id: UUID, cursor: LogCursor) -> list[Any]:
    """The run's logs from where `cursor` stands that it has not read yet (and notes them)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp
    from prefect.client.schemas.sorting import LogSort

    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    start = cursor.start()
    if start is not None:
        log_filter.timestamp = LogFilterTimestamp(after_=start)
    found, offset = [], 0
    while True:
        page = client.read_logs(
            log_filter=log_filter, sort=LogSort.TIMESTAMP_ASC, limit=PAGE, offset=offset
        )
        found += page
        offset += len(page)
        if len(page) < PAGE:
            break
    return cursor.take(found)


def log_text(log: Any) -> str:
    """`20:20:31 reasoning_rl: stage 6 of 16, step 1 of 2 (50%)`, further lines indented; a
    line too long for the terminal (Prefect's own, a traceback's) wraps under its indent."""
    when = log.timestamp.astimezone().strftime("%H:%M:%S")
    first, *rest = reason_lines(log.message, " " * (len(when) + 1))
    return "\n".join([f"{when} {first.lstrip()}", *rest])


def follow(
    client: Any,
    flow_run_id: UUID,
    out: Callable[[str], None] = print,
    poll: float = POLL_SECONDS,
    outage: Outage | None = None,
) -> Any:
    """Print the latest attempt's logs until the run is in a final state and its last lines
    are in; returns the flow run as it ended. Each request goes through `outage`: a server away
    for a while is waited for."""
    ask = outage.call if outage is not None else _at_once
    since = ask(lambda: attempt_start(client, flow_run_id))
    cursor = LogCursor(since)
    shown_state = None
    while True:
        run, logs = ask(
            lambda: (
                client.read_flow_run(flow_run_id),
                new_logs(client, flow_run_id, cursor),
            )
        )
        for log in logs:
            out(log_text(log))
        if run.state.name != shown_state:
            shown_state = run.state.name
            out(f"-- {shown_state}")
        if run.state.is_final() and (since is None or run.state.timestamp >= since):
            break
        nap(poll)
    quiet_until = time.monotonic() + straggler_wait(run.state.timestamp)
    while time.monotonic() < quiet_until:
        nap(poll)
        for log in ask(lambda: new_logs(client, flow_run_id, cursor)):
            out(log_text(log))
    return run


def straggler_wait(ended: datetime | None, now: datetime | None = None) -> float:
    """Seconds to keep reading a run's logs after its final state: what is left of
    `STRAGGLER_SECONDS` since it `ended` (none for a run that ended before that, whose process
    is long gone; the whole of it where the server's clock reads ahead of this one)."""
    if ended is None:
        return STRAGGLER_SECONDS
    since = ((now or datetime.now(UTC)) - ended).total_seconds()
    return min(STRAGGLER_SECONDS, max(0.0, STRAGGLER_SECONDS - since))


def _at_once(request: Callable[[], Any]) -> Any:
    return request()


def attempt_seconds(client: Any, run: Any) -> float | None:
    """From the latest attempt's start (its last Running state) to the run's final state."""
    from prefect.client.schemas.objects import StateType

    states = client.read_flow_run_states(run.id)
    running = [state.timestamp for state in states if state.type == StateType.RUNNING]
    if not running or run.state.timestamp is None:
        return None
    return (run.state.timestamp - max(running)).total_seconds()


def ending(client: Any, run: Any, served: Served) -> tuple[list[str], int]:
    """What to say when the run has ended, and the exit status (0 only for Completed)."""
    if run.state.is_completed():
        seconds = attempt_seconds(client, run)
        took = (
            "" if seconds is None else f" (attempt: {seconds // 60:.0f} min {seconds % 60:.0f} s)"
        )
        return [f"flow run {run.id} Completed{took}"], 0
    reason = failure_reason(client, run)
    lines = [f"flow run {run.id} {run.state.name}:", *reason_lines(reason, "  ")]
    if not (run.state.is_failed() or run.state.is_crashed()) or settled(reason):
        return lines, 1
    if not retry_helps(reason):
        lines += [
            "a retry runs the same parameters and would fail the same way: change what the",
            "reason says and start a new run (prefect deployment run ... --param ..., r1 run)",
        ]
        return lines, 1
    if run.deployment_id is None:  # started by `r1 run`: Prefect cannot retry it
        lines += [
            "run the same r1 run command again (finished stages come from the cache; the",
            "failed one resumes from its last checkpoint)",
        ]
        return lines, 1
    lines += [
        "retry it (finished stages come from the cache; the failed one resumes from its",
        "last checkpoint):",
        f"  {served.retry(str(run.id))}",
        f"  {served.watch(str(run.id))}",
    ]
    return lines, 1


def watch_command(state_dir: str | None, flow_run_id: str) -> int:
    try:
        run_id = UUID(flow_run_id)
    except ValueError:
        print(
            f"r1 watch: {flow_run_id!r} is not a flow run id (`r1 runs` lists them)",
            file=sys.stderr,
        )
        return 2
    try:  # the environment's wait, read before anything starts
        longest_wait()
        served = connect(state_dir)
    except (ValueError, NoServer) as err:
        print(f"r1 watch: {err}", file=sys.stderr)
        return 2
    from prefect import get_client
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    try:  # one line for Ctrl-C, wherever it comes
        with (
            temporary_settings({PREFECT_CLIENT_MAX_RETRIES: CLIENT_RETRIES}),
            get_client(sync_client=True) as client,
        ):
            return watch_run(client, run_id, served)
    except KeyboardInterrupt:
        print("r1 watch: stopped following; the flow run goes on")
        return 130


def watch_run(client: Any, run_id: UUID, served: Served) -> int:
    """Follow the run to its end and say how it ended; the exit status (2: no such run, or no
    server at all when the watch starts)."""
    from prefect.exceptions import ObjectNotFound

    try:
        run = client.read_flow_run(run_id)
    except ObjectNotFound:
        print(f"r1 watch: no flow run {run_id} (`r1 runs` lists them)", file=sys.stderr)
        return 2
    except Exception as error:
        if not is_unreachable(error):
            raise
        print(f"r1 watch: {unreachable(served.api_url)}", file=sys.stderr)
        return 2
    say = flush_print
    say(f"flow run {run.id} ({run.name})")
    say("following its latest attempt")
    outage = Outage(served.api_url, say)
    run = follow(client, run_id, say, outage=outage)
    lines, status = outage.call(lambda: ending(client, run, served))
    print("\n".join(lines))
    return status


def flush_print(line: str) -> None:
    """A line out at once, also into a pipe: a watch's reader is waiting for it."""
    print(line, flush=True)

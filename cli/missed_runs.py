"""Scheduled runs missed while no worker polled are skipped, all but the latest of each deployment.

Prefect's scheduler puts a deployment's next runs in the database ahead of their time. A run
whose time passes while no worker polls its pool (the worker stopped for days, the machine
down over a weekend) stays Scheduled, marked Late, and Prefect 3.8.8's worker, once it polls
again, takes every due run and starts them all at once: after five missed nights, five nightly
evaluations of the same model ran side by side on the machine, each as slow as five, and each
appended its own row to the evaluation history. Prefect 3.8.8 has no setting that skips missed
runs (its schedules' `catchup` column was dropped), and a deployment concurrency limit only
queues them (ENQUEUE) or cancels whichever comes second, a manual run included (CANCEL_NEW).

So the worker of `scripts/serve.sh` (cli/worker.py) starts, of a deployment's scheduled runs
that it finds due together, only the latest: the earlier ones, due more than `MISSED_SECONDS`
ago, end Cancelled under the name `Skipped`, their message naming the run that takes their place.
A run started by hand (`prefect deployment run`) is never skipped, nor is a late scheduled run
that is the latest of its deployment (the nightly evaluation runs once, late, on the model the
registry holds now).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from cli.failures import SKIPPED
from cli.late_reports import RetryKeepingWorker

# A scheduled run due longer ago than this, with a later one of its deployment due too, was
# missed; runs due within it are on time (an interval schedule of a few seconds).
MISSED_SECONDS = 60.0


def due_at(flow_run: Any) -> datetime | None:
    """When the run was scheduled to start."""
    details = flow_run.state.state_details if flow_run.state is not None else None
    scheduled = details.scheduled_time if details is not None else None
    return scheduled or flow_run.next_scheduled_start_time or flow_run.expected_start_time


def missed(flow_runs: Sequence[Any], now: datetime) -> dict[Any, Any]:
    """Of `flow_runs` (due now, as a worker gets them), the scheduled runs that a later scheduled
    run of the same deployment takes the place of, each with that run: those due more than
    `MISSED_SECONDS` before `now`."""
    latest: dict[Any, Any] = {}
    for run in flow_runs:
        if not run.auto_scheduled or run.deployment_id is None or due_at(run) is None:
            continue
        kept = latest.get(run.deployment_id)
        if kept is None or due_at(run) > due_at(kept):
            latest[run.deployment_id] = run
    cutoff = now - timedelta(seconds=MISSED_SECONDS)
    return {
        run.id: latest[run.deployment_id]
        for run in flow_runs
        if run.deployment_id in latest
        and run.auto_scheduled
        and run is not latest[run.deployment_id]
        and (due_at(run) or now) < cutoff
    }


def skipped_message(run: Any, instead: Any) -> str:
    when = due_at(run)
    then = due_at(instead)
    return (
        f"Skipped: due {when:%Y-%m-%d %H:%M} UTC while no worker took its pool's runs; the run "
        f"due {then:%Y-%m-%d %H:%M} UTC ({instead.id}) runs in its place"
        if when is not None and then is not None
        else f"Skipped: a later scheduled run of its deployment ({instead.id}) runs in its place"
    )


async def skip_missed(
    client: Any,
    responses: list[Any],
    now: datetime | None = None,
    say: Callable[[str], None] = print,
) -> list[Any]:
    """End the missed runs of `responses` (a worker's due runs) as Skipped, saying so for each,
    and return the rest. A run the server does not let end (taken meanwhile) is kept."""
    from prefect.states import Cancelled

    late = missed([entry.flow_run for entry in responses], now or datetime.now(UTC))
    kept = []
    for entry in responses:
        instead = late.get(entry.flow_run.id)
        if instead is None:
            kept.append(entry)
            continue
        result = await client.set_flow_run_state(
            entry.flow_run.id,
            Cancelled(name=SKIPPED, message=skipped_message(entry.flow_run, instead)),
        )
        if result.status.value != "ACCEPT":
            kept.append(entry)
            continue
        say(f"flow run {entry.flow_run.id}: {skipped_message(entry.flow_run, instead)}")
    return kept


# The subclass takes the key "process" in Prefect's registry of worker types, as its parent does.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Type 'MissedRunsWorker'", UserWarning)

    class MissedRunsWorker(RetryKeepingWorker):
        """The project's process worker (cli/late_reports.py) that skips the scheduled runs it
        finds missed, all but the latest of each deployment."""

        async def _get_scheduled_flow_runs(self) -> list[Any]:
            due = await super()._get_scheduled_flow_runs()
            return await skip_missed(self.client, due, say=self._logger.info)

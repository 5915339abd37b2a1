"""`r1 runs` lists the runs newest first by the time its column shows, on a real Prefect server:
a nightly run that the worker took days after its time is listed where it started. Before, the
list was in order of when each run was due, while the column showed when it started: a run
started today, due five days ago, came below days of later runs (off a 15-line list) and the
column read 00:13, 00:07, 00:06, 00:19, 00:09."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prefect import flow, get_client
from prefect.states import Completed, Running, Scheduled

from cli.runs import run_lines

pytestmark = pytest.mark.usefixtures("prefect_server")


@flow(name="evaluate-model")
def nightly() -> None:
    """A flow of the nightly evaluation's name: its runs are made here, never run."""


def test_runs_are_listed_by_when_they_started_newest_first():
    now = datetime.now(UTC)
    with get_client(sync_client=True) as client:
        made = {}
        # due and started, one after the other; the last one due five days ago, started last
        for name, due in (("on time", now - timedelta(hours=2)), ("late", now - timedelta(days=5))):
            run = client.create_flow_run(nightly, name=name, state=Scheduled(scheduled_time=due))
            client.set_flow_run_state(run.id, Running())
            client.set_flow_run_state(run.id, Completed())
            made[name] = str(run.id)
        lines = run_lines(client, [], 15)

    listed = [line.id for line in lines if line.id in made.values()]
    assert listed == [made["late"], made["on time"]]
    starts = [line.started for line in lines]
    assert starts == sorted(starts, reverse=True)

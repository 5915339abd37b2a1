"""The stack's worker, back after days away, on a real Prefect server: of the nightly runs that
the schedule made meanwhile, it starts only the latest and ends the others Skipped, naming the
run that takes their place (and `r1 runs` says so under each); a run started by hand is never
skipped. Before, Prefect's worker
took every due run at once: five missed nights were five evaluations of the same model started
together on the machine."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from prefect import flow, get_client
from prefect.client.schemas.actions import DeploymentScheduleCreate, WorkPoolCreate
from prefect.client.schemas.schedules import CronSchedule
from prefect.states import Scheduled

from cli.failures import SKIPPED
from cli.runs import Served, next_steps, run_lines
from cli.worker import pool_worker
from tests.operations.stack import ROOT

pytestmark = pytest.mark.usefixtures("prefect_server")

POOL = "r1-missed"
NIGHTS = 5


@flow(name="evaluate-model")
def nightly() -> None:
    """A flow of the nightly evaluation's name: its runs are made here, never run."""


async def missed_nights() -> tuple[list, object]:
    """A nightly deployment whose schedule ran on for `NIGHTS` nights with no worker, and a run
    started by hand meanwhile: the due runs, oldest first, and the one by hand."""
    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        flow_id = await client.create_flow(nightly)
        deployment_id = await client.create_deployment(
            flow_id,
            "final-nightly",
            work_pool_name=POOL,
            entrypoint="flows/evaluate_registered.py:evaluate_registered",
            schedules=[
                DeploymentScheduleCreate(schedule=CronSchedule(cron="0 3 * * *", timezone="UTC"))
            ],
        )
        now = datetime.now(UTC)
        # what Prefect's scheduler made for those nights (its own call, as for a backfill)
        await client._client.post(
            f"/deployments/{deployment_id}/schedule",
            json={
                "start_time": (now - timedelta(days=NIGHTS)).isoformat(),
                "end_time": (now - timedelta(minutes=5)).isoformat(),
                "min_runs": 50,  # every night up to end_time
                "max_runs": 50,
            },
        )
        by_hand = await client.create_flow_run_from_deployment(
            deployment_id, state=Scheduled(scheduled_time=now - timedelta(days=2))
        )
        runs = await client.read_flow_runs()
        scheduled = sorted(
            (run for run in runs if run.auto_scheduled and run.state.is_scheduled()),
            key=lambda run: run.next_scheduled_start_time,
        )
        due = [run for run in scheduled if run.next_scheduled_start_time < now]
    return due, by_hand


async def taken_and_states(due: list) -> tuple[list, dict]:
    async with pool_worker(POOL) as worker:  # the worker scripts/serve.sh runs
        taken = await worker._get_scheduled_flow_runs()
    async with get_client() as client:
        states = {run.id: (await client.read_flow_run(run.id)).state for run in due}
    return taken, states


def listed(ids: set) -> list:
    """`r1 runs`' lines of the runs `ids`."""
    with get_client(sync_client=True) as client:
        return [line for line in run_lines(client, [], 15) if line.id in ids]


def test_a_worker_back_after_missed_nights_starts_only_the_latest():
    due, by_hand = asyncio.run(missed_nights())
    assert len(due) == NIGHTS
    taken, states = asyncio.run(taken_and_states(due))

    latest = due[-1]
    assert {entry.flow_run.id for entry in taken} == {latest.id, by_hand.id}
    assert states[latest.id].is_scheduled()
    for run in due[:-1]:
        state = states[run.id]
        assert state.is_cancelled() and state.name == SKIPPED, state
        assert state.message.startswith("Skipped: due ") and str(latest.id) in state.message

    lines = listed({str(run.id) for run in due[:-1]})
    assert [line.state for line in lines] == [SKIPPED] * (NIGHTS - 1)
    for line in lines:
        said = " ".join(part.strip() for part in line.lines()[1:])
        assert said.startswith("deployment evaluate-model/final-nightly due "), said
        assert "while no worker took its pool's runs" in said and str(latest.id) in said
    assert next_steps(lines, Served("http://127.0.0.1:4200/api", ROOT / "state")) == []

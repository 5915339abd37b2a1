"""The worker's second report of a crash (cli/late_reports.py), against a real Prefect server:
a run retried before it stays retried, and a run nobody marked still ends Crashed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from prefect.client.schemas.objects import StateType

from cli.late_reports import RetryKeepingWorker, retried_since

T0 = datetime(2026, 12, 8, tzinfo=UTC)


def states(*kinds: str) -> list[SimpleNamespace]:
    """States one second apart from T0 + 1 s, in the order given (shuffled: the function sorts)."""
    made = [
        SimpleNamespace(type=StateType[kind], timestamp=T0 + timedelta(seconds=i + 1))
        for i, kind in enumerate(kinds)
    ]
    return made[1::2] + made[::2]


def test_a_schedule_after_the_attempt_ended_is_a_retry():
    assert retried_since(states("PENDING", "RUNNING", "CRASHED", "SCHEDULED"), T0)
    assert retried_since(states("PENDING", "RUNNING", "CRASHED", "SCHEDULED", "RUNNING"), T0)
    assert retried_since(states("RUNNING", "FAILED", "SCHEDULED", "COMPLETED"), T0)


def test_no_retry_without_an_ending_then_a_schedule_after_the_worker_took_the_run():
    assert not retried_since(states("PENDING", "RUNNING", "CRASHED"), T0)
    assert not retried_since(states("PENDING", "RUNNING"), T0)  # killed before it was marked
    assert not retried_since(states("SCHEDULED", "PENDING", "RUNNING"), T0)
    assert not retried_since([], T0)
    # an earlier attempt's crash and retry, before the worker took this attempt
    earlier = states("RUNNING", "CRASHED", "SCHEDULED", "PENDING", "RUNNING")
    assert retried_since(earlier, T0)
    assert not retried_since(earlier, T0 + timedelta(seconds=3))


@pytest.fixture
def flow_run(prefect_server):
    """A flow run as the worker took it (Scheduled), then Pending and Running; the client."""
    from prefect import flow, get_client
    from prefect.states import Pending, Running, Scheduled

    @flow
    def noop() -> None:
        pass

    async def make():
        async with get_client() as client:
            run = await client.create_flow_run(noop, state=Scheduled())
            taken = await client.read_flow_run(run.id)
            for state in (Pending(), Running()):
                await client.set_flow_run_state(run.id, state)
            return taken

    return asyncio.run(make())


def late_report(flow_run, *then) -> StateType:
    """Set the run's states `then` (forced, as `prefect flow-run retry` does), make the worker's
    report of the crash the run was taken for, and return the state the run is left in."""
    from prefect import get_client

    async def report() -> StateType:
        async with get_client() as client:
            for state in then:
                await client.set_flow_run_state(flow_run.id, state, force=True)
            worker = RetryKeepingWorker(work_pool_name="late-reports")
            await worker._propose_crashed_state(flow_run, "exit -9", client=client)
            return (await client.read_flow_run(flow_run.id)).state.type

    return asyncio.run(report())


def test_a_retry_sent_before_the_workers_report_is_kept(flow_run):
    from prefect.states import Crashed, Scheduled

    retry = Scheduled(message="Retried via CLI")  # what `prefect flow-run retry` sets
    assert late_report(flow_run, Crashed(message="killed"), retry) == StateType.SCHEDULED


def test_a_retry_already_running_again_is_kept(flow_run):
    from prefect.states import Crashed, Pending, Running, Scheduled

    again = (Crashed(message="killed"), Scheduled(message="Retried via CLI"), Pending(), Running())
    assert late_report(flow_run, *again) == StateType.RUNNING


def test_a_run_left_running_by_its_killed_process_is_reported_crashed(flow_run):
    assert late_report(flow_run) == StateType.CRASHED

"""The worker's second report of a crash (cli/late_reports.py), against a real Prefect server:
a run retried before it stays retried, and a run nobody marked still ends Crashed."""

from __future__ import annotations

import asyncio
import uuid
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


# ---- through the worker's own path, against a real Prefect server -----------------------------


def attempt(killed: tuple = (), meanwhile: tuple = (), before: tuple = ()) -> StateType:
    """A deployment's flow run (with `before` set on it first: an earlier attempt) taken by
    the worker in one poll (`get_and_submit_flow_runs`, what its `start` loops on) and run by a
    stand-in for the process worker's `run` that does what Prefect's runner does to a process
    killed mid-run: Running, then the states `killed` (the runner's Crashed, which it may fail
    to set), then the states `meanwhile` (set while the crash hook runs: a user's retry, the
    worker taking the retry) before it returns the process's exit status, -9, to the worker,
    whose late report follows. The state the run is left in."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.states import Running
    from prefect.workers.process import ProcessWorkerResult

    pool = f"late-{uuid.uuid4().hex[:8]}"

    async def run() -> StateType:
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            flow_id = await client.create_flow_from_name("late-report")
            deployment = await client.create_deployment(
                flow_id=flow_id, name=pool, work_pool_name=pool
            )
            made = await client.create_flow_run_from_deployment(deployment)
            for state in before:
                await client.set_flow_run_state(made.id, state, force=True)
        worker = RetryKeepingWorker(work_pool_name=pool)

        async def killed_process(flow_run, configuration, task_status=None):
            if task_status is not None:
                task_status.started(4242)
            for state in (Running(), *killed, *meanwhile):
                await worker.client.set_flow_run_state(flow_run.id, state, force=True)
            return ProcessWorkerResult(status_code=-9, identifier="4242")

        worker.run = killed_process
        async with worker:
            await worker.sync_with_backend()
            (taken,) = await worker.get_and_submit_flow_runs()  # one poll, as `start` polls
        assert taken.id == made.id
        async with get_client() as client:
            return (await client.read_flow_run(made.id)).state.type

    return asyncio.run(run())


def crashed() -> tuple:
    from prefect.states import Crashed

    return (Crashed(message="Process exited with status code: -9."),)


def retry() -> tuple:
    from prefect.states import Scheduled

    return (Scheduled(message="Retried via CLI"),)  # what `prefect flow-run retry` sets


pytestmark = pytest.mark.usefixtures("prefect_server")


def test_a_retry_sent_before_the_workers_report_is_kept():
    assert attempt(killed=crashed(), meanwhile=retry()) == StateType.SCHEDULED


def test_a_retry_already_running_again_is_kept():
    from prefect.states import Pending, Running

    again = (*retry(), Pending(), Running())
    assert attempt(killed=crashed(), meanwhile=again) == StateType.RUNNING


def test_a_crash_with_no_retry_is_reported():
    assert attempt(killed=crashed()) == StateType.CRASHED


def test_an_attempt_its_runner_left_running_is_reported_crashed_after_an_earlier_retry():
    """The run crashed and was retried once before this attempt, whose process died with no
    Crashed set by the runner: the late report is what ends it."""
    from prefect.states import Running

    assert attempt(before=(Running(), *crashed(), *retry())) == StateType.CRASHED

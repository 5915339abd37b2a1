"""The worker's start: the runs of its pool left Running or Cancelling with no process on this
machine are the ones it ends, each in the state that fits."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

from cli.worker import QUERY_SECONDS, live_flow_run_ids, orphan_message, orphans


def test_orphans_are_the_running_and_cancelling_runs_without_a_process():
    runs = [
        ("a", "RUNNING"),  # its process is alive: left alone
        ("b", "RUNNING"),  # gone: Crashed
        ("c", "CANCELLING"),  # gone while cancelling: Cancelled, what was asked
        ("d", "COMPLETED"),  # ended: never touched
        ("e", "PENDING"),  # not started: the worker will start it
        ("f", "CANCELLING"),  # alive: its worker stops it
    ]
    assert orphans(runs, alive={"a", "f"}) == [("b", "CRASHED"), ("c", "CANCELLED")]
    assert orphans(runs, alive={"a", "b", "c", "f"}) == []
    assert orphans([], alive=set()) == []


def test_a_process_that_carries_a_flow_run_id_is_seen_alive_and_one_that_ended_is_not():
    run_id = str(uuid.uuid4())
    env = {**os.environ, "PREFECT__FLOW_RUN_ID": run_id}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        assert run_id in live_flow_run_ids()
    finally:
        child.kill()
        child.wait()
    assert run_id not in live_flow_run_ids()


def test_the_messages_say_why_and_what_to_do():
    assert "Retry it to resume" in orphan_message("r1-local", "CRASHED")
    assert "nothing was left to stop" in orphan_message("r1-local", "CANCELLED")


class Polling:
    """The worker (cli/worker.py `pool_worker`) where it starts polling: the interval it polls at
    (Prefect's polling loop reads the setting there)."""

    seen: list[float] = []

    def __init__(self, work_pool_name: str):
        self.name = work_pool_name

    async def start(self) -> None:
        from prefect.settings import PREFECT_WORKER_QUERY_SECONDS

        Polling.seen.append(PREFECT_WORKER_QUERY_SECONDS.value())


def polling_interval(monkeypatch) -> float:
    import cli.worker

    async def no_orphans(pool: str) -> list[str]:
        return []

    monkeypatch.setattr(cli.worker, "end_orphaned_runs", no_orphans)
    monkeypatch.setattr(cli.worker, "pool_worker", Polling)
    monkeypatch.setattr(Polling, "seen", [])
    asyncio.run(cli.worker.serve("pool", grace=1.0))
    (seen,) = Polling.seen
    return seen


def test_the_worker_asks_for_runs_every_2_s(monkeypatch):
    from cli.worker import query_interval_set

    assert not query_interval_set(), "this test needs PREFECT_WORKER_QUERY_SECONDS unset"
    assert polling_interval(monkeypatch) == QUERY_SECONDS == 2.0


def test_an_interval_set_in_the_environment_is_kept(monkeypatch):
    from prefect.settings import PREFECT_WORKER_QUERY_SECONDS, temporary_settings

    monkeypatch.setenv("PREFECT_WORKER_QUERY_SECONDS", "7")
    with temporary_settings({PREFECT_WORKER_QUERY_SECONDS: 7.0}):  # as Prefect read it
        assert polling_interval(monkeypatch) == 7.0


def test_an_interval_set_in_a_prefect_profile_is_kept(monkeypatch):
    """Set in the active profile (profiles.toml under PREFECT_HOME) or a .env file, not in the
    environment: the 2 s default must not replace it."""
    from prefect.context import use_profile
    from prefect.settings import PREFECT_WORKER_QUERY_SECONDS, Profile

    monkeypatch.delenv("PREFECT_WORKER_QUERY_SECONDS", raising=False)
    profile = Profile(name="user", settings={PREFECT_WORKER_QUERY_SECONDS: 4.0})
    with use_profile(profile, include_current_context=False):
        assert polling_interval(monkeypatch) == 4.0

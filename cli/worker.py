"""A Prefect process worker that stops when it is told to, and ends its flow runs as Crashed
when it stops: `python -m cli.worker --pool r1-local` (what `scripts/serve.sh` starts).

`prefect worker start` (Prefect 3.8.8) turns its first SIGTERM into a SIGINT to itself, which an
idle worker swallows: it goes on polling, and only a second SIGTERM ends it, by the SIGKILL the
worker sends itself (checked here: still running 40 s after the first). This runs the same
`ProcessWorker` (whose late report of a crash leaves a retried run alone: cli/late_reports.py;
which skips the scheduled runs missed while it was away, all but the latest of each deployment:
cli/missed_runs.py) and, on the first SIGTERM or SIGINT, stops polling, closes its client and
exits.

A flow run that the worker started is a process in a session of its own (Prefect isolates it), so
a signal to the worker's session does not reach it, and cancelling the worker's task group kills
it with SIGKILL: its state stays Running for ever. So before it exits, the worker sends SIGTERM
to each of its flow-run processes and waits for them (up to `--grace` seconds): Prefect's engine
turns that SIGTERM into the state Crashed ("Execution was aborted by a termination signal"),
which `r1 runs` lists and `prefect flow-run retry` resumes from the last checkpoint. A process
still there after the grace gets SIGKILL, with everything in its session; the heartbeat
automation (cli/heartbeats.py) then marks its run Crashed, as it does for a worker that was
killed outright while the server stayed up.

When it starts, before it polls, the worker ends the runs of its pool that are Running (or
Cancelling) with no process on this machine: their worker, and with it their process, was killed
or their machine went down, while nobody could report it. They end Crashed (Cancelled if
cancelling), at once, whatever the server did while it was down: Prefect's heartbeat automation
cannot be relied on across a server restart, as the server deletes the windows that expired more
than a minute before it started (`PREFECT_SERVER_EVENTS_EXPIRED_BUCKET_BUFFER`) without firing
them. One worker serves a pool (`scripts/serve.sh` starts one per stack): a run of the pool that
is alive on another machine would be taken for gone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from typing import Any

import psutil

from host.threads import settle_process

FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"  # what Prefect puts in a flow-run process's environment
READY = "worker ready: runs left without a process are ended; polling pool"
GRACE_SECONDS = 20.0  # under scripts/serve.sh's R1_STOP_SECONDS (30), after which it kills
# how often it asks the server for runs to start, where the user's PREFECT_WORKER_QUERY_SECONDS
# (environment, .env or Prefect profile) does not say: a run waited up to Prefect's 10 s for its
# local worker; a request every 2 s costs little
QUERY_SECONDS = 2.0


def flow_run_processes() -> list[psutil.Process]:
    """The flow-run processes this worker started: its children that Prefect gave a flow run id."""
    found = []
    for child in psutil.Process().children():
        try:
            if FLOW_RUN_ENV in child.environ():
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def end_flow_runs(grace: float) -> list[str]:
    """SIGTERM to each flow run of this worker, then up to `grace` seconds for them to report
    Crashed and exit; SIGKILL to the session of any still there. Says what it did, per run."""
    processes = flow_run_processes()
    said = []
    for process in processes:
        try:
            run_id = process.environ().get(FLOW_RUN_ENV, "?")
            process.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        said.append(f"worker stopping: sent SIGTERM to flow run {run_id} (pid {process.pid})")
    for process in still_running(processes, grace):
        said.append(f"worker stopping: flow run process {process.pid} still there, killed")
        kill_session(process.pid)
    return said


def still_running(processes: list[psutil.Process], grace: float) -> list[psutil.Process]:
    """Those of `processes` still running after up to `grace` seconds. Waits without reaping
    them: the worker's own child watcher collects their exit status."""
    deadline = time.monotonic() + grace
    while True:
        alive = [p for p in processes if running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_session(leader: int) -> None:
    """SIGKILL to every process of the session `leader` leads (the flow run and its children)."""
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == leader:
                process.kill()
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue


ENDING = {"RUNNING": "CRASHED", "CANCELLING": "CANCELLED"}  # a state with no process -> its end


def live_flow_run_ids() -> set[str]:
    """The flow runs that have a process on this machine (those whose environment we may read:
    the stack runs as one user)."""
    alive = set()
    for process in psutil.process_iter():
        try:
            run_id = process.environ().get(FLOW_RUN_ENV)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if run_id:
            alive.add(run_id)
    return alive


def orphans(runs: list[tuple[str, str]], alive: set[str]) -> list[tuple[str, str]]:
    """Of `runs` ((id, state type)), those Running or Cancelling with no process alive, each
    with the state it ends in."""
    return [(run, ENDING[state]) for run, state in runs if state in ENDING and run not in alive]


def orphan_message(pool: str, ending: str) -> str:
    if ending == "CANCELLED":
        return (
            f"Cancelled: the worker of pool {pool!r} found no process for it when it started, "
            "so nothing was left to stop."
        )
    return (
        f"Its process is gone: the worker of pool {pool!r} found no process for it when it "
        "started (its machine went down, or its worker and it were killed). Retry it to resume "
        "from its last checkpoint."
    )


async def end_orphaned_runs(pool: str) -> list[str]:
    """End the runs of `pool` left Running or Cancelling with no process on this machine; says
    what it did, per run."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Crashed

    states = FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.CANCELLING])
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=states)),
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])),
        )
        found = [(str(run.id), run.state.type.value) for run in runs if run.state is not None]
        said = []
        for run_id, ending in orphans(found, await asyncio.to_thread(live_flow_run_ids)):
            make = Cancelled if ending == "CANCELLED" else Crashed
            result = await client.set_flow_run_state(
                run_id, make(message=orphan_message(pool, ending))
            )
            done = "ended" if result.status.value == "ACCEPT" else "could not be ended"
            said.append(
                f"worker starting: flow run {run_id} had no process left: {done} {ending.title()}"
            )
    return said


def query_interval_set() -> bool:
    """Whether the user set the worker's query interval, in any place Prefect reads settings."""
    from prefect.settings import get_current_settings

    return "query_seconds" in get_current_settings().worker.model_fields_set


def pool_worker(pool: str) -> Any:
    """The worker that serves `pool`: Prefect's process worker that leaves a retried run alone
    (cli/late_reports.py) and skips the scheduled runs missed while none polled, all but the
    latest of each deployment (cli/missed_runs.py)."""
    from cli.missed_runs import MissedRunsWorker

    return MissedRunsWorker(work_pool_name=pool)


async def serve(pool: str, grace: float) -> None:
    """Poll `pool` for flow runs until a SIGTERM or SIGINT arrives; then end the flow runs this
    worker started (they end Crashed) and stop."""
    from prefect.settings import PREFECT_WORKER_QUERY_SECONDS, temporary_settings

    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    stopping: list[asyncio.Task] = []

    async def stop() -> None:
        for line in await asyncio.to_thread(end_flow_runs, grace):
            print(line, flush=True)
        main.cancel()

    def on_signal() -> None:
        if not stopping:  # a second signal while the runs end changes nothing
            stopping.append(loop.create_task(stop()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    for line in await end_orphaned_runs(pool):
        print(line, flush=True)
    print(f"{READY} {pool}", flush=True)  # scripts/serve.sh waits for this line
    worker = pool_worker(pool)
    query = {} if query_interval_set() else {PREFECT_WORKER_QUERY_SECONDS: QUERY_SECONDS}
    try:
        with temporary_settings(query):
            await worker.start()
    except asyncio.CancelledError:
        print(f"worker {worker.name!r} stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.worker", description=__doc__)
    parser.add_argument("--pool", required=True, help="the process work pool to take runs from")
    parser.add_argument(
        "--grace",
        type=float,
        default=GRACE_SECONDS,
        help="seconds a flow run gets to report Crashed after SIGTERM when the worker stops "
        f"(default {GRACE_SECONDS:.0f})",
    )
    args = parser.parse_args(argv)
    settle_process()  # the flow-run processes it starts inherit its environment
    asyncio.run(serve(args.pool, args.grace))
    return 0


if __name__ == "__main__":
    sys.exit(main())

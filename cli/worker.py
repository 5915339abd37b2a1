"""A Prefect process worker that stops when it is told to, and ends its flow runs as Crashed
when it stops: `python -m cli.worker --pool r1-local` (what `scripts/serve.sh` starts).

`prefect worker start` (Prefect 3.8.8) turns its first SIGTERM into a SIGINT to itself, which an
idle worker swallows: it goes on polling, and only a second SIGTERM ends it, by the SIGKILL the
worker sends itself (checked here: still running 40 s after the first). This runs the same
`ProcessWorker` and, on the first SIGTERM or SIGINT, stops polling, closes its client and exits.

A flow run that the worker started is a process in a session of its own (Prefect isolates it), so
a signal to the worker's session does not reach it, and cancelling the worker's task group kills
it with SIGKILL: its state stays Running for ever. So before it exits, the worker sends SIGTERM
to each of its flow-run processes and waits for them (up to `--grace` seconds): Prefect's engine
turns that SIGTERM into the state Crashed ("Execution was aborted by a termination signal"),
which `r1 runs` lists and `prefect flow-run retry` resumes from the last checkpoint. A process
still there after the grace gets SIGKILL, with everything in its session; the heartbeat
automation (cli/heartbeats.py) then marks its run Crashed, as it does for a worker that was
killed outright or a machine that went down.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time

import psutil

GRACE_SECONDS = 20.0  # under scripts/serve.sh's R1_STOP_SECONDS (30), after which it kills


def flow_run_processes() -> list[psutil.Process]:
    """The flow-run processes this worker started: its children that Prefect gave a flow run id."""
    found = []
    for child in psutil.Process().children():
        try:
            if "PREFECT__FLOW_RUN_ID" in child.environ():
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
            run_id = process.environ().get("PREFECT__FLOW_RUN_ID", "?")
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


async def serve(pool: str, grace: float) -> None:
    """Poll `pool` for flow runs until a SIGTERM or SIGINT arrives; then end the flow runs this
    worker started (they end Crashed) and stop."""
    from prefect.workers.process import ProcessWorker

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
    worker = ProcessWorker(work_pool_name=pool)
    try:
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
    asyncio.run(serve(args.pool, args.grace))
    return 0


if __name__ == "__main__":
    sys.exit(main())

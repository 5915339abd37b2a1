"""A Prefect process worker that stops when it is told to: `python -m cli.worker --pool r1-local`
(what `scripts/serve.sh` starts).

`prefect worker start` (Prefect 3.8.8) turns its first SIGTERM into a SIGINT to itself, which an
idle worker swallows: it goes on polling, and only a second SIGTERM ends it, by the SIGKILL the
worker sends itself (checked here: still running 40 s after the first). This runs the same
`ProcessWorker` and, on the first SIGTERM or SIGINT, cancels it: it stops polling, closes its
client and exits within seconds. A flow run it started is a process of its own; `serve.sh stop`
signals the worker's whole process group, flow runs included.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys


async def serve(pool: str) -> None:
    """Poll `pool` for flow runs until a SIGTERM or SIGINT arrives."""
    from prefect.workers.process import ProcessWorker

    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)
    worker = ProcessWorker(work_pool_name=pool)
    try:
        await worker.start()
    except asyncio.CancelledError:
        print(f"worker {worker.name!r} stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.worker", description=__doc__)
    parser.add_argument("--pool", required=True, help="the process work pool to take runs from")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.pool))
    return 0


if __name__ == "__main__":
    sys.exit(main())

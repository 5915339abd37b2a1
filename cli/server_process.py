"""Prefect's temporary server for `r1 run`, in a process group of its own and ending with the run.

Prefect starts its temporary server as a plain child, in the process group of the command that
started it. A signal to that group (Ctrl-C in a terminal, `timeout`, a scheduler stopping a job)
then reaches the server as well as `r1 run`: the server stops at once while the run is still
marking its flow run crashed and closing its MLflow runs, and Prefect's client retries the dead
server for minutes before the run can exit (under `timeout 14 r1 run --profile micro`, still
there when `timeout` killed it 90 s later), its flow run left RUNNING. Here the server has a
session of its own, so such a signal reaches only `r1 run`, which reports through the
still-running server and stops it at exit (Prefect's exit handler).

A session of its own would outlive a run killed outright (SIGKILL, an out-of-memory kill), which
no exit handler sees; so the server watches the process that started it and stops itself when
that process is gone.

`python -m cli.server_process PARENT_PID UVICORN_ARGS...` is that server: uvicorn's command line,
as `python -m uvicorn` runs it, with the watch beside it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from itertools import chain
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings

WATCH_PERIOD_S = 0.5  # how often the server looks for the process that started it
STOP_GRACE_S = 10.0  # then how long uvicorn has to stop before it is killed


class OwnGroupServer(SubprocessASGIServer):
    """Prefect's `SubprocessASGIServer`, with the same command, environment and life cycle, its
    process in a session of its own and watching this one. The flow's client finds this instance
    (Prefect keeps one per port, in the base class's table), started before the flow runs."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        # Prefect 3's own arguments and environment (tests/cli/test_server_process.py holds them
        # equal to the installed Prefect's), uvicorn run through `main` below
        server_env = {
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        options = {
            "--app-dir": str(prefect.__module_path__.parent),
            "--factory": "prefect.server.api.server:create_app",
            "--host": "127.0.0.1",
            "--port": str(self.port),
            "--log-level": "error",
            "--lifespan": "on",
        }
        return subprocess.Popen(
            args=[sys.executable, "-m", __name__, str(os.getpid()), *chain(*options.items())],
            env={
                **os.environ,
                **server_env,
                **get_current_settings().to_environment_variables(exclude_unset=True),
            },
            start_new_session=True,
        )


def stop_when_orphaned(parent: int, period_s: float = WATCH_PERIOD_S) -> None:
    """Block until `parent` is no longer this process's parent (it ended, however it ended: this
    process is then adopted by another), then SIGTERM this process, which uvicorn takes as its
    stop; SIGKILL if it has not stopped `STOP_GRACE_S` later."""
    while os.getppid() == parent:
        time.sleep(period_s)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    """Run uvicorn with `argv[1:]`, as `python -m uvicorn` does, stopping when process `argv[0]`
    is gone."""
    import uvicorn

    parent, uvicorn_args = int(argv[0]), argv[1:]
    watch = threading.Thread(target=stop_when_orphaned, args=(parent,), daemon=True)
    watch.start()
    sys.argv = ["uvicorn", *uvicorn_args]
    uvicorn.main()


if __name__ == "__main__":
    main(sys.argv[1:])

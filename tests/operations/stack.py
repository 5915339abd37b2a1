"""The served stack as the operations tests drive it: `scripts/serve.sh` on free loopback ports
with a state folder of its own, and the commands a user types against it (`prefect`, `r1`), each
in a fresh process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Stack:
    """A stack's state folder and the environment its commands run in."""

    state: Path
    env: dict

    def serve(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return serve_sh(self.env, *args, timeout=timeout)

    def pid(self, component: str) -> int:
        return int((self.state / "pids" / component).read_text())


def serve_sh(env: dict, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`bash scripts/serve.sh ARGS` at the project's root, in `env`."""
    return subprocess.run(
        ["bash", "scripts/serve.sh", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def served_stack(state: Path, **settings: str) -> Iterator[Stack]:
    """A stack started by the documented script in `state` (on free ports, with `settings` in
    its environment), stopped by it at the end."""
    served = Stack(state, stack_environment(state, **settings))
    started = served.serve("start")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield served
    finally:
        served.serve("stop")


def stack_environment(state: Path, **extra: str) -> dict:
    """The environment of a stack on free ports, its state in `state`, at 80 columns."""
    port = free_port()
    env = os.environ | {
        "R1_STATE_DIR": str(state),
        "R1_PREFECT_PORT": str(port),
        "R1_MLFLOW_PORT": str(free_port()),
        "COLUMNS": "80",  # what a terminal of 80 columns gives the commands
        "R1_VENV": str(VENV_BIN.parent),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_HOME": str(state / "prefect"),
        **extra,
    }
    env.pop("TQDM_DISABLE", None)
    return env


def prefect(env: dict, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return command(env, "prefect", *args, timeout=timeout)


def r1(env: dict, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return command(env, "r1", *args, timeout=timeout)


def command(env: dict, name: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def flow_run_id(output: str) -> str:
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", output)
    assert match, output
    return match.group(1)


def flow_run_json(env: dict, run_id: str, expression: str) -> Any:
    """`expression` of the flow run `run` (read from the stack's server by a fresh interpreter),
    as JSON."""
    code = (
        "import json, sys\n"
        "from prefect import get_client\n"
        "with get_client(sync_client=True) as c:\n"
        "    run = c.read_flow_run(sys.argv[1])\n"
        f"print(json.dumps({expression}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, run_id], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def run_state(env: dict, run_id: str) -> tuple[str, str]:
    """The flow run's state type and message."""
    kind, message = flow_run_json(env, run_id, "[run.state.type.value, run.state.message or '']")
    return kind, message


def wait_for_end(env: dict, run_id: str, timeout: int = 900) -> str:
    """The flow run's final state type, polled from the server by a fresh interpreter."""
    code = (
        "import sys, time\n"
        "from prefect import get_client\n"
        "deadline = time.time() + float(sys.argv[2])\n"
        "time.sleep(2)\n"
        "while time.time() < deadline:\n"
        "    with get_client(sync_client=True) as c:\n"
        "        state = c.read_flow_run(sys.argv[1]).state\n"
        "    if state.is_final():\n"
        "        print(state.type.value)\n"
        "        sys.exit(0)\n"
        "    time.sleep(2)\n"
        "print('TIMEOUT')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, run_id, str(timeout)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def wait_for_log(env: dict, run_id: str, text: str, timeout: int = 300) -> str:
    """The flow run's logs (`prefect flow-run logs`) once they hold `text`."""
    deadline = time.monotonic() + timeout
    while True:
        logs = prefect(env, "flow-run", "logs", run_id).stdout
        if text in logs:
            return logs
        assert time.monotonic() < deadline, f"no {text!r} in the logs of {run_id}: {logs[-3000:]}"
        time.sleep(2)


def task_runs(env: dict, run_id: str) -> list:
    """The flow run's task runs, read from the server by a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from prefect import get_client\n"
        "from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId\n"
        "with get_client(sync_client=True) as c:\n"
        "    runs = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId("
        "any_=[sys.argv[1]])))\n"
        "print(json.dumps([[r.name, r.state.type.value, r.state.name, r.start_time is not None]"
        " for r in runs]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, run_id], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def session_of(process: psutil.Process) -> int | None:
    try:
        return os.getsid(process.pid)
    except (ProcessLookupError, PermissionError):
        return None


def flow_run_process(process: psutil.Process, run_id: str) -> bool:
    """Whether `process` runs the flow run `run_id` (the worker passes its id in the env)."""
    try:
        return process.environ().get("PREFECT__FLOW_RUN_ID") == run_id
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False

"""The stack on ports of its own, met from a new shell (no `PREFECT_API_URL`, no port settings),
and through an outage of its Prefect server, against the real stack (`scripts/serve.sh`):

- the retry that `r1 watch` and `r1 runs` print works as printed in a new shell (a bare
  `prefect flow-run retry` there asked a temporary server of its own: "Flow run ... not found");
- `serve.sh status` and `serve.sh` in a new shell find the running stack's ports (status said
  4200, and a second `serve.sh` waited 2 min 24 s on 4200 for a server up on 4290); another port
  for it is refused in one line;
- `r1 watch` outlives the Prefect server stopped for longer than Prefect's client retries
  (about 68 s, after which a watch died with a 73-line `httpx.ConnectError` traceback): it says
  once that the server is unreachable, says when it is back and follows the run to its end;
  Ctrl-C during the outage ends a watch with one line. The server comes back by `serve.sh` in a
  new shell, on the stack's ports.

The runs are of `r1-pipeline/cluster`, whose pool no worker serves here: they wait, and the
test sets how they end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.operations.stack import (
    ROOT,
    Stack,
    flow_run_id,
    prefect,
    r1,
    serve_sh,
    served_stack,
    session_of,
)

# Heavy: a Prefect server and worker (scripts/serve.sh), stopped and started again.
pytestmark = [pytest.mark.heavy, pytest.mark.slow]  # a real stack: CI runs it (-m slow)

OUTAGE_SECONDS = 75  # longer than Prefect's own retries of a request (2 + 4 + ... + 32 s)
BACKOFF_SECONDS = "3"  # the watch's longest wait between tries: it sees the server back soon


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with served_stack(tmp_path_factory.mktemp("new-shell-state")) as served:
        yield served


@pytest.fixture(scope="module")
def new_shell(stack, tmp_path_factory) -> dict:
    """A new shell's environment: nothing of the stack's but the state folder (the default
    `./state` for a user) and the project's virtual environment; Prefect's home a user's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "R1_"))}
    return env | {
        "R1_STATE_DIR": str(stack.state),
        "R1_VENV": stack.env["R1_VENV"],
        "PREFECT_HOME": str(tmp_path_factory.mktemp("user-prefect-home")),
    }


def waiting_run(stack: Stack) -> str:
    """A flow run that waits in the pool r1-cluster, which no worker serves here."""
    started = prefect(stack.env, "deployment", "run", "r1-pipeline/cluster")
    assert started.returncode == 0, started.stdout + started.stderr
    return flow_run_id(started.stdout)


def force_state(stack: Stack, run_id: str, state: str, message: str) -> None:
    """Put the run in `state` (a prefect.states constructor) by a fresh interpreter."""
    code = (
        "import sys\n"
        "from prefect import get_client, states\n"
        "with get_client(sync_client=True) as c:\n"
        f"    c.set_flow_run_state(sys.argv[1], states.{state}(message=sys.argv[2]), force=True)\n"
    )
    subprocess.run([sys.executable, "-c", code, run_id, message], env=stack.env, check=True)


def test_the_retry_r1_prints_works_as_printed_in_a_new_shell(stack, new_shell):
    run_id = waiting_run(stack)
    force_state(stack, run_id, "Crashed", "Execution was aborted by a termination signal.")
    watched = r1(new_shell, "watch", run_id, timeout=120)
    assert watched.returncode == 1, watched.stdout + watched.stderr
    (retry,) = [line.strip() for line in watched.stdout.splitlines() if "flow-run retry" in line]
    assert f".venv/bin/prefect flow-run retry {run_id}" in retry
    assert f".venv/bin/r1 watch {run_id} --state-dir {stack.state}\n" in watched.stdout

    listed = r1(new_shell, "runs", "--state", "crashed")
    assert f"retry one: {retry.replace(run_id, '<id>')}" in listed.stdout, listed.stdout

    retried = subprocess.run(
        ["bash", "-c", retry], cwd=ROOT, env=new_shell, capture_output=True, text=True, timeout=120
    )
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "not found" not in retried.stdout + retried.stderr
    prefect(stack.env, "flow-run", "delete", run_id)


def test_serve_in_a_new_shell_finds_the_running_stacks_ports(stack, new_shell):
    port = stack.env["R1_PREFECT_PORT"]
    status = serve_sh(new_shell, "status")
    assert status.returncode == 0, status.stderr
    assert f"Prefect UI: http://127.0.0.1:{port}   API:" in status.stdout
    assert f"MLflow UI:  http://127.0.0.1:{stack.env['R1_MLFLOW_PORT']}/" in status.stdout

    again = serve_sh(new_shell, timeout=200)  # all of it runs: it deploys again, and says so
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"Prefect UI: http://127.0.0.1:{port}" in again.stdout

    other = serve_sh(new_shell | {"R1_PREFECT_PORT": "1"}, timeout=30)
    assert other.returncode == 1 and other.stdout == ""
    assert other.stderr.splitlines() == [
        f"serve: the stack of {stack.state} runs on port {port}, not R1_PREFECT_PORT=1: unset it,"
        " or stop the stack first (bash scripts/serve.sh stop)"
    ]


def watch(env: dict, run_id: str) -> subprocess.Popen:
    """`r1 watch`, its output read as it comes."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("r1")), "watch", run_id],
        cwd=ROOT,
        env=env | {"R1_WATCH_BACKOFF_SECONDS": BACKOFF_SECONDS},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C as in a terminal, though these tests run in the background, where it is ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def read_until(process: subprocess.Popen, words: str, timeout: float = 120) -> list[str]:
    """The process's lines up to the first that holds `words`."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if words in line:
            return lines
    raise AssertionError(f"no line with {words!r}: {lines}")


def stop_server(stack: Stack) -> None:
    """SIGTERM to the Prefect server's session, as `serve.sh stop` sends it; waits for it."""
    leader = stack.pid("server")
    os.killpg(leader, signal.SIGTERM)
    members = [p for p in psutil.process_iter() if session_of(p) == leader]
    psutil.wait_procs(members, timeout=60)


def test_r1_watch_waits_out_a_server_outage_and_follows_the_run_to_its_end(stack, new_shell):
    run_id = waiting_run(stack)
    followed, interrupted = watch(new_shell, run_id), watch(new_shell, run_id)
    before = read_until(followed, "-- ")
    read_until(interrupted, "-- ")

    stop_server(stack)
    read_until(interrupted, "unreachable", timeout=30)
    interrupted.send_signal(signal.SIGINT)  # Ctrl-C
    rest, _ = interrupted.communicate(timeout=30)
    assert interrupted.returncode == 130
    assert rest.splitlines() == ["r1 watch: stopped following; the flow run goes on"]
    time.sleep(OUTAGE_SECONDS)

    started = serve_sh(new_shell)  # no port set: the stack's own, from its state folder
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"Prefect server starting on 127.0.0.1:{stack.env['R1_PREFECT_PORT']}" in started.stdout
    during = read_until(followed, "is back", timeout=60)
    force_state(stack, run_id, "Cancelled", "cancelled by the outage test")
    rest, _ = followed.communicate(timeout=120)
    assert followed.returncode == 1
    out = "\n".join(before + during) + "\n" + rest
    assert "Traceback" not in out, out
    (gone,) = [line for line in out.splitlines() if "unreachable" in line]
    url = f"http://127.0.0.1:{stack.env['R1_PREFECT_PORT']}/api"
    assert gone.startswith(f"r1 watch: the Prefect server at {url} is unreachable ("), out
    assert [line for line in out.splitlines() if "Error" in line] == [gone], out
    assert "-- Cancelled" in rest  # the run picked up again
    ending = " ".join(rest.split("-- Cancelled")[1].split())  # its reason wraps at 80 columns
    assert ending == f"flow run {run_id} Cancelled: cancelled by the outage test", out

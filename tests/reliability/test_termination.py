"""`r1 run` stopped by SIGTERM, SIGHUP or SIGINT (Ctrl-C) while a stage runs, sent to it alone or
to its whole process group (as a terminal's Ctrl-C and `timeout` send them): it exits with 128 +
the signal at once, the temporary Prefect API server it started is gone and its port free, no
MLflow run of the pipeline is left RUNNING and Prefect holds its flow run crashed. Killed outright
(SIGKILL, which nothing can handle), it leaves no server behind either."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from tests.reliability.test_command_resume import running_prefect_runs

# Heavy: `r1 run` started with its own Prefect server, then stopped by signals.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]
R1 = Path(sys.executable).parent / "r1"
STARTED = "stages.bootstrap"  # the bootstrap stage is training: the flow is under way
# The bootstrap stage made long (micro's 15 steps take about a second), so that the signal lands
# while it trains however slowly the test sees its first line: with micro's own length the whole
# run could end, its exit handler stopping the server, before the test had read that line.
LONG_STAGE = ("--set", "bootstrap.train.epochs=400")
WAIT = 240.0  # seconds for the flow to reach a stage on a busy 2-core machine
STOP_WAIT = 60.0  # seconds a stopped run may take to close its runs and stop its server


def servers(proc: psutil.Process) -> list[psutil.Process]:
    """The process's descendants that serve the Prefect API (uvicorn with Prefect's app)."""
    found = []
    for child in proc.children(recursive=True):
        try:
            if "prefect.server.api.server:create_app" in child.cmdline():
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def signals_at_default() -> None:
    """In the child before it starts: the signals under test at their default action, so that a
    suite started under `nohup` or as a background job (SIGHUP or SIGINT ignored, which `r1 run`
    keeps ignored) tests the same thing."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class Output:
    """The run's output lines, read as they come."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)

    def seen(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def tail(self) -> str:
        """The last lines, read to the end where the run has ended (a few seconds at most)."""
        self._thread.join(timeout=5)
        return "".join(self.lines[-30:])


def start_run(tmp_path: Path, own_group: bool) -> tuple[subprocess.Popen, dict[str, str]]:
    """`r1 run --profile micro` on a state folder of its own; in a process group of its own when
    `own_group`, so that a signal to that group reaches the run and all it started."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "R1_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [str(R1), "run", "--profile", "micro", *LONG_STAGE],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=signals_at_default,
        start_new_session=own_group,
    )
    return proc, env


def wait_for(proc: subprocess.Popen, out: Output, text: str) -> psutil.Process:
    """Wait until the run has printed `text` and its Prefect server runs; that server."""
    deadline = time.monotonic() + WAIT
    while not (out.seen(text) and servers(psutil.Process(proc.pid))):
        assert proc.poll() is None, f"the run ended early:\n{out.tail()}"
        assert time.monotonic() < deadline, f"never saw {text!r}:\n{out.tail()}"
        time.sleep(0.2)
    (server,) = servers(psutil.Process(proc.pid))
    return server


def listening_port(server: psutil.Process) -> int:
    deadline = time.monotonic() + WAIT
    while True:
        ports = [c.laddr.port for c in server.net_connections() if c.status == "LISTEN"]
        if ports:
            return ports[0]
        assert time.monotonic() < deadline, "the Prefect server never listened"
        time.sleep(0.2)


def gone(process: psutil.Process) -> bool:
    return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("to_group", [False, True], ids=["to-the-run", "to-its-group"])
@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGTERM, id="SIGTERM"),  # the default suite's; CI runs the others
        pytest.param(signal.SIGHUP, marks=pytest.mark.slow, id="SIGHUP"),
        pytest.param(signal.SIGINT, marks=pytest.mark.slow, id="SIGINT"),
    ],
)
def test_a_stopped_run_stops_its_prefect_server_and_closes_its_runs(tmp_path, sig, to_group):
    proc, _ = start_run(tmp_path, own_group=to_group)
    out = Output(proc)
    server = None
    try:
        server = wait_for(proc, out, STARTED)
        port = listening_port(server)
        if to_group:  # the server too, unless it keeps a group of its own
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        code = proc.wait(timeout=STOP_WAIT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL) if to_group else proc.kill()
        if server is not None and not gone(server):
            server.kill()
    assert code == 128 + sig, out.tail()
    assert gone(server)
    assert port_free(port)
    assert not out.seen("Error logging to API"), out.tail()
    client = MlflowClient(f"sqlite:///{tmp_path}/state/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert runs and all(r.info.status != "RUNNING" for r in runs), [
        (r.data.tags.get("r1.stage"), r.info.status) for r in runs
    ]
    assert not running_prefect_runs(tmp_path)  # its PREFECT_HOME is tmp_path / "prefect"


def test_a_killed_run_leaves_no_prefect_server(tmp_path):
    """SIGKILL to `r1 run` alone, which no handler sees: its server stops by itself."""
    proc, _ = start_run(tmp_path, own_group=False)
    out = Output(proc)
    server = None
    try:
        server = wait_for(proc, out, "Starting temporary server")
        listening_port(server)
        proc.kill()
        proc.wait(timeout=STOP_WAIT)
        server.wait(timeout=STOP_WAIT)  # raises psutil.TimeoutExpired while it stays
    finally:
        if proc.poll() is None:
            proc.kill()
        if server is not None and not gone(server):
            server.kill()

"""`r1 run` stopped by SIGTERM, SIGHUP or SIGINT (Ctrl-C) while a stage runs: it exits with
128 + the signal, the temporary Prefect API server it started is gone and its port free, and no
MLflow run of the pipeline is left RUNNING."""

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

# Heavy: `r1 run` started with its own Prefect server, then stopped by signals.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]
R1 = Path(sys.executable).parent / "r1"
STARTED = "stages.bootstrap"  # the bootstrap stage is training: the flow is under way
WAIT = 240.0  # seconds for the flow to reach a stage on a busy 2-core machine


def servers(proc: psutil.Process) -> list[psutil.Process]:
    """The process's descendants that serve the Prefect API (uvicorn)."""
    found = []
    for child in proc.children(recursive=True):
        try:
            if "uvicorn" in " ".join(child.cmdline()):
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
        return "".join(self.lines[-30:])


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGTERM,  # the default suite's; the others, about 20 s each, CI runs (-m slow)
        pytest.param(signal.SIGHUP, marks=pytest.mark.slow),
        pytest.param(signal.SIGINT, marks=pytest.mark.slow),
    ],
)
def test_a_stopped_run_stops_its_prefect_server_and_closes_its_runs(tmp_path, sig):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "R1_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [str(R1), "run", "--profile", "micro"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=signals_at_default,
    )
    out = Output(proc)
    try:
        deadline = time.monotonic() + WAIT
        while not (out.seen(STARTED) and servers(psutil.Process(proc.pid))):
            assert proc.poll() is None, f"the run ended early:\n{out.tail()}"
            assert time.monotonic() < deadline, f"no stage started:\n{out.tail()}"
            time.sleep(0.2)
        (server,) = servers(psutil.Process(proc.pid))
        port = next(c.laddr.port for c in server.net_connections() if c.status == "LISTEN")
        proc.send_signal(sig)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 128 + sig, out.tail()
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert port_free(port)
    client = MlflowClient(f"sqlite:///{tmp_path}/state/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert runs and all(r.info.status != "RUNNING" for r in runs), [
        (r.data.tags.get("r1.stage"), r.info.status) for r in runs
    ]

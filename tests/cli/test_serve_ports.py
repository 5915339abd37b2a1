"""`scripts/serve.sh` keeps a running stack's ports: a shell without `R1_PREFECT_PORT` must not
look for it on 4200 (a second `serve.sh` waited 2 min 24 s there for a server up on 4290). The
stack here is a stand-in: a `sleep` in a session of its own as the server, and the serve.env that
`serve.sh` writes as it starts the components; `status` and the refusal start nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.operations.stack import serve_sh

SERVE_ENV = (
    "export PREFECT_API_URL=http://127.0.0.1:4290/api\nexport R1_MLFLOW_UI=http://127.0.0.1:5090\n"
)


@pytest.fixture
def running_stack(tmp_path):
    """A state folder whose server runs (a stand-in process) on the ports 4290 and 5090."""
    (tmp_path / "pids").mkdir()
    (tmp_path / "serve.env").write_text(SERVE_ENV)
    # as serve.sh starts a component, and not this process's child: `stop` waits for its session
    # to be empty, which a child left unreaped (a zombie) never is
    started = subprocess.run(
        ["bash", "-c", "setsid sleep 300 > /dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(started.stdout)
    (tmp_path / "pids" / "server").write_text(str(pid))
    yield tmp_path
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def serve(state: Path, *args: str, **settings: str) -> subprocess.CompletedProcess:
    """`bash scripts/serve.sh ARGS` from a shell with only `settings` of the stack's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("R1_", "PREFECT_"))}
    env |= {"R1_STATE_DIR": str(state), **settings}
    return serve_sh(env, *args, timeout=60)


def test_status_reports_the_running_stacks_ports_in_a_shell_without_them(running_stack):
    status = serve(running_stack, "status")
    assert status.returncode == 0, status.stderr
    assert "server: running" in status.stdout
    assert "Prefect UI: http://127.0.0.1:4290   API: http://127.0.0.1:4290/api" in status.stdout
    assert "MLflow UI:  http://127.0.0.1:5090/" in status.stdout


def test_the_same_port_set_again_is_taken(running_stack):
    status = serve(running_stack, "status", R1_PREFECT_PORT="4290")
    assert status.returncode == 0, status.stderr
    assert "Prefect UI: http://127.0.0.1:4290" in status.stdout


@pytest.mark.parametrize("command", ["start", "status"])
def test_another_port_for_a_running_stack_is_refused_in_one_line(running_stack, command):
    refused = serve(running_stack, command, R1_PREFECT_PORT="4300")
    assert refused.returncode == 1
    assert refused.stdout == ""  # start did nothing
    assert refused.stderr == (
        f"serve: the stack of {running_stack} runs on port 4290, not R1_PREFECT_PORT=4300: unset"
        " it, or stop the stack first (bash scripts/serve.sh stop)\n"
    )


def test_stop_stops_the_stack_whatever_port_this_shell_sets(running_stack):
    stopped = serve(running_stack, "stop", R1_PREFECT_PORT="4300")
    assert stopped.returncode == 0, stopped.stderr
    assert "serve: stopped the server (" in stopped.stdout
    assert not (running_stack / "serve.env").exists()


def test_without_a_running_stack_the_settings_or_defaults_hold(tmp_path):
    (tmp_path / "serve.env").write_text(SERVE_ENV)  # left by a stack whose processes are gone
    status = serve(tmp_path, "status")
    assert "Prefect UI: http://127.0.0.1:4200 " in status.stdout
    assert "MLflow UI:  http://127.0.0.1:5000/" in status.stdout
    chosen = serve(tmp_path, "status", R1_PREFECT_PORT="4300", R1_MLFLOW_PORT="5100")
    assert "Prefect UI: http://127.0.0.1:4300 " in chosen.stdout
    assert "MLflow UI:  http://127.0.0.1:5100/" in chosen.stdout

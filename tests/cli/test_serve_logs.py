"""`scripts/serve.sh` started again (after a reboot, a stop) keeps each component's log of its
previous start as `NAME.log.1`: what the worker's log said of a run that crashed before the
reboot is still there to read. Before, each start emptied the logs. The stack here is a
stand-in: a virtual environment whose `python`, `prefect` and `mlflow` say which start they
belong to and then sleep, as the real components run; the script itself is the real one."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from tests.operations.stack import ROOT, free_port, serve_sh

PYTHON = """#!/usr/bin/env bash
case "$*" in
  *cli.worker*) echo "worker ready: stand-in"; echo "worker of start $R1_START"; exec sleep 300 ;;
esac
exit 0
"""
PREFECT = """#!/usr/bin/env bash
if [ "$1 $2" = "server start" ]; then echo "server of start $R1_START"; exec sleep 300; fi
exit 0
"""
MLFLOW = """#!/usr/bin/env bash
echo "mlflow of start $R1_START"; exec sleep 300
"""
LOGS = {"worker": "prefect-worker.log", "server": "prefect-server.log", "mlflow": "mlflow-ui.log"}


def stand_in_venv(folder: Path) -> Path:
    """A virtual environment that `scripts/setup.sh` takes as installed, of stand-in commands."""
    for name, text in (("python", PYTHON), ("prefect", PREFECT), ("mlflow", MLFLOW)):
        command = folder / "bin" / name
        command.parent.mkdir(parents=True, exist_ok=True)
        command.write_text(text)
        command.chmod(command.stat().st_mode | stat.S_IXUSR)
    wanted = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints/cpu.lock").read_bytes()
    )
    (folder / ".r1-install-stamp").write_text(wanted.hexdigest() + "\n")
    return folder


@pytest.fixture
def serve(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("R1_", "PREFECT_"))}
    env |= {
        "R1_STATE_DIR": str(tmp_path / "state"),
        "R1_VENV": str(stand_in_venv(tmp_path / "venv")),
        "R1_PREFECT_PORT": str(free_port()),
        "R1_MLFLOW_PORT": str(free_port()),
    }

    def run(*args: str, start: int = 0):
        done = serve_sh(env | {"R1_START": str(start)}, *args, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    yield run
    run("stop")


def test_a_second_start_keeps_each_components_log_of_the_first(serve, tmp_path):
    logs = tmp_path / "state" / "logs"
    serve("start", start=1)
    serve("stop")
    serve("start", start=2)
    for name, log in LOGS.items():
        assert f"{name} of start 2" in (logs / log).read_text()
        assert f"{name} of start 1" in (logs / f"{log}.1").read_text()

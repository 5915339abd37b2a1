"""The temporary Prefect server of `r1 run` runs Prefect's own command (its arguments and
environment, as the installed Prefect builds them), through the watch of `cli.server_process`, in
a session of its own. (What that changes for a stopped or killed run: test_termination.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

from prefect.server.api.server import SubprocessASGIServer

from cli.server_process import OwnGroupServer


class Launched(Exception):
    """Raised by the stand-in for `subprocess.Popen`, carrying what it was called with."""

    def __init__(self, kwargs: dict):
        super().__init__("launched")
        self.kwargs = kwargs


def launch_of(method, monkeypatch) -> dict:
    """What `method(server)` hands `subprocess.Popen`, the process not started."""

    def popen(**kwargs):
        raise Launched(kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    server = object.__new__(OwnGroupServer)  # not registered as Prefect's instance
    server.port = 8123
    try:
        method(server)
    except Launched as launched:
        return launched.kwargs
    raise AssertionError("no process launched")


def test_the_server_is_prefect_s_own_command_through_the_watch_in_its_own_session(monkeypatch):
    prefect_s = launch_of(SubprocessASGIServer._run_uvicorn_command, monkeypatch)
    ours = launch_of(OwnGroupServer._run_uvicorn_command, monkeypatch)
    assert prefect_s["args"][:3] == [sys.executable, "-m", "uvicorn"]
    assert ours["args"] == [
        sys.executable, "-m", "cli.server_process", str(os.getpid()), *prefect_s["args"][3:]
    ]  # fmt: skip
    assert ours.pop("env") == prefect_s.pop("env")
    assert ours.pop("start_new_session") is True
    del ours["args"], prefect_s["args"]
    assert ours == prefect_s  # nothing else differs


def test_prefect_s_client_finds_the_early_server():
    server = OwnGroupServer()
    try:
        assert SubprocessASGIServer() is server
    finally:
        SubprocessASGIServer._instances.pop(None, None)

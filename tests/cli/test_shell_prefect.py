"""`r1 run` from a shell set up for other Prefect work. A `PREFECT_API_URL` (or a `.env` file in
the working folder) that names a server that is not there: refused in one line that names the
setting, where it was set and what to do, before the run starts. A `PREFECT_LOCAL_STORAGE_PATH`:
the stage cache stays in Prefect's home. In processes of their own: Prefect reads its settings
once, as it is imported."""

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.prefect_api import PrefectApiUnreachable, check_api_answers

REPO = Path(__file__).resolve().parents[2]


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/api"  # nothing answers there once closed


def r1_run(state: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`r1 run --profile micro` in a process of its own, from `cwd`, with the project importable."""
    shell = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    shell["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), shell.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--profile", "micro", "--state-dir", str(state)],
        cwd=cwd, env=shell | env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_prefect_api_url_where_nothing_answers_is_refused_in_one_line(tmp_path):
    url = dead_url()
    ran = r1_run(tmp_path / "state", REPO, {"PREFECT_API_URL": url})
    assert ran.returncode == 2, ran.stderr[-3000:]
    assert ran.stderr.startswith(
        f"r1: PREFECT_API_URL={url} (set in the environment), and no Prefect server answers "
        "there (ConnectError: "
    ), ran.stderr
    assert ran.stderr.rstrip().endswith(
        "start that server (this project's stack: bash scripts/serve.sh), or unset "
        "PREFECT_API_URL to run on a temporary server of the run's own"
    )
    assert ran.stderr.count("\n") == 1


def test_a_prefect_api_url_from_a_dotenv_file_names_the_file(tmp_path):
    url = dead_url()
    (tmp_path / ".env").write_text(f"PREFECT_API_URL={url}\n")
    ran = r1_run(tmp_path / "state", tmp_path, {})
    assert ran.returncode == 2, ran.stderr[-3000:]
    assert f"PREFECT_API_URL={url} (set in {tmp_path / '.env'})" in ran.stderr
    assert f"or take PREFECT_API_URL out of {tmp_path / '.env'} to run on a temporary" in ran.stderr


@pytest.fixture
def answering_url() -> Iterator[str]:
    """A local HTTP server that answers every request (404), as any server at an address does."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api"
    server.shutdown()
    server.server_close()


def test_a_server_that_answers_passes_the_check_and_one_that_does_not_is_refused(answering_url):
    check_api_answers(answering_url)  # what it answers is Prefect's to judge
    with pytest.raises(PrefectApiUnreachable, match="no Prefect server answers there"):
        check_api_answers(dead_url())


def test_the_stage_cache_stays_in_prefects_home_whatever_the_shell_says(tmp_path):
    """Prefect's settings as a run's flow reads them, after `prepare_environment`."""
    elsewhere = tmp_path / "results-of-another-project"
    shell = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    shell |= {"PREFECT_LOCAL_STORAGE_PATH": str(elsewhere), "PYTHONPATH": str(REPO)}
    read = (
        "from cli.environment import prepare_environment\n"
        "prepare_environment('state')\n"
        "from prefect.settings import get_current_settings\n"
        "print(get_current_settings().results.local_storage_path)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", read], cwd=tmp_path, env=shell, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip() == str(tmp_path / "state" / "prefect" / "storage")


def test_a_shell_setting_that_moves_the_stage_cache_is_said_not_to_be_used(tmp_path):
    from cli.environment import unused_result_settings
    from storage.paths import StatePaths

    paths = StatePaths(tmp_path / "state")
    shell = {"PREFECT_LOCAL_STORAGE_PATH": "/elsewhere"}
    assert unused_result_settings(shell, paths) == [
        "prefect: PREFECT_LOCAL_STORAGE_PATH=/elsewhere is not used: the stage cache stays in "
        f"{paths.prefect_home / 'storage'}"
    ]
    home = {"PREFECT_HOME": "/home/me/.prefect", "PREFECT_LOCAL_STORAGE_PATH": "/elsewhere"}
    assert unused_result_settings(home, paths) == [  # a PREFECT_HOME of the user's keeps it
        "prefect: PREFECT_LOCAL_STORAGE_PATH=/elsewhere is not used: the stage cache stays in "
        "/home/me/.prefect/storage"
    ]
    assert unused_result_settings({}, paths) == []

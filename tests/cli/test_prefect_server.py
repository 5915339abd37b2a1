import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from prefect.settings import (
    PREFECT_API_DATABASE_CONNECTION_URL,
    PREFECT_API_URL,
    PREFECT_HOME,
    PREFECT_SERVER_EPHEMERAL_ENABLED,
    temporary_settings,
)

from cli import prefect_server
from cli.prefect_server import (
    DB_NAME,
    EarlyServer,
    build_template,
    migrated_revision,
    seed_database,
    template_path,
)

pytestmark = pytest.mark.usefixtures("private_environment")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def home(tmp_path) -> Iterator[Path]:
    """A state folder's Prefect home, in Prefect's settings (read from its context, as the flow's
    client reads them)."""
    home = tmp_path / "state" / "prefect"
    home.mkdir(parents=True)
    with temporary_settings(updates={PREFECT_HOME: home}):
        yield home


def _write_template(revision: str) -> Path:
    """A stand-in template: a SQLite file at `revision`, as Prefect's migrations leave one."""
    template = template_path()
    template.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(template)) as db, db:
        db.execute("create table alembic_version (version_num text)")
        db.execute("insert into alembic_version values (?)", (revision,))
    return template


def test_the_template_is_kept_per_prefect_version_in_the_cache(cache):
    from importlib.metadata import version

    assert template_path() == cache / "r1-pipeline" / f"prefect-{version('prefect')}" / DB_NAME


def test_a_new_state_folder_gets_a_copy_of_the_template(cache, home):
    template = _write_template("migrated")
    assert seed_database(home)
    assert (home / DB_NAME).read_bytes() == template.read_bytes()
    assert migrated_revision(home / DB_NAME) == "migrated"
    assert not list(home.glob("*.seeding"))


def test_an_existing_database_is_never_replaced(cache, home):
    (home / DB_NAME).write_text("the runs so far")
    _write_template("migrated")
    assert not seed_database(home)
    assert (home / DB_NAME).read_text() == "the runs so far"


@pytest.mark.parametrize("content", [b"", b"not a database", b"SQLite format 3\x00" + b"\x00" * 50])
def test_a_template_that_is_not_a_migrated_database_is_not_copied(cache, home, caplog, content):
    template = template_path()
    template.parent.mkdir(parents=True)
    template.write_bytes(content)
    assert not seed_database(home)
    assert not (home / DB_NAME).exists()
    assert "is not a migrated Prefect database" in caplog.text


def test_a_failed_copy_leaves_no_partial_database_and_says_why(cache, home, caplog, monkeypatch):
    _write_template("migrated")

    def disk_full(source, target):
        Path(target).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prefect_server.shutil, "copyfile", disk_full)
    assert not seed_database(home)
    assert list(home.iterdir()) == []
    assert "No space left on device" in caplog.text


def test_the_command_seeds_a_new_state_folder_once(cache, home, capsys):
    """`python -m cli.prefect_server --seed PREFECT_HOME`, as scripts/serve.sh runs it."""
    template = _write_template("migrated")
    assert prefect_server.main(["--seed", str(home)]) == 0
    assert (home / DB_NAME).read_bytes() == template.read_bytes()
    assert capsys.readouterr().out == f"{template}\nseeded {home / DB_NAME}\n"
    assert prefect_server.main(["--seed", str(home)]) == 0
    assert capsys.readouterr().out == f"{template}\n"


def test_without_a_template_prefect_migrates_as_before(cache, home):
    assert not seed_database(home)
    assert not (home / DB_NAME).exists()


def test_a_database_other_than_the_default_file_is_left_to_prefect(cache, home, tmp_path):
    _write_template("migrated")
    other = f"sqlite+aiosqlite:///{tmp_path / 'other.db'}"
    with temporary_settings(updates={PREFECT_API_DATABASE_CONNECTION_URL: other}):
        assert not seed_database(home)
    assert not (home / DB_NAME).exists()


def test_no_early_server_when_a_prefect_server_is_named(home):
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert EarlyServer.start(home) is None
    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_ENABLED: False}):
        assert EarlyServer.start(home) is None


def test_a_failed_early_start_is_logged_and_left_to_prefect(caplog):
    class Refuses:
        def start(self):
            raise RuntimeError("port taken")

    early = EarlyServer(Refuses())
    early._thread.start()
    early.wait()
    assert isinstance(early.error, RuntimeError)
    assert "did not start early: port taken" in caplog.text


def _newest_sqlite_revision() -> str:
    """The revision of Prefect's SQLite migrations that no other revision follows."""
    import prefect.server.database as database

    versions = Path(database.__file__).parent / "_migrations" / "versions" / "sqlite"
    revisions, followed = set(), set()
    for path in versions.glob("*.py"):
        text = path.read_text()
        revisions |= set(re.findall(r'^revision = "(\w+)"', text, re.M))
        followed |= set(re.findall(r'^down_revision = "(\w+)"', text, re.M))
    (head,) = revisions - followed
    return head


@pytest.mark.heavy
def test_the_template_is_prefect_s_own_schema_at_its_latest_revision(cache):
    """Made by Prefect's migrations: its alembic revision is the head of Prefect's own, so a
    server on a copy finds nothing to migrate."""
    template = build_template()
    with sqlite3.connect(template) as db:
        tables = {name for (name,) in db.execute("select name from sqlite_master")}
    assert migrated_revision(template) == _newest_sqlite_revision()
    assert {"flow", "flow_run", "task_run", "deployment"} <= tables
    assert build_template() == template  # made once
    assert prefect_server.template_path() == template


@pytest.mark.heavy
@pytest.mark.slow  # a whole micro run under a fresh server: CI runs it (-m slow)
def test_a_run_in_a_new_state_folder_uses_the_template_and_records_its_flow_run(cache, tmp_path):
    """`r1 run` with no Prefect server named: the new state folder's database starts as the
    template, and the temporary server started early records the flow run in it."""
    build_template()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--profile", "micro", "--state-dir", str(state)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "its database copied from" in done.stderr
    with sqlite3.connect(state / "prefect" / DB_NAME) as db:
        flows = db.execute("select name from flow").fetchall()
        states = db.execute("select state_type from flow_run").fetchall()
    assert flows == [("r1-pipeline",)]
    assert states == [("COMPLETED",)]

"""The temporary Prefect server of `r1 run`, up sooner: started while the flow's modules import,
and, in a new state folder, on a database that is already migrated.

A run with no `PREFECT_API_URL` gets a temporary Prefect server, which Prefect starts at the
flow's first call and waits for. On 2 cores that wait was about 9 s in a new state folder (7 s of
it Prefect's migrations of an empty SQLite database) and 4 s in one that has run before, after
this process had spent about 6 s importing torch, transformers and MLflow. Here:

- `EarlyServer.start` starts the same server, through Prefect's own class, in a thread that
  waits for it to answer, before the flow's modules import; the flow's client finds it running,
  and Prefect stops it at exit as before.
- `seed_database` copies an empty database that Prefect's own migrations made once, for this
  Prefect version (`python -m cli.prefect_server`, which `scripts/setup.sh` runs), into a state
  folder that has none yet, so that the server finds its schema at the latest revision and
  migrates nothing. Without the template, or with a database other than Prefect's default
  SQLite file, nothing is copied and Prefect migrates as it always did.
- The server runs in a process group of its own and ends with this process
  (`cli/server_process.py`), so that a Ctrl-C or a `timeout` stops the run, not the server the
  run still reports to.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from contextlib import closing
from pathlib import Path

log = logging.getLogger(__name__)

DB_NAME = "prefect.db"  # Prefect's default SQLite database under PREFECT_HOME
EARLY_START_ENV = "R1_PREFECT_EARLY_START"  # "0": leave the start to Prefect (no seeding either)


def template_path() -> Path:
    """Where the migrated empty database of the installed Prefect version is kept."""
    from importlib.metadata import version

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "r1-pipeline" / f"prefect-{version('prefect')}" / DB_NAME


def _default_database(prefect_home: Path) -> bool:
    """Whether Prefect's database is its default SQLite file under `prefect_home`."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    value = url.get_secret_value() if url is not None else ""
    return value.endswith(str(prefect_home / DB_NAME))


def migrated_revision(path: Path) -> str | None:
    """The alembic revision a Prefect database file is at, or None when it is not a SQLite
    database that Prefect's migrations made (empty, truncated, another file)."""
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            rows = db.execute("select version_num from alembic_version").fetchall()
    except sqlite3.Error:
        return None
    return rows[0][0] if len(rows) == 1 else None


def seed_database(prefect_home: Path) -> bool:
    """Copy the migrated empty database into `prefect_home` when it has no database yet; whether
    it did. A template that is not a migrated database is left unused, with a warning."""
    target, template = prefect_home / DB_NAME, template_path()
    if target.exists() or not template.exists() or not _default_database(prefect_home):
        return False
    if migrated_revision(template) is None:
        log.warning(
            "%s is not a migrated Prefect database; Prefect migrates a new one (delete the file "
            "and run `python -m cli.prefect_server` to make it again)",
            template,
        )
        return False
    partial = target.with_suffix(".seeding")
    try:
        shutil.copyfile(template, partial)
        partial.replace(target)  # whole or not at all: a killed copy leaves no half database
    except OSError as error:  # Prefect, creating its own, reports what is wrong with the folder
        log.warning("could not copy the Prefect database template into %s: %s", prefect_home, error)
        partial.unlink(missing_ok=True)
        return False
    return True


def build_template() -> Path:
    """Make the migrated empty database for the installed Prefect version, by Prefect's own
    migrations in a scratch PREFECT_HOME (a few seconds, once per version)."""
    template = template_path()
    if template.exists():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=template.parent) as scratch:
        env = dict(os.environ, PREFECT_HOME=scratch)
        env.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)
        env.pop("PREFECT_SERVER_DATABASE_CONNECTION_URL", None)
        migrate = (
            "import asyncio\n"
            "from prefect.server.database import provide_database_interface\n"
            "asyncio.run(provide_database_interface().create_db())\n"
        )
        subprocess.run([sys.executable, "-c", migrate], env=env, check=True)
        (Path(scratch) / DB_NAME).replace(template)
    return template


class EarlyServer:
    """The temporary server's start, under way in a background thread."""

    def __init__(self, server: object):
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._start, args=(server,), name="prefect-server-start", daemon=True
        )

    @classmethod
    def start(cls, prefect_home: Path) -> EarlyServer | None:
        """Start it, unless there is none to start (a `PREFECT_API_URL` is set, or Prefect's
        temporary server is turned off) or `R1_PREFECT_EARLY_START=0` leaves it to Prefect (which
        then starts this same server, in its own process group, at the flow's first call)."""
        from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

        if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
            return None
        from cli.server_process import OwnGroupServer

        server = OwnGroupServer()  # the instance the flow's client will find
        if os.environ.get(EARLY_START_ENV) == "0":  # Prefect's own start, as benchmarks compare
            return None
        if seed_database(prefect_home):
            log.info("prefect: a new state folder, its database copied from %s", template_path())
        early = cls(server)
        early._thread.start()
        return early

    def _start(self, server) -> None:
        try:
            server.start()
        except BaseException as error:  # reported by wait(); the flow's client tries again
            self.error = error

    def wait(self) -> None:
        """Block until the server answers, or its start failed (logged: Prefect tries again at
        the flow's first call, and raises there)."""
        self._thread.join()
        if self.error is not None:
            log.warning("the temporary Prefect server did not start early: %s", self.error)


def main(argv: list[str] | None = None) -> int:
    """Make the template and print its path; with `--seed PREFECT_HOME`, also copy it into
    that folder when it has no database yet (`scripts/serve.sh`, before its server starts)."""
    parser = argparse.ArgumentParser(prog="python -m cli.prefect_server", description=__doc__)
    parser.add_argument("--seed", type=Path, metavar="PREFECT_HOME", help="a folder to seed")
    args = parser.parse_args(argv)
    print(build_template())
    if args.seed is not None and seed_database(args.seed):
        print(f"seeded {args.seed / DB_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prefect's test harness (`prefect_test_harness`: a temporary server on a fresh SQLite database)
on a database that is already migrated.

The harness makes its database in a new temporary folder and its server spends about 7 of its
9 s start on 2 cores running Prefect's migrations there. The migrated empty database that
`scripts/setup.sh` makes once per Prefect version (`cli/prefect_server.py`, the one `r1 run`
seeds new state folders from) is copied into that folder first, so the server finds its schema
at the latest revision. Without the template, the harness migrates as it always did.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

HARNESS_DB = "prefect-test.db"  # the file prefect_test_harness puts in its temporary folder


@contextmanager
def prefect_harness(startup_timeout: int = 180) -> Iterator[None]:
    """`prefect_test_harness(server_startup_timeout=startup_timeout)`, seeded."""
    from prefect.testing import utilities

    original = utilities.mkdtemp
    with ExitStack() as stack:
        utilities.mkdtemp = seeded(original)  # the harness makes its folder as it enters
        try:
            stack.enter_context(utilities.prefect_test_harness(startup_timeout))
        finally:
            utilities.mkdtemp = original
        yield


def seeded(mkdtemp: Callable[[], str]) -> Callable[[], str]:
    """`mkdtemp` that also copies the migrated template into the folder it makes."""
    from cli.prefect_server import migrated_revision, template_path

    def make() -> str:
        folder = mkdtemp()
        template = template_path()
        if migrated_revision(template) is not None:
            shutil.copyfile(template, Path(folder) / HARNESS_DB)
        return folder

    return make

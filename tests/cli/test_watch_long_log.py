"""`r1 watch` of a run with a long log, on a real Prefect server: each poll reads the lines
written since the newest it has (less the time a line may take to reach the server), not the
whole log again. Before, every poll (each 2 s) read every line of the attempt: 4 to 6 s a poll
for a run of 30,000 lines, the watch and the server busy for as long as the run went on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from prefect import flow, get_client
from prefect.client.schemas.actions import LogCreate
from prefect.states import Completed, Running, Scheduled

from cli import watch

pytestmark = pytest.mark.usefixtures("prefect_server")

LINES = 1000  # five of the server's pages
POLLS = 4  # polls while the run is Running


@flow(name="chatty")
def chatty() -> None:
    """A flow whose run's logs are written here through the client, never run."""


def write_lines(client, run_id: UUID, times: list[datetime], first: int = 0) -> None:
    client.create_logs(
        [
            LogCreate(
                name="prefect.flow_runs",
                level=20,
                message=f"reasoning_rl: line {first + i}",
                timestamp=at,
                flow_run_id=run_id,
            )
            for i, at in enumerate(times)
        ]
    )


def test_each_poll_of_a_long_log_reads_only_its_newest_lines(monkeypatch):
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(chatty, state=Scheduled())
        client.set_flow_run_state(run.id, Running())
        # lines a second apart, as a long stage writes them
        start = datetime.now(UTC) + timedelta(seconds=1)
        times = [start + timedelta(seconds=i) for i in range(LINES)]
        write_lines(client, run.id, times)

        rows: list[int] = []  # the rows each read of the logs returned
        read_logs = client.read_logs

        def counted(*args, **kwargs):
            page = read_logs(*args, **kwargs)
            rows.append(len(page))
            return page

        monkeypatch.setattr(client, "read_logs", counted)
        naps = []

        def nap(seconds: float) -> None:
            naps.append(seconds)
            if (
                len(naps) == 1
            ):  # a line that reached the server late: written 30 s before the newest
                write_lines(client, run.id, [times[-1] - timedelta(seconds=30.5)], first=LINES)
            if len(naps) == POLLS:
                client.set_flow_run_state(run.id, Completed(), force=True)

        monkeypatch.setattr(watch, "nap", nap)
        monkeypatch.setattr(watch, "STRAGGLER_SECONDS", 0.0)
        said: list[str] = []
        watch.follow(client, run.id, said.append, poll=0.0)

    shown = [line.split(" ", 1)[1] for line in said if not line.startswith("--")]
    assert sorted(shown) == sorted(f"reasoning_rl: line {i}" for i in range(LINES + 1))
    first_poll = LINES // watch.PAGE + 1  # its pages, the last one short
    later = rows[first_poll:]
    assert sum(rows[:first_poll]) == LINES
    assert len(naps) == POLLS
    # every later poll reads the last minute's lines (61 and the late one), never the log again
    assert later and max(later) <= 62, later

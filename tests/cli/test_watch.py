"""`r1 watch` after a run's final state: it reads the logs a little longer while the run's last
lines may still be on their way, and not at all for a run that ended long before (its answer
then comes at once)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from uuid import UUID, uuid4

import pytest
from prefect.client.schemas.objects import FlowRun, Log
from prefect.states import Completed, Scheduled

from cli import watch
from cli.watch import STRAGGLER_SECONDS, follow, straggler_wait

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_the_wait_is_what_is_left_of_the_stragglers_time_since_the_end():
    assert straggler_wait(NOW, now=NOW) == STRAGGLER_SECONDS
    assert straggler_wait(NOW - timedelta(seconds=2), now=NOW) == STRAGGLER_SECONDS - 2
    assert straggler_wait(NOW - timedelta(minutes=10), now=NOW) == 0
    assert straggler_wait(NOW + timedelta(seconds=30), now=NOW) == STRAGGLER_SECONDS  # clock ahead
    assert straggler_wait(None, now=NOW) == STRAGGLER_SECONDS


class Server:
    """The three reads `follow` makes, answered as Prefect's server answers them: a run's states,
    the run, its logs after a time in pages. A log lands on the server at `arrives` naps."""

    def __init__(self, ended: datetime, logs: list[tuple[int, str]]):
        self.run_id = uuid4()
        scheduled = Scheduled(timestamp=ended - timedelta(minutes=1))
        self.states = [scheduled, Completed(timestamp=ended)]
        self.logs = [(arrives, self.log(text, ended)) for arrives, text in logs]
        self.naps = 0

    def log(self, text: str, ended: datetime) -> Log:
        return Log(name="r1", level=20, message=text, timestamp=ended, flow_run_id=self.run_id)

    def read_flow_run_states(self, flow_run_id: UUID) -> list:
        return self.states

    def read_flow_run(self, flow_run_id: UUID) -> FlowRun:
        return FlowRun(id=self.run_id, flow_id=uuid4(), state=self.states[-1])

    def read_logs(self, log_filter, sort, limit: int, offset: int) -> list[Log]:
        after = log_filter.timestamp.after_
        landed = [log for at, log in self.logs if at <= self.naps and log.timestamp >= after]
        return landed[offset : offset + limit]


def followed(server: Server, monkeypatch) -> list[str]:
    """What `follow` says, each of its naps one second of its clock."""
    said: list[str] = []
    monkeypatch.setattr(watch, "nap", lambda seconds: setattr(server, "naps", server.naps + 1))
    monkeypatch.setattr(watch, "time", SimpleNamespace(monotonic=lambda: float(server.naps)))
    follow(server, server.run_id, said.append, poll=1.0)
    return said


def test_a_run_that_ended_long_ago_is_answered_without_waiting(monkeypatch):
    server = Server(datetime.now(UTC) - timedelta(minutes=10), [(0, "stage 16 ends")])
    said = followed(server, monkeypatch)
    assert server.naps == 0
    assert [line.split(" ", 1)[1] for line in said] == ["stage 16 ends", "Completed"]


@pytest.mark.parametrize("late", [1, 3])
def test_a_run_that_just_ended_has_its_last_lines_read_as_they_arrive(monkeypatch, late):
    server = Server(datetime.now(UTC), [(0, "step 2 of 2"), (late, "finished")])
    said = followed(server, monkeypatch)
    assert [line.split(" ", 1)[1] for line in said] == ["step 2 of 2", "Completed", "finished"]
    assert STRAGGLER_SECONDS - 1 <= server.naps <= STRAGGLER_SECONDS  # a read a second

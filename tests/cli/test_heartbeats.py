"""The automations that end a flow run whose heartbeats stopped (cli/heartbeats.py), as built;
tests/operations/test_stuck_runs.py runs them on a real server."""

import pytest

from cli.heartbeats import CANCEL_NAME, NAME, automations


def test_a_run_unheard_ends_crashed_and_a_cancelling_one_cancelled():
    crash, cancel = automations(90)
    assert (crash.name, cancel.name) == (NAME, CANCEL_NAME)
    # watched from the move to Running on, so a run that dies before its second heartbeat ends too
    assert crash.trigger.after == {"prefect.flow-run.heartbeat", "prefect.flow-run.Running"}
    # a cancelling run whose process is gone never moves by itself: its silence must still count
    assert "prefect.flow-run.Cancelling" not in crash.trigger.expect
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed"} <= crash.trigger.expect
    # a Running may reach the server after the first heartbeat: it must not close the window
    assert "prefect.flow-run.Running" not in crash.trigger.expect
    assert cancel.trigger.after == {"prefect.flow-run.Cancelling"}
    assert crash.trigger.within.total_seconds() == cancel.trigger.within.total_seconds() == 90
    assert [a.state.value for a in crash.actions + cancel.actions] == ["CRASHED", "CANCELLED"]
    assert not any(a.force for a in crash.actions + cancel.actions)  # an ended run stays ended


def test_a_timeout_within_the_heartbeat_interval_is_refused():
    with pytest.raises(ValueError, match="would crash live runs"):
        automations(30)

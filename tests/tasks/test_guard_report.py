"""The guard's verdict in a stage run's MLflow tags and description, and in the stage table's
note: worked records, each rule that tripped at the last step named, not only the last one
recorded."""

from __future__ import annotations

from types import SimpleNamespace

from stages.guarded import GuardRecord
from tasks.guard_report import guard_notes, tag_guard


def trip(rule: str, step: int, action: str, reason: str) -> dict:
    return {"rule": rule, "step": step, "since": step - 5, "reason": reason, "action": action}


class Client:
    def __init__(self):
        self.tags: dict[str, str] = {}

    def set_tag(self, run_id, key, value):
        self.tags[key] = value


def tags_of(record: GuardRecord) -> dict[str, str]:
    client = Client()
    tracker = SimpleNamespace(client=client, run_id="r", log_metrics=lambda *_: None)
    tag_guard(tracker, record)  # type: ignore[arg-type]  # only its client and metrics are read
    return client.tags


def test_a_stop_of_two_rules_names_both_in_the_tags_and_the_description():
    record = GuardRecord(
        rules=["reward_without_skill", "gamed_term"],
        trips=[
            trip("repetition", 9, "warn", "loops"),
            trip("reward_without_skill", 12, "stop", "math fell"),
            trip("gamed_term", 12, "stop", "format adds more"),
        ],
        outcome="stopped",
        stop_rules=["reward_without_skill", "gamed_term"],
    )
    tags = tags_of(record)
    assert tags["r1.guard.reason"] == (
        "reward_without_skill at step 12: math fell; gamed_term at step 12: format adds more"
    )
    assert tags["r1.guard.trips"] == (
        "repetition@9 (warn), reward_without_skill@12 (stop), gamed_term@12 (stop)"
    )
    assert tags["mlflow.note.content"].startswith(
        "**The guard stopped this stage** at step 12: rule reward_without_skill: math fell; "
        "rule gamed_term: format adds more."
    )
    note = guard_notes(record, "r1_zero_rl")["guard"]
    assert "reward_without_skill@12, gamed_term@12" in note


def test_the_last_verdict_is_read_on_the_last_branch():
    """A rollback at step 7 and a warning at step 7 of the new branch: the reason is the
    warning's alone."""
    record = GuardRecord(
        trips=[trip("collapse", 7, "rollback", "entropy"), trip("repetition", 7, "warn", "loops")],
        rollbacks=[{"at": 7, "rule": "collapse", "to": 4, "trips_before": 1}],
        outcome="rolled back 1x, warned",
    )
    assert tags_of(record)["r1.guard.reason"] == "repetition at step 7: loops"
    rolled_back_only = GuardRecord(trips=record.trips[:1], rollbacks=record.rollbacks)
    assert [t["rule"] for t in rolled_back_only.last_trips()] == ["collapse"]

"""The RL guard's verdict where a person looks first: the stage run's tags and description in
MLflow (its `guard/` artifacts hold the record and the curves around each trip), and the note in
the per-stage table. A model that tripped a rule is registered without the stage's alias."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from guard.stop import trip_text
from stages.guarded import GuardRecord
from storage.tracking import MlflowTracker, alias_for
from tasks.context import RunContext
from tasks.run_pages import GUARD_TAG, RUN_DESCRIPTION_TAG


@dataclass
class StageGuard:
    """The guard's record of a GRPO stage, once the stage has run."""

    stage: str
    record: GuardRecord | None = None

    @property
    def promoted(self) -> bool:
        """Whether the stage's model may have the stage's alias: no rule tripped on the branch
        that made it."""
        return self.record is None or not self.record.tripped()

    def notes(self) -> dict[str, str]:
        return guard_notes(self.record, self.stage)


@contextmanager
def guard_reported(ctx: RunContext, tracker: MlflowTracker, stage: str) -> Iterator[StageGuard]:
    """Around a GRPO stage's run: whatever happens in it (a stop included), its MLflow run is
    tagged with the guard's record, which the yielded StageGuard then holds."""
    found = StageGuard(stage)
    try:
        yield found
    finally:
        found.record = GuardRecord.find(ctx.stage_dir(stage))
        tag_guard(tracker, found.record)


def trips_text(record: GuardRecord) -> str:
    """`reward_without_skill@37 (stop), ...`: every trip, in order."""
    return ", ".join(f"{t['rule']}@{t['step']} ({t['action']})" for t in record.trips)


def last_text(record: GuardRecord) -> str:
    """`reward_without_skill at step 12: ...; gamed_term at step 12: ...`: every rule of the
    guard's last verdict, the primary first (rules trip together: the last one recorded alone
    would hide the others, and may have only warned beside a stop)."""
    return "; ".join(f"{t['rule']} at step {t['step']}: {t['reason']}" for t in record.last_trips())


def stopped_text(record: GuardRecord) -> str:
    """The run description of a stopped stage: its step and every rule that tripped there."""
    last = record.last_trips()
    named = "; ".join(trip_text(t) for t in last)
    return (
        f"**The guard stopped this stage** at step {last[0]['step']}: {named}. Its model is not "
        "registered; the curves around each trip are among the artifacts under `guard/`."
    )


def tag_guard(tracker: MlflowTracker, record: GuardRecord | None) -> None:
    """The run's `r1.guard` tags (outcome, trips, the last verdict's rules with their reasons)
    and the guard's own time; a stopped stage's description says why it stopped."""
    client, run_id = tracker.client, tracker.run_id
    if record is None:
        client.set_tag(run_id, GUARD_TAG, "off")
        return
    client.set_tag(run_id, GUARD_TAG, record.outcome)
    client.set_tag(run_id, f"{GUARD_TAG}.rules", ", ".join(record.rules) or "none")
    if record.idle:
        idle = "; ".join(f"{rule}: {why}" for rule, why in record.idle.items())
        client.set_tag(run_id, f"{GUARD_TAG}.idle", idle)
    if record.trips:
        client.set_tag(run_id, f"{GUARD_TAG}.trips", trips_text(record)[:4000])
        client.set_tag(run_id, f"{GUARD_TAG}.reason", last_text(record)[:4000])
    tracker.log_metrics({"guard/seconds": record.seconds})
    if record.outcome == "stopped" and record.trips:
        client.set_tag(run_id, RUN_DESCRIPTION_TAG, stopped_text(record))


def guard_notes(record: GuardRecord | None, stage: str) -> dict[str, str]:
    """The stage table's note: `guard clean`, or what tripped and that the model did not get
    the stage's alias."""
    if record is None:
        return {}
    tripped = record.tripped()
    note = record.outcome
    if tripped:
        rules = ", ".join(f"{t['rule']}@{t['step']}" for t in tripped)
        note = f"{record.outcome} ({rules}), not registered as @{alias_for(stage)}"
    elif record.rollbacks:
        rules = ", ".join(f"{r['rule']}@{r['at']}" for r in record.rollbacks)
        note = f"{record.outcome} (after {rules})"
    return {"guard": note}

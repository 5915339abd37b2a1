"""The RL guard's verdict where a person looks first: the stage run's tags and description in
MLflow (its `guard/` artifacts hold the record and the curves around each trip), and the note in
the per-stage table. A model that tripped a rule is registered without the stage's alias."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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


def tag_guard(tracker: MlflowTracker, record: GuardRecord | None) -> None:
    """The run's `r1.guard` tags (outcome, trips, the deciding trip's reason and numbers) and
    the guard's own time; a stopped stage's description says why it stopped."""
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
        last = record.trips[-1]
        client.set_tag(run_id, f"{GUARD_TAG}.trips", trips_text(record)[:4000])
        client.set_tag(
            run_id,
            f"{GUARD_TAG}.reason",
            f"{last['rule']} at step {last['step']}: {last['reason']}"[:4000],
        )
    tracker.log_metrics({"guard/seconds": record.seconds})
    if record.outcome == "stopped":
        last = record.trips[-1]
        client.set_tag(
            run_id,
            RUN_DESCRIPTION_TAG,
            f"**The guard stopped this stage** at step {last['step']}: rule {last['rule']}: "
            f"{last['reason']}. Its model is not registered; the curves around the trip are "
            "among the artifacts under `guard/`.",
        )


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

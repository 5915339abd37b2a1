"""A guard's stop as the stage raises it: `GuardStop` names every rule that tripped at the
step, the primary one first (several rules can trip together, and the one checked first is not
the only one that matters), with their numbers and the checkpoint kept. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class GuardStop(RuntimeError):
    """The guard stopped a stage: the message names every rule that tripped at the step, their
    numbers, the step and the checkpoint that is kept. `trips`: each trip's dict with its
    action, the primary first; `trip`: the primary, for a reader that wants one rule."""

    def __init__(
        self, desc: str, trips: Sequence[dict[str, Any]], kept: int, ckpt_dir: str
    ) -> None:
        listed = [trips] if isinstance(trips, dict) else list(trips)  # one trip, as it once was
        self.desc, self.trips, self.kept, self.ckpt_dir = desc, listed, kept, ckpt_dir
        self.trip = listed[0]
        super().__init__(stop_message(desc, listed, kept, ckpt_dir))

    @property
    def rules(self) -> list[str]:
        """Every rule that tripped at the step, the primary first."""
        return [t["rule"] for t in self.trips]

    def __reduce__(self):  # picklable: Prefect stores a failed task's error
        return (type(self), (self.desc, self.trips, self.kept, self.ckpt_dir))


def trip_text(trip: dict[str, Any]) -> str:
    """`rule gamed_term: format adds ...`; a trip that asked for less than a stop says so."""
    action = trip.get("action", "stop")
    asked = "" if action == "stop" else f" ({action})"
    return f"rule {trip['rule']}{asked}: {trip['reason']}"


def stop_message(desc: str, trips: Sequence[dict[str, Any]], kept: int, ckpt_dir: str) -> str:
    """What a stop says: the step, each rule that tripped there, and what is kept (from before
    the window of every rule that asked for the stop)."""
    stopping = [t for t in trips if t.get("action", "stop") == "stop"]
    window = "the rule's window" if len(stopping) <= 1 else "the rules' windows"
    where = (
        f"the checkpoint of step {kept}, before {window}, is kept in {ckpt_dir}"
        if kept > 0
        else f"no checkpoint before {window}: none is kept"
        if kept == 0
        else f"the workers' last committed checkpoint is kept in {ckpt_dir}"
    )
    named = "; ".join(trip_text(t) for t in trips)
    return (
        f"{desc}: the guard stopped the stage at step {trips[0]['step']}: {named}; {where}; "
        "its model is not registered"
    )

"""A flow run whose process is gone ends Crashed: `python -m cli.heartbeats` puts on the Prefect
server the automations that mark a flow run Crashed when its heartbeats stop, and Cancelled when
it was being cancelled (`scripts/serve.sh` runs it after each start).

Prefect 3.8.8 offers exactly this and nothing built in: a deployment's flow run sends the event
`prefect.flow-run.heartbeat` every `PREFECT_FLOWS_HEARTBEAT_FREQUENCY` seconds (30 at the least;
prefect.yaml sets 30 for every deployment), and an automation with a proactive trigger fires when,
`within` seconds after one heartbeat, neither another nor a change of state came. Its action
moves the run to Crashed, which `r1 runs` lists, which ends `r1 watch`, and which `prefect flow-run
retry` resumes from the last checkpoint. The server keeps the trigger's windows in its database,
so a run whose machine went down with the stack is marked once the stack is back. A worker that
stops cleanly ends its runs at once (cli/worker.py); this catches what nothing could report: a
worker or flow-run process killed outright, a machine that went down.
(https://docs.prefect.io/v3/advanced/detect-zombie-flows is Prefect's own recipe.)
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

NAME = "r1: crash flow runs whose heartbeats stop"
CANCEL_NAME = "r1: end the cancellation of flow runs whose heartbeats stop"
HEARTBEAT_SECONDS = 30  # prefect.yaml's PREFECT_FLOWS_HEARTBEAT_FREQUENCY; Prefect's least
TIMEOUT_SECONDS = 90  # three heartbeats missed
# After a heartbeat (or the move to Running), a move to one of these states answers as well as
# the next heartbeat: the run ended, waits on purpose, or starts another attempt (a retry, whose
# heartbeats follow). Cancelling is not one of them: a run whose process is gone never gets past
# it by itself. Nor is Running: the server may read a run's Running after its first heartbeat
# (the two travel apart), and a Running read as the answer would leave a run that dies before its
# second heartbeat watched by nothing, Running for ever.
ANSWERS = (
    "Completed", "Failed", "Cancelled", "Crashed", "Paused", "Suspended",
    "Scheduled", "AwaitingRetry", "Pending", "Retrying",
)  # fmt: skip
ENDED = ("Completed", "Failed", "Cancelled", "Crashed")


def crash_message(within: float) -> str:
    return (
        f"No heartbeat for {within:.0f} s: the flow run's process or its worker is gone "
        "(killed, or its machine went down). Retry it to resume from its last checkpoint."
    )


def cancel_message(within: float) -> str:
    return (
        f"Cancelled: no heartbeat for {within:.0f} s after it was asked to cancel, so its "
        "process was already gone and nothing was left to stop."
    )


def automations(within: float = TIMEOUT_SECONDS) -> list[Any]:
    """The two automations, each proactive, per flow run:
    - after a heartbeat or the move to Running, expect a heartbeat, or a move to a state that
      ends or parks the run, within `within` seconds; otherwise set the run Crashed;
    - after a move to Cancelling, expect a heartbeat (its process is alive: its worker stops
      it) or its end, within `within` seconds; otherwise set it Cancelled, which is what was
      asked (Prefect lets a cancelling run go nowhere else, so the first cannot end it).
    A run that has already ended stays as it ended: Prefect refuses to move a final state (the
    actions are not forced), so a heartbeat that reaches the server after the run's end
    changes nothing."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    if within <= HEARTBEAT_SECONDS:
        raise ValueError(
            f"a heartbeat timeout of {within:.0f} s would crash live runs: heartbeats come "
            f"every {HEARTBEAT_SECONDS} s; give more than that (default {TIMEOUT_SECONDS})"
        )

    def unheard(after: tuple[str, ...], answers: tuple[str, ...]) -> EventTrigger:
        return EventTrigger(
            after={f"prefect.flow-run.{event}" for event in after},
            expect={"prefect.flow-run.heartbeat"} | {f"prefect.flow-run.{s}" for s in answers},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within),
        )

    sent = f"the deployments send one every {HEARTBEAT_SECONDS} s (prefect.yaml)"
    return [
        AutomationCore(
            name=NAME,
            description=f"Marks a flow run Crashed when its heartbeats stop; {sent}.",
            trigger=unheard(("heartbeat", "Running"), ANSWERS),
            actions=[ChangeFlowRunState(state=StateType.CRASHED, message=crash_message(within))],
        ),
        AutomationCore(
            name=CANCEL_NAME,
            description=f"Marks a cancelling flow run Cancelled when it is unheard; {sent}.",
            trigger=unheard(("Cancelling",), ENDED),
            actions=[ChangeFlowRunState(state=StateType.CANCELLED, message=cancel_message(within))],
        ),
    ]


def ensure_automations(client: Any, within: float = TIMEOUT_SECONDS) -> list[str]:
    """Create the automations, or bring those of their names up to date; their ids. One that
    is already as wanted is left alone: an update gives its trigger a new id on the server,
    which forgets the windows of the runs it is watching (a run that died while the stack was
    down would never be marked)."""
    ids = []
    for wanted in automations(within):
        found = client.read_automations_by_name(wanted.name)
        for extra in found[1:]:
            client.delete_automation(extra.id)
        if not found:
            ids.append(str(client.create_automation(wanted)))
            continue
        if not same_automation(found[0], wanted):
            client.update_automation(found[0].id, wanted)
        ids.append(str(found[0].id))
    return ids


def same_automation(found: Any, wanted: Any) -> bool:
    def core(automation: Any) -> dict:
        return automation.model_dump(mode="json", include=set(type(wanted).model_fields))

    return core(found) == core(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.heartbeats", description=__doc__)
    parser.add_argument(
        "--within",
        type=float,
        default=TIMEOUT_SECONDS,
        help=f"seconds without a heartbeat before a run is Crashed (default {TIMEOUT_SECONDS})",
    )
    args = parser.parse_args(argv)
    from prefect import get_client

    try:
        automations(args.within)
    except ValueError as err:
        print(f"heartbeats: {err}", file=sys.stderr)
        return 2
    with get_client(sync_client=True) as client:
        ensure_automations(client, args.within)
    print(f"a flow run unheard for {args.within:.0f} s ends Crashed (Cancelled if cancelling)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

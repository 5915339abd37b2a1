"""A flow run whose process is gone ends Crashed: `python -m cli.heartbeats` puts on the Prefect
server the automation that marks a flow run Crashed when its heartbeats stop
(`scripts/serve.sh` runs it after each start).

Prefect 3.8.8 offers exactly this and nothing built in: a deployment's flow run sends the event
`prefect.flow-run.heartbeat` every `PREFECT_FLOWS_HEARTBEAT_FREQUENCY` seconds (30 at the least;
prefect.yaml sets 30 for every deployment), and an automation with a proactive trigger fires when,
`within` seconds after one heartbeat, neither another nor a final state came. Its action moves
the run to Crashed, which `r1 runs` lists, which ends `r1 watch`, and which `prefect flow-run
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
HEARTBEAT_SECONDS = 30  # prefect.yaml's PREFECT_FLOWS_HEARTBEAT_FREQUENCY; Prefect's least
TIMEOUT_SECONDS = 90  # three heartbeats missed
# After a heartbeat, a move to one of these states answers as well as the next heartbeat: the
# run ended, waits on purpose, or starts another attempt (a retry, whose heartbeats follow).
# Cancelling is not one of them: a run whose process is gone never gets past it by itself.
ANSWERS = (
    "Completed", "Failed", "Cancelled", "Crashed", "Paused", "Suspended",
    "Scheduled", "AwaitingRetry", "Pending", "Running", "Retrying",
)  # fmt: skip


def crash_message(within: float) -> str:
    return (
        f"No heartbeat for {within:.0f} s: the flow run's process or its worker is gone "
        "(killed, or its machine went down). Retry it to resume from its last checkpoint."
    )


def automation(within: float = TIMEOUT_SECONDS) -> Any:
    """The automation: after a flow run's heartbeat, expect another one, or a move to another
    state, within `within` seconds; otherwise set the run Crashed. A run that has already ended
    stays as it ended: Prefect refuses to move a final state (the action is not forced), so a
    heartbeat that reaches the server after the run's end changes nothing."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    if within <= HEARTBEAT_SECONDS:
        raise ValueError(
            f"a heartbeat timeout of {within:.0f} s would crash live runs: heartbeats come "
            f"every {HEARTBEAT_SECONDS} s; give more than that (default {TIMEOUT_SECONDS})"
        )
    return AutomationCore(
        name=NAME,
        description=(
            "Marks a flow run Crashed when its heartbeats stop (cli/heartbeats.py); "
            f"the deployments send one every {HEARTBEAT_SECONDS} s (prefect.yaml)."
        ),
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat"} | {f"prefect.flow-run.{s}" for s in ANSWERS},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, message=crash_message(within))],
    )


def ensure_automation(client: Any, within: float = TIMEOUT_SECONDS) -> str:
    """Create the automation, or bring the one of that name up to date; its id. One that is
    already as wanted is left alone: an update gives its trigger a new id on the server, which
    forgets the windows of the runs it is watching (a run that died while the stack was down
    would never be marked)."""
    wanted = automation(within)
    found = client.read_automations_by_name(NAME)
    for extra in found[1:]:
        client.delete_automation(extra.id)
    if not found:
        return str(client.create_automation(wanted))
    if not same_automation(found[0], wanted):
        client.update_automation(found[0].id, wanted)
    return str(found[0].id)


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
        automation(args.within)
    except ValueError as err:
        print(f"heartbeats: {err}", file=sys.stderr)
        return 2
    with get_client(sync_client=True) as client:
        automation_id = ensure_automation(client, args.within)
    print(f"automation {NAME!r} ({automation_id}): Crashed after {args.within:.0f} s unheard")
    return 0


if __name__ == "__main__":
    sys.exit(main())

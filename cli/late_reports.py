"""The worker's late report of a crash does not undo a retry sent before it.

When a flow run's process dies, Prefect 3.8.8 marks the run Crashed at once, runs the flow's
crash hooks in a process of their own, and only when that process has ended does the worker
propose Crashed a second time (`BaseWorker._propose_crashed_state`). The server accepts that
proposal over any state: a `prefect flow-run retry` sent in between (the run Scheduled again,
even already Pending or Running again) was turned back to Crashed, and the retry was lost
without a word. `RetryKeepingWorker` reads the run's states first and leaves a run that was
scheduled again after this attempt ended alone, saying so in the run's logs.

What is left: a retry that reaches the server between the read and the report (one request's
time, against the seconds the crash hooks take).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from prefect.client.schemas.objects import StateType
from prefect.workers.process import ProcessWorker

ENDED = frozenset({StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED})


def retried_since(states: Sequence[Any], submitted: datetime) -> bool:
    """Whether, among a flow run's `states` later than `submitted` (the state it was in when the
    worker took it), an ending is followed by a Scheduled state: the attempt the worker ran
    ended and the run was scheduled again (a retry)."""
    ended = False
    for state in sorted(states, key=lambda state: state.timestamp):
        if state.timestamp <= submitted:
            continue
        if state.type in ENDED:
            ended = True
        elif ended and state.type == StateType.SCHEDULED:
            return True
    return False


# The subclass takes the key "process" in Prefect's registry of worker types (in the processes
# that load this module), with the process worker's job template: Prefect warns of that.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Type 'RetryKeepingWorker'", UserWarning)

    class RetryKeepingWorker(ProcessWorker):
        """Prefect's process worker whose report of a crashed attempt leaves a retried run
        alone."""

        async def _propose_crashed_state(
            self, flow_run: Any, message: str, client: Any = None
        ) -> None:
            client = client or self.client
            if flow_run.state is not None:
                states = await client.read_flow_run_states(flow_run.id)
                if retried_since(states, flow_run.state.timestamp):
                    self.get_flow_run_logger(flow_run).info(
                        f"Not reported as crashed ({message}): the flow run was retried since, "
                        "and the retry goes on."
                    )
                    return
            await super()._propose_crashed_state(flow_run, message, client=client)

"""The worker's late report of a crash does not undo a retry sent before it.

When a flow run's process dies, Prefect 3.8.8 marks the run Crashed at once, runs the flow's
crash hooks in a process of their own, and only when that process has ended does the worker
propose Crashed a second time (`BaseWorker._propose_crashed_state`). The server accepts that
proposal over any state: a `prefect flow-run retry` sent in between (the run Scheduled again,
even already Pending or Running again) was turned back to Crashed, and the retry was lost
without a word. `RetryKeepingWorker` notes when it took each attempt, reads the run's states
before the late report and leaves alone a run scheduled again after that attempt ended, saying
so in the run's logs. (The flow run a worker takes from the server carries no state: the
attempt's start is the worker's own note.)

What is left: a retry that reaches the server between the read and the report (one request's
time, against the seconds the crash hooks take).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from prefect.client.schemas.objects import StateType
from prefect.workers.process import ProcessWorker

ENDED = frozenset({StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED})


def retried_since(states: Sequence[Any], submitted: datetime) -> bool:
    """Whether, among a flow run's `states` later than `submitted` (when the worker took the
    attempt), an ending is followed by a Scheduled state: the attempt the worker ran ended and
    the run was scheduled again (a retry)."""
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

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.taken: dict[int, datetime] = {}  # id of each attempt's flow run -> when taken

        async def _submit_run_and_capture_errors(
            self, flow_run: Any, task_status: Any = None
        ) -> Any:
            """An attempt, from its submission to its process's end and the report after."""
            self.taken[id(flow_run)] = datetime.now(UTC)
            try:
                return await super()._submit_run_and_capture_errors(flow_run, task_status)
            finally:
                self.taken.pop(id(flow_run), None)

        async def _propose_crashed_state(
            self, flow_run: Any, message: str, client: Any = None
        ) -> None:
            client = client or self.client
            taken = self.taken.get(id(flow_run))
            if taken is not None:
                states = await client.read_flow_run_states(flow_run.id)
                if retried_since(states, taken):
                    self.get_flow_run_logger(flow_run).info(
                        f"Not reported as crashed ({message}): the flow run was retried since, "
                        "and the retry goes on."
                    )
                    return
            await super()._propose_crashed_state(flow_run, message, client=client)

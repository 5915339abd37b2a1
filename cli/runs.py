"""`r1 runs`: the recent flow runs of the Prefect server, each id whole (to paste into `prefect
flow-run retry`), and for a failed or crashed run the stage that failed and why.

`prefect flow-run ls` fits its table to the terminal, and at 80 columns cuts the id to
`ef21620f-1749-49b6-96a6-3a90c9c...`; this prints one run a line, its id first and whole,
the reason on the next.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cli.failures import SKIPPED, WIDTH, failure_reason, reason_lines, retry_helps, settled
from storage.paths import StatePaths

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SERVE_ENV = "serve.env"  # written by scripts/serve.sh into the state folder
STATE_TYPES = ("scheduled", "pending", "running", "completed", "failed", "cancelled", "crashed")
MAX_RUNS = 200  # the most flow runs Prefect's server answers one read with
UNSET = "not set: start the stack with `bash scripts/serve.sh`, or export PREFECT_API_URL"


class NoServer(RuntimeError):
    """No Prefect server to ask; the message says how to have one."""


@dataclass(frozen=True)
class Served:
    """The Prefect API that `r1 runs` and `r1 watch` ask, and the state folder that named it: what
    a command they print needs to find the same stack in a new shell, run from the project's root
    (where neither `PREFECT_API_URL` nor `R1_STATE_DIR` is set)."""

    api_url: str
    state_root: Path

    def retry(self, run_id: str) -> str:
        """`prefect flow-run retry` with the stack's API in front: without it, a new shell's
        `prefect` asks a temporary server of its own, which answers "Flow run ... not found"."""
        return f"PREFECT_API_URL={self.api_url} {command_path('prefect')} flow-run retry {run_id}"

    def watch(self, run_id: str) -> str:
        """`r1 watch`, with the state folder when it is not the default `./state`."""
        watch = f"{command_path('r1')} watch {run_id}"
        if self.state_root == Path("state").resolve():
            return watch
        return f"{watch} --state-dir {shlex.quote(str(self.state_root))}"


def command_path(name: str) -> str:
    """The command `name` of the environment this process runs in, as typed at the project's
    root: `.venv/bin/NAME` for the project's own `.venv`, the whole path for one elsewhere
    (`R1_VENV`), where `.venv/bin/NAME` would not be found."""
    command = Path(sys.executable).parent.resolve() / name
    try:
        return str(command.relative_to(PROJECT_ROOT))
    except ValueError:
        return shlex.quote(str(command))


def use_served_api(paths: StatePaths) -> str:
    """The Prefect API to ask: `PREFECT_API_URL`, else the one `scripts/serve.sh` started for
    this state folder (its `serve.env`). Sets it for this process; raises NoServer if neither."""
    url = os.environ.get("PREFECT_API_URL") or served_api_url(paths.root / SERVE_ENV)
    if not url:
        raise NoServer(f"PREFECT_API_URL is {UNSET}")
    os.environ["PREFECT_API_URL"] = url
    return url


def served_api_url(env_file: Path) -> str | None:
    if not env_file.exists():
        return None
    try:
        text = env_file.read_text()
    except (OSError, UnicodeDecodeError) as err:
        why = "is a folder" if env_file.is_dir() else f"cannot be read ({err})"
        raise NoServer(
            f"{env_file} {why}, not the file scripts/serve.sh writes: remove it and start the "
            "stack again, or set PREFECT_API_URL"
        ) from None
    found = re.search(r"PREFECT_API_URL=(\S+)", text)
    return found.group(1) if found else None


@dataclass(frozen=True)
class RunLine:
    """One flow run as `r1 runs` prints it."""

    id: str
    state: str
    source: str  # deployment `flow/name`, or the flow's name for a run started by `r1 run`
    started: datetime | None
    reason: str = ""  # for a failed or crashed run: the stage that failed, and why
    deployed: bool = True  # False for a run `r1 run` started: Prefect cannot retry it
    note: str = ""  # for a skipped run: when it was due and the run that took its place

    def lines(self) -> list[str]:
        """The run's line; its deployment on the next when the line would pass 80 columns
        (`evaluate-model/final-nightly`), then the reason or note, each line indented under the
        run."""
        when = self.started.strftime("%m-%d %H:%M") if self.started else "-"
        head = f"{self.id}  {self.state:<10} {when:<11}"
        if len(f"{head} {self.source}") <= WIDTH:
            lines = [f"{head} {self.source}"]
        else:
            lines = [head.rstrip(), f"    deployment {self.source}"]
        said = self.reason or self.note
        return lines + reason_lines(said, "    ") if said else lines


def skipped_note(run: Any) -> str:
    """For a scheduled run the worker skipped (cli/missed_runs.py), what its state says: when
    it was due and the run that took its place; nothing for any other run."""
    state = run.state
    if state is None or not state.is_cancelled() or state.name != SKIPPED:
        return ""
    return (state.message or "").removeprefix(f"{SKIPPED}: ")


def run_lines(client: Any, states: list[str], limit: int) -> list[RunLine]:
    """The `limit` latest flow runs, newest first by the time each line shows (when it started,
    else when it was to start): those in `states`, or when none is given, every run but the
    scheduled ones (the nightly evaluation's calendar). A run that started late (a scheduled run
    the worker took days after its time) is where it started, not where it was due."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    wanted = states or [state for state in STATE_TYPES if state != "scheduled"]
    types = [StateType(state.upper()) for state in wanted]
    state_filter = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=types)))
    runs = client.read_flow_runs(
        flow_run_filter=state_filter, sort=FlowRunSort.START_TIME_DESC, limit=limit
    )
    names = flow_names(client, runs)
    lines = []
    for run in runs:
        failed = run.state is not None and run.state.type in (StateType.FAILED, StateType.CRASHED)
        lines.append(
            RunLine(
                str(run.id),
                run.state.name if run.state else "-",
                names.get(run.id, "-"),
                run.start_time or run.expected_start_time,
                failure_reason(client, run) if failed else "",
                run.deployment_id is not None,
                skipped_note(run),
            )
        )
    return lines


def flow_names(client: Any, runs: list[Any]) -> dict[Any, str]:
    """Each run's deployment as `flow/deployment`, or its flow's name when it has none."""
    flows: dict[Any, str] = {}
    deployments: dict[Any, str] = {}
    named = {}
    for run in runs:
        if run.flow_id not in flows:
            flows[run.flow_id] = client.read_flow(run.flow_id).name
        flow = flows[run.flow_id]
        if run.deployment_id is None:
            named[run.id] = flow
            continue
        if run.deployment_id not in deployments:
            deployments[run.deployment_id] = client.read_deployment(run.deployment_id).name
        named[run.id] = f"{flow}/{deployments[run.deployment_id]}"
    return named


def connect(state_dir: str | None) -> Served:
    """Point this process at the Prefect server that serves the state folder (one that is there:
    asking creates none); raises NoServer, saying what is missing, when there is none."""
    paths = StatePaths(Path(state_dir).resolve()) if state_dir else StatePaths.from_env()
    if paths.root.is_dir():
        from cli.environment import prepare_environment

        prepare_environment(paths.root)
    return Served(use_served_api(paths), paths.root)


def unreachable(url: str) -> str:
    """The sentence for a Prefect server that does not answer when a command starts."""
    return (
        f"no Prefect server answers at {url}: start the stack with `bash scripts/serve.sh` "
        "(or point PREFECT_API_URL at a running server)"
    )


def runs_command(state_dir: str | None, states: list[str], limit: int) -> int:
    try:
        served = connect(state_dir)
    except NoServer as err:
        print(f"r1 runs: {err}", file=sys.stderr)
        return 2
    import httpx
    from prefect import get_client

    try:
        with get_client(sync_client=True) as client:
            lines = run_lines(client, states, limit)
    except httpx.TransportError:
        print(f"r1 runs: {unreachable(served.api_url)}", file=sys.stderr)
        return 2
    print(f"{'flow run id':<36}  {'state':<10} {'UTC start':<11} deployment")
    for line in lines:
        print("\n".join(line.lines()))
    if not lines:
        print("no flow runs" + (f" in state {', '.join(states)}" if states else ""))
    elif steps := next_steps(lines, served):
        print("\n" + "\n".join(steps))
    return 0


def next_steps(lines: list[RunLine], served: Served) -> list[str]:
    """What to do about the failures listed: the retry of a deployment's run, or for a run
    `r1 run` started (no deployment, which a retry needs) the same command again, where either
    can end otherwise; for a failure that they meet again (a bad setting), to fix it and start
    a new run; nothing for a crash the same command already resumed."""
    failed = [line for line in lines if line.reason and not settled(line.reason)]
    resumable = [line for line in failed if retry_helps(line.reason)]
    steps = []
    if any(line.deployed for line in resumable):
        steps += [f"retry one: {served.retry('<id>')}", f"then follow it: {served.watch('<id>')}"]
    if not all(line.deployed for line in resumable):
        steps += ["resume one `r1 run` started: run that same r1 run command again"]
    if len(resumable) < len(failed):
        steps += [
            "a bad setting, a missing input or a regression fails a retry the same way:",
            "fix what the reason says, then start a new run (prefect deployment run ..., r1 run)",
        ]
    return steps

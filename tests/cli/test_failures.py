"""What `r1 runs` and `r1 watch` say of a failed or crashed run, against a stand-in for the
Prefect client that holds the flow run's task runs."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from uuid import uuid4

from prefect.client.schemas.objects import StateType

from cli.failures import WIDTH, crashed_stage, exception_text, failure_reason, reason_lines
from cli.heartbeats import crash_message
from cli.worker import orphan_message

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
CONFIG_ERROR = (
    "Flow run encountered an exception: ConfigError: /work/main/configs/micro.yaml: "
    "2 invalid setting(s)\n  cold_start_sft.train.epohcs: Extra inputs are not permitted\n"
    "  reasoning_rl.grpo.group_size: Input should be greater than or equal to 2"
)


def state(kind: str, message: str = "") -> SimpleNamespace:
    return SimpleNamespace(type=StateType(kind), name=kind.title(), message=message, timestamp=T0)


def task_run(name: str, kind: str, minute: int) -> SimpleNamespace:
    return SimpleNamespace(name=name, state=state(kind), start_time=T0 + timedelta(minutes=minute))


class Client:
    def __init__(self, task_runs: list[SimpleNamespace]):
        self.task_runs = task_runs

    def read_task_runs(self, **_filters) -> list[SimpleNamespace]:
        return self.task_runs


def flow_run(kind: str, message: str) -> SimpleNamespace:
    return SimpleNamespace(id=uuid4(), state=state(kind, message))


STAGES = [
    task_run("open-pipeline-run", "COMPLETED", 0),
    task_run("cold_start_sft", "COMPLETED", 1),
    task_run("evaluate: cold_start_sft", "COMPLETED", 2),
    task_run("reasoning_rl", "RUNNING", 3),
]


def test_a_crash_names_the_stage_it_stopped_what_happened_and_what_to_do():
    for message in (
        "Execution was aborted by a termination signal.",
        crash_message(90),
        orphan_message("r1-local", "CRASHED"),
    ):
        reason = failure_reason(Client(STAGES), flow_run("CRASHED", message))
        assert reason.startswith("in reasoning_rl: "), reason
        assert reason.count("Retry it to resume from its last checkpoint.") == 1, reason
    signal = failure_reason(
        Client(STAGES), flow_run("CRASHED", "Execution was aborted by a termination signal.")
    )
    assert "stopped by a signal" in signal


def test_the_crashed_stage_is_the_last_one_left_running_or_crashed():
    later = [*STAGES, task_run("mixed_sft", "PENDING", 5)]
    later[-1].start_time = None  # never started
    assert crashed_stage(later) == "reasoning_rl"
    done = [task_run("bootstrap", "COMPLETED", 0), task_run("evaluate: bootstrap", "COMPLETED", 1)]
    assert crashed_stage(done) == "evaluate: bootstrap"
    assert crashed_stage([]) is None
    assert failure_reason(Client([]), flow_run("CRASHED", crash_message(90))).startswith("No ")


def test_a_failed_stage_and_a_bad_setting_read_as_before():
    failed = task_run("reasoning_rl", "FAILED", 3)
    failed.state.message = "Task run encountered an exception InjectedFailure: reasoning_rl: x"
    reason = failure_reason(Client([*STAGES[:3], failed]), flow_run("FAILED", "x"))
    assert reason == "reasoning_rl: InjectedFailure: reasoning_rl: x"
    assert exception_text(CONFIG_ERROR).startswith("ConfigError: /work/main/configs/micro.yaml")


def test_reason_lines_fit_the_terminal_and_indent_alike():
    reason = failure_reason(Client([]), flow_run("FAILED", CONFIG_ERROR))
    lines = reason_lines(reason, "    ")
    assert all(len(line) <= WIDTH for line in lines), lines
    assert lines[0].startswith("    ConfigError: ")
    keys = [line for line in lines if ": Extra inputs" in line or ".group_size: " in line]
    assert [line[: len(line) - len(line.lstrip())] for line in keys] == ["      "] * 2
    crash = failure_reason(Client(STAGES), flow_run("CRASHED", crash_message(90)))
    wrapped = reason_lines(crash, "    ")
    assert len(wrapped) > 1 and all(len(line) <= WIDTH for line in wrapped), wrapped
    assert all(line.startswith("    ") and line[4] != " " for line in wrapped)
    assert " ".join(line.strip() for line in wrapped) == crash

"""What `r1 runs` and `r1 watch` say of a failed or crashed run, against a stand-in for the
Prefect client that holds the flow run's task runs."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import StateType

from cli.failures import (
    WIDTH,
    crashed_stage,
    exception_text,
    failure_reason,
    named_once,
    reason_lines,
)
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


def flow_run(kind: str, message: str, deployed: bool = True) -> SimpleNamespace:
    deployment = uuid4() if deployed else None  # None: a run `r1 run` started
    return SimpleNamespace(id=uuid4(), state=state(kind, message), deployment_id=deployment)


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
    assert "termination signal (its worker stopped, or it was killed)" in signal


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
    assert reason == "reasoning_rl: InjectedFailure: x"  # the stage named once
    assert exception_text(CONFIG_ERROR).startswith("ConfigError: /work/main/configs/micro.yaml")


def test_the_stage_is_named_once_where_the_exception_names_it_too():
    said = "StateDiskError: rejection_sampling: the disk of /s is full (0 B free of 18.0 MiB)"
    assert named_once("rejection_sampling", said) == (
        "StateDiskError: the disk of /s is full (0 B free of 18.0 MiB)"
    )
    kept = [
        "InjectedFailure: cold_start_sft: x",  # another stage's name: said as it is
        "reasoning_rl: x",  # no exception's name in front
        "ValueError: reasoning_rl_old: x",  # a name that only begins like the stage's
        "ValueError: reasoning_rl",
        "",
    ]
    assert [named_once("reasoning_rl", text) for text in kept] == kept


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


SERVED_RUN = "b6d5cab5-ff6f-4e51-8c9b-d34850b1b422"


def served(tmp_path):
    from cli.runs import Served

    return Served("http://127.0.0.1:4200/api", tmp_path)


def test_r1_runs_says_to_fix_a_bad_setting_rather_than_retry(tmp_path):
    from cli.runs import next_steps

    bad = listed(failure_reason(Client([]), flow_run("FAILED", CONFIG_ERROR)))
    crash = listed(failure_reason(Client(STAGES), flow_run("CRASHED", crash_message(90))))
    only_bad = next_steps([bad, bad], served(tmp_path))
    assert not any("retry one" in step for step in only_bad), only_bad
    assert any("fix what the reason says" in step for step in only_bad), only_bad
    mixed = "\n".join(next_steps([bad, crash], served(tmp_path)))
    assert "retry one: " in mixed and "fix what the reason says" in mixed
    assert "fix what" not in "\n".join(next_steps([crash], served(tmp_path)))


def listed(reason: str, deployed: bool = True):
    from cli.runs import RunLine

    return RunLine(SERVED_RUN, "Failed", "r1_pipeline", T0, reason, deployed)


def test_a_run_r1_run_started_is_resumed_by_the_same_command_not_a_retry(tmp_path):
    """Prefect refuses `prefect flow-run retry` for a run with no deployment: `r1 runs` says to
    run the same `r1 run` command again, and a crash that command resumed asks for nothing."""
    from cli.runs import next_steps
    from tasks.resume import RESUMED_MESSAGE

    failed = task_run("reasoning_rl", "FAILED", 3)
    failed.state.message = "Task run encountered an exception InjectedFailure: reasoning_rl: x"
    mine = flow_run("FAILED", "x", deployed=False)
    steps = "\n".join(
        next_steps([listed(failure_reason(Client([failed]), mine), False)], served(tmp_path))
    )
    assert "flow-run retry" not in steps and "run that same r1 run command again" in steps, steps

    killed = failure_reason(Client(STAGES), flow_run("CRASHED", crash_message(90), deployed=False))
    assert "Retry it" not in killed and "Run the same r1 run command again" in killed, killed
    resumed = failure_reason(Client(STAGES), flow_run("CRASHED", RESUMED_MESSAGE, deployed=False))
    assert resumed == f"in reasoning_rl: {RESUMED_MESSAGE}", resumed
    assert next_steps([listed(resumed, False), listed(resumed, True)], served(tmp_path)) == []


def test_r1_runs_rows_fit_80_columns_with_every_reason_line_under_the_run(tmp_path):
    from cli.runs import RunLine

    for reason in (
        failure_reason(Client([]), flow_run("FAILED", CONFIG_ERROR)),
        failure_reason(Client(STAGES), flow_run("CRASHED", orphan_message("r1-local", "CRASHED"))),
    ):
        head, *lines = RunLine(SERVED_RUN, "Failed", "r1-pipeline/micro", T0, reason).lines()
        assert all(len(line) <= WIDTH for line in [head, *lines]), lines
        assert len(lines) > 1 and all(line.startswith("    ") for line in lines), lines


def test_r1_watch_says_how_a_run_ended_in_lines_that_fit_80_columns(tmp_path):
    from cli.runs import command_path
    from cli.watch import ending

    bin_dir = command_path("r1")[: -len("r1")]  # .venv/bin/, or another environment's whole path

    for kind, message in (
        ("CRASHED", "Execution was aborted by a termination signal."),
        ("CRASHED", crash_message(90)),
        ("FAILED", CONFIG_ERROR),
    ):
        run = flow_run(kind, message)
        run.state.is_completed = lambda: False
        run.state.is_failed = lambda kind=kind: kind == "FAILED"
        run.state.is_crashed = lambda kind=kind: kind == "CRASHED"
        lines, status = ending(Client(STAGES), run, served(tmp_path))
        commands = [line for line in lines if line.startswith(("  PREFECT_API", "  " + bin_dir))]
        assert status == 1 and all(len(line) <= WIDTH for line in lines if line not in commands)
        assert lines[0] == f"flow run {run.id} {kind.title()}:"
        if kind == "CRASHED":
            assert lines[1].startswith("  in reasoning_rl: ") and commands, lines


def test_r1_watch_wraps_a_long_log_line_under_its_time():
    from cli.watch import log_text

    words = "Finished in state Failed('Task run encountered an exception RegistryError: " * 2
    log = SimpleNamespace(message=f"short\n{words}", timestamp=T0)
    lines = log_text(log).splitlines()
    assert lines[0].endswith(" short") and len(lines[0]) == 14
    assert len(lines) > 2 and all(len(line) <= WIDTH for line in lines), lines
    assert all(line.startswith(" " * 9) for line in lines[1:])


def test_a_long_deployment_name_goes_on_a_line_of_its_own():
    from cli.runs import RunLine

    source = "evaluate-model/final-nightly"
    lines = RunLine(SERVED_RUN, "Completed", source, T0).lines()
    assert lines == [f"{SERVED_RUN}  Completed  11-28 12:00", f"    deployment {source}"]
    short = RunLine(SERVED_RUN, "Completed", "r1-pipeline/micro", T0).lines()
    assert short == [f"{SERVED_RUN}  Completed  11-28 12:00 r1-pipeline/micro"]


def test_r1_watch_says_to_run_the_same_command_again_for_a_run_r1_run_started(tmp_path):
    from prefect.states import Crashed, Failed

    from cli.watch import ending
    from tasks.resume import RESUMED_MESSAGE

    failed = task_run("reasoning_rl", "FAILED", 3)
    failed.state.message = "Task run encountered an exception InjectedFailure: reasoning_rl: x"
    run = SimpleNamespace(id=uuid4(), state=Failed(message="x"), deployment_id=None)
    lines, status = ending(Client([failed]), run, served(tmp_path))
    said = "\n".join(lines)
    assert status == 1 and "flow-run retry" not in said, said
    assert "run the same r1 run command again" in said, said
    run = SimpleNamespace(id=uuid4(), state=Crashed(message=RESUMED_MESSAGE), deployment_id=None)
    lines, _ = ending(Client(STAGES), run, served(tmp_path))
    said = " ".join(line.strip() for line in lines)
    assert said.endswith(f"in reasoning_rl: {RESUMED_MESSAGE}"), lines  # and nothing to do


def test_a_serve_env_that_is_a_folder_is_one_line(tmp_path):
    from cli.runs import NoServer, served_api_url

    (tmp_path / "serve.env").mkdir()
    with pytest.raises(NoServer, match="serve.env is a folder, not the file scripts/serve.sh"):
        served_api_url(tmp_path / "serve.env")

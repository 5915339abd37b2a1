"""What a person following a run reads: stage-named log lines, progress every tenth, short
tracebacks, and the plan that "stage i of n" counts."""

import logging
import sys

import pytest

from configs import load_profile
from evaluation.report import LINE_WIDTH
from tasks.plan import planned_stages
from tasks.progress import (
    LONG_WORDS,
    ProgressLines,
    TaskNamedFormatter,
    fitted,
    library_file,
    stage_position,
    step_text,
)


def shown(fractions: list[float]) -> list[float]:
    lines = ProgressLines()
    return [f for f in fractions if lines.due(f)]


def test_progress_is_shown_at_the_first_step_each_tenth_and_the_last():
    steps = 200
    fractions = [step / steps for step in range(1, steps + 1)]
    got = shown(fractions)
    assert got[0] == 1 / steps and got[-1] == 1.0
    assert len(got) == 11  # the first step, then every 20 steps (0.105, 0.21, ...), the last
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(got, got[1:-1], strict=False))


def test_a_short_stage_shows_each_step_a_repeated_end_once():
    assert shown([0.5, 1.0, 1.0]) == [0.5, 1.0]
    assert shown([1 / 3, 2 / 3, 1.0]) == [1 / 3, 2 / 3, 1.0]


def test_step_text_and_position():
    assert step_text(40, 0.2) == "step 40 of 200 (20%)"
    assert step_text(3, 0.0) == "step 3"
    plan = ("bootstrap", "reasoning_rl", "final")
    assert stage_position("reasoning_rl", plan) == "stage 2 of 3"
    assert stage_position("teacher", plan) == "stage"


def record(message: str, task_run_name: str | None, exc_info=None) -> logging.LogRecord:
    made = logging.LogRecord(
        "prefect.task_runs", logging.INFO, __file__, 1, message, None, exc_info
    )
    if task_run_name is not None:
        made.task_run_name = task_run_name
    return made


def test_a_task_runs_line_starts_with_its_name_once():
    formatter = TaskNamedFormatter()
    assert formatter.format(record("Finished in state Completed()", "reasoning_rl")) == (
        "reasoning_rl: Finished in state Completed()"
    )
    assert formatter.format(record("reasoning_rl: done", "reasoning_rl")) == "reasoning_rl: done"
    assert formatter.format(record("Beginning flow run", None)) == "Beginning flow run"


def bad_row(row: dict) -> dict:
    try:
        return row["answer"]
    except KeyError as err:
        raise RuntimeError("bad row") from err


def raise_through_a_library() -> None:
    import json

    json.loads('{"question": 1}', object_hook=bad_row)  # the library calls back into the project


def test_a_traceback_keeps_the_projects_frames_and_the_exception():
    try:
        raise_through_a_library()
    except RuntimeError:
        text = TaskNamedFormatter().format(record("failed", "rejection_sampling", sys.exc_info()))
    assert text.startswith("rejection_sampling: failed\nTraceback (most recent call last; ")
    assert "library frames left out" in text
    assert "raise_through_a_library" in text and "in bad_row" in text
    assert "json/decoder.py" not in text
    assert "RuntimeError: bad row" in text and "caused by: KeyError: 'answer'" in text


def test_library_files_are_told_from_the_projects():
    assert library_file(f"{sys.prefix}/lib/python3.11/site-packages/prefect/task_engine.py")
    assert library_file("<frozen runpy>")
    assert not library_file(__file__)


@pytest.mark.parametrize(
    ("profile", "flow", "count"),
    [("tiny", "r1_pipeline", 16), ("micro", "r1_zero", 3), ("micro", "distill", 7)],
)
def test_the_plan_counts_the_stages_each_flow_runs(profile, flow, count):
    plan = planned_stages(load_profile(profile), flow)
    assert len(plan) == len(set(plan)) == count


def test_the_plan_follows_the_settings():
    tiny = load_profile("tiny")
    assert planned_stages(tiny, "r1_pipeline")[:3] == ("bootstrap", "reward_model", "r1_zero_rl")
    fewer = load_profile("tiny", ["r1_zero_in_pipeline=false", "distillation.rl_twins=false"])
    plan = planned_stages(fewer, "r1_pipeline")
    assert "r1_zero_rl" not in plan and not [s for s in plan if s.startswith("rl_only_")]
    assert planned_stages(tiny, "evaluate_registered") == ()


def test_a_failure_logged_three_times_shows_its_traceback_once_and_ends_in_one_line():
    """The task run's record, the flow run's and the engine's exit, as a failed run logs them:
    the traceback with the first, then the exception in one line, the last line a person reads.
    The records themselves keep their exception for the other handlers (the worker's log)."""
    formatter = TaskNamedFormatter()
    try:
        raise_through_a_library()
    except RuntimeError:
        info = sys.exc_info()
    task = record("Task run failed with exception: RuntimeError('bad row')", "reasoning_rl", info)
    flow = record("Encountered exception during execution: RuntimeError('bad row')", None, info)
    engine = record("Engine execution exited with unexpected exception", None, info)
    first, second, last = (formatter.format(r) for r in (task, flow, engine))
    assert "Traceback (most recent call last" in first and "in bad_row" in first
    assert second == "Encountered exception during execution: RuntimeError('bad row')"
    assert last == "Engine execution exited with unexpected exception: RuntimeError: bad row"
    assert engine.exc_info is info
    try:
        raise_through_a_library()
    except RuntimeError:  # another failure, of the same words: its own traceback
        again = formatter.format(record("Task run failed", "student_qwen", sys.exc_info()))
    assert "Traceback (most recent call last" in again


def test_long_words_of_a_failure_are_said_in_full_with_its_traceback_and_at_the_end():
    """The nightly evaluation's missing model: a sentence of 200 characters, in the five records
    of a failed run. In full in the traceback and in the engine's last record, cut elsewhere."""
    words = "no registered model 'r1-tiny' (registered: r1-micro)." + " Run this instead." * 8
    formatter = TaskNamedFormatter()
    try:
        raise LookupError(words)
    except LookupError as error:
        info = sys.exc_info()
        said = repr(error)
    records = [
        record(f"Task run failed with exception: {said}", "registered-model", info),
        record(f"Finished in state Failed('Task run encountered an exception {words}')", "r"),
        record(f"Encountered exception during execution: {said}", None, info),
        record(f"Finished in state Failed('Flow run encountered an exception: {words}')", None),
        record("Engine execution exited with unexpected exception", None, info),
    ]
    texts = [formatter.format(r) for r in records]
    assert [words in text for text in texts] == [True, False, False, False, True]
    assert texts[0].count(words) == 1 and texts[0].endswith(f"LookupError: {words}")  # traceback
    assert all(f"{words[: LONG_WORDS - 1]}…" in text for text in texts[1:4])
    assert texts[-1] == f"Engine execution exited with unexpected exception: LookupError: {words}"


def test_a_bad_settings_words_are_said_once_in_a_failed_flow_runs_log():
    """The records of a flow run that failed on a bad setting, as the server keeps them (what
    `--watch` and `r1 watch` print): the setting's key and reason once, in the traceback."""
    from configs.profiles import ConfigError, load_profile

    formatter = TaskNamedFormatter(width=LINE_WIDTH)
    try:
        load_profile("micro", ["cold_start_sft.train.epohcs=2"])
    except ConfigError as error:
        info, said, words = sys.exc_info(), repr(error), str(error)
    records = [
        record(f"Encountered exception during execution: {said}", None, info),
        record(f"flow run Failed: ConfigError: {words}\nMLflow parent run: none", None),
        record(f"Finished in state Failed({repr(f'Flow run encountered: {words}')})", None),
    ]
    texts = "\n".join(formatter.format(r) for r in records)
    assert texts.count("cold_start_sft.train.epohcs: Extra inputs are not permitted") == 1, texts
    assert texts.count("Traceback (most recent call last") == 1


def test_a_log_line_wraps_at_a_space_to_fit_80_columns_under_watch():
    formatter = TaskNamedFormatter(width=LINE_WIDTH)
    text = formatter.format(record("Finished in state Completed()", "evaluate: all_scenarios_rl"))
    assert text == "evaluate: all_scenarios_rl: Finished in state\n  Completed()"
    path = "sqlite:///" + "/very/long" * 8 + "/mlflow.db"
    assert fitted(f"store\n{path}", LINE_WIDTH) == f"store\n{path}"  # a word stays whole


def test_a_stages_first_lines_and_its_progress_fit_a_log_line():
    from tasks.context import start_text

    plan = planned_stages(load_profile("tiny"), "r1_pipeline")
    longest = max(plan, key=len)
    position = stage_position(longest, plan)
    run_id = "0123456789abcdef" * 2
    for attempt in (1, 2):
        lines = f"{longest}: {start_text(position, run_id, attempt)}".splitlines()
        assert all(len(line) <= LINE_WIDTH for line in lines), lines
        assert run_id in lines[1]
    assert len(f"{longest}: {step_text(1500, 1.0)}") <= LINE_WIDTH


def test_the_funnel_line_of_a_sampling_stage_fits_a_log_line():
    from types import SimpleNamespace

    from tasks.rejection import funnel_text

    report = SimpleNamespace(prompts=20000, sampled=160000, chunks_skipped=12)
    names = ["length", "correct", "well_formed", "single_language", "general_score", "dedup"]
    steps = [(name, 160000, 150000) for name in [*names, "top_k"]]
    lines = funnel_text("rejection_sampling", report, steps).splitlines()
    assert lines[0] == "rejection_sampling: 20000 prompts, sampled 160000"
    assert lines[1] == "skipped 12 stored chunks" and lines[2].startswith("funnel: length 150000")
    assert all(len(line) <= LINE_WIDTH for line in lines), lines
    assert " -> ".join(lines[2:]).count(" -> ") == len(steps) - 1

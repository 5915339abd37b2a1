"""Stage keys: a fault changes the key of the one stage it names, and no other."""

from pathlib import Path

from configs.schema import StudentConfig
from tasks.context import RunContext
from tasks.distill import student_stage
from tasks.stage_cache import stage_key


def context(fail_at: str | None) -> RunContext:
    return RunContext(Path("/state"), "parent", "flow-run", "r1-test", fail_at)


def test_a_fault_keys_the_stage_it_names_and_no_other():
    plain, faulted = context(None), context("reasoning_rl@3")
    for stage, changes in (("reasoning_rl", True), ("all_scenarios_rl", False)):
        before = stage_key("grpo", {"ctx": plain, "stage": stage})
        after = stage_key("grpo", {"ctx": faulted, "stage": stage})
        assert (before != after) is changes
    fixed = {"ctx": context("cold_start_sft")}
    assert stage_key("cold-start-sft", fixed, "cold_start_sft") != stage_key(
        "cold-start-sft", {"ctx": plain}, "cold_start_sft"
    )
    assert stage_key("bootstrap-base-model", fixed, "bootstrap") == stage_key(
        "bootstrap-base-model", {"ctx": plain}, "bootstrap"
    )


def test_a_per_student_task_names_its_stage_by_the_student():
    student = StudentConfig(name="qwen", path=Path("/checkpoints/qwen"))
    name = student_stage("rl_only_")
    assert name({"student": student}) == "rl_only_qwen"
    params = {"student": student}
    assert stage_key("rl-only-twin", params | {"ctx": context("rl_only_qwen")}, name) != stage_key(
        "rl-only-twin", params | {"ctx": context(None)}, name
    )

"""Stage keys: a fault changes the key of the one stage it names, and no other; a file a config
names keys by its content."""

import os
from pathlib import Path

from configs.data import DataConfig
from configs.reinforcement import RewardTerm
from configs.schema import StudentConfig
from configs.supervised import BootstrapConfig
from tasks.context import RunContext
from tasks.distill import student_stage
from tasks.stage_cache import identity, stage_key


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


def edit_in_place(path: Path, old: bytes, new: bytes) -> None:
    """Same size, same modification time: only the content differs."""
    stat = path.stat()
    path.write_bytes(path.read_bytes().replace(old, new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size


def test_a_file_or_checkpoint_a_config_names_keys_its_stages_by_content(tmp_path):
    """Data edited in place, or a path pointed at other data, is not the data a cached stage
    was computed from: every stage given the config gets a new key."""
    train, heldout = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text('{"question": "1 + 2?", "answer": "3"}\n')
    heldout.write_text('{"question": "2 + 2?", "answer": "4"}\n')
    files = {"train_path": str(train), "heldout_path": str(heldout)}
    data = DataConfig.model_validate({"source": "files", "files": files})
    first = stage_key("prepare-problems", {"config": data})
    edit_in_place(train, b'"3"', b'"4"')
    second = stage_key("prepare-problems", {"config": data})
    assert second != first
    elsewhere = tmp_path / "other.jsonl"
    elsewhere.write_text('{"question": "5 + 5?", "answer": "10"}\n')
    train.unlink()
    train.symlink_to(elsewhere)
    assert stage_key("prepare-problems", {"config": data}) not in (first, second)

    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    boot = BootstrapConfig(path=folder)
    before = stage_key("bootstrap-base-model", {"config": boot})
    edit_in_place(folder / "model.safetensors", b"\x00" * 8, b"\x01" * 8)
    assert stage_key("bootstrap-base-model", {"config": boot}) != before


def test_a_grader_file_edited_in_place_keys_the_stages_that_use_it(tmp_path):
    grader = tmp_path / "grader.yaml"
    grader.write_text("type: string_check\nname: g\noperation: eq\n")
    term = RewardTerm(name="grader", params={"path": str(grader)})
    before = stage_key("grpo", {"rewards": [term]})
    edit_in_place(grader, b"eq", b"ne")
    assert stage_key("grpo", {"rewards": [term]}) != before


def test_a_config_that_names_no_file_keys_as_its_settings_alone():
    """The tiny world's keys are what they were before files' contents were keyed."""
    data = DataConfig()
    assert identity(data) == data.model_dump(mode="json")

"""Stage keys: a fault changes the key of the one stage it names, and no other; a file a config
names keys by its content; settings that say only how often a stage logs or saves key nothing."""

import json
import os
from pathlib import Path

from configs import load_profile
from configs.data import DataConfig
from configs.reinforcement import RewardTerm
from configs.schema import StudentConfig
from configs.strict import computed_settings
from configs.supervised import BootstrapConfig
from stages.fingerprint import fingerprint
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


# ---- settings that say how a stage runs, never what it computes ---------------------------------

HOW_IT_RUNS_ONLY = [
    "cold_start_sft.train.log_every=3",
    "cold_start_sft.train.checkpoint_every=2",
    "cold_start_sft.engine.timeout_s=60",
    "cold_start_sft.engine.micro_batch_tokens=512",
    "reward_model.train.checkpoint_every=7",
    "reward_model.eval_batch_size=3",
    "reasoning_rl.samples_every=5",
    "reasoning_rl.engine.gradient_checkpointing=true",
    "reasoning_rl.sampler.generate_timeout_s=7200",
    "rejection.batch_size=7",
    "rejection.sampler.start_timeout_s=3600",
    "distillation.sft.log_every=1",
    "distillation.on_policy.checkpoint_every=4",
    "distillation.on_policy.micro_batch_size=2",
]


def test_how_a_stage_runs_leaves_its_key_and_its_checkpoints_fingerprint_as_they_were():
    """A run that died in a stage of days (out of memory, past a time limit) is run again with
    smaller micro-batches, a longer limit or a shorter checkpoint interval, as the error
    advises, without computing its finished stages again or starting the stage that died from
    its first step: the stage folder (named by the key) and its checkpoints (their fingerprint)
    are the same."""
    plain, other = load_profile("micro"), load_profile("micro", HOW_IT_RUNS_ONLY)
    assert other.cold_start_sft.train.checkpoint_every == 2  # the overrides took
    ctx = {"ctx": context(None)}
    sections = ("cold_start_sft", "reward_model", "reasoning_rl", "rejection", "bootstrap")
    for section in sections:
        before, after = getattr(plain, section), getattr(other, section)
        assert stage_key(section, {"config": before} | ctx) == stage_key(
            section, {"config": after} | ctx
        )
        assert fingerprint(before, "base") == fingerprint(after, "base")
    before, after = plain.distillation.student_training(), other.distillation.student_training()
    assert stage_key("distill-student", {"config": before}) == stage_key(
        "distill-student", {"config": after}
    )
    assert fingerprint(before.on_policy) == fingerprint(after.on_policy)
    assert computed_settings(plain) == computed_settings(other)  # the same command


def test_settings_that_change_what_a_stage_computes_still_change_its_key():
    """The learning rate, the engine's precision, the sampler's dtype, and a GRPO stage's
    checkpoint interval, which is also how far back its guard keeps and rolls back to
    (stages/guarded.py `reach_of`), each change the key."""
    plain = load_profile("micro")
    for setting in (
        "cold_start_sft.train.learning_rate=0.01",
        "cold_start_sft.engine.precision=bf16",
        "reasoning_rl.sampler.dtype=float32",
        "reasoning_rl.checkpoint_every=2",
    ):
        section = setting.partition(".")[0]
        changed = getattr(load_profile("micro", [setting]), section)
        before = stage_key(section, {"config": getattr(plain, section)})
        assert stage_key(section, {"config": changed}) != before, setting
        assert fingerprint(changed) != fingerprint(getattr(plain, section)), setting


def test_a_students_distillation_is_keyed_by_how_students_are_trained_alone():
    """Another student added, or the RL twins' settings changed, leave the students already
    distilled in the cache; the students' own training settings do not."""
    plain = load_profile("micro").distillation
    key = stage_key("distill-student", {"config": plain.student_training()})
    for unrelated in (
        {"rl_twin": plain.rl_twin.model_copy(update={"steps": 9})},
        {"rl_twins": False},
        {"students": plain.students[:1]},
        {"traces": plain.traces.model_copy(update={"samples_per_prompt": 3})},
    ):
        other = plain.model_copy(update=unrelated).student_training()
        assert stage_key("distill-student", {"config": other}) == key, unrelated
    sft = plain.sft.model_copy(update={"epochs": 3.0})
    other = plain.model_copy(update={"sft": sft}).student_training()
    assert stage_key("distill-student", {"config": other}) != key


def test_new_weights_in_a_score_model_graders_judge_key_the_stages_that_use_it(tmp_path):
    """The judge a grader file names is part of the reward: its weights changed in place (same
    size and time), the grader file untouched, the stages that grade with it are computed
    again. A judge inside a multi grader counts too."""
    judge = tmp_path / "judge"
    judge.mkdir()
    (judge / "config.json").write_text("{}")
    (judge / "model.safetensors").write_bytes(b"weights-1")
    scorer = {
        "type": "score_model",
        "name": "judge",
        "model": str(judge),
        "input": [{"role": "user", "content": "{{ sample.output_text }}"}],
    }
    multi = {"type": "multi", "graders": {"j": scorer}, "calculate_output": "j"}
    for spec in (scorer, multi):
        grader = tmp_path / f"{spec['type']}.json"
        grader.write_text(json.dumps(spec))
        term = RewardTerm(name="grader", params={"path": str(grader)})
        before = stage_key("grpo", {"rewards": [term]})
        edit_in_place(judge / "model.safetensors", b"weights-1", b"weights-2")
        assert stage_key("grpo", {"rewards": [term]}) != before, spec["type"]
        edit_in_place(judge / "model.safetensors", b"weights-2", b"weights-1")
        assert stage_key("grpo", {"rewards": [term]}) == before, spec["type"]

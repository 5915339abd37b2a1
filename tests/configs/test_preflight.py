"""The preflight of a profile's local inputs (configs/preflight.py) and the checks of a local
checkpoint (models/checkpoint.py), on stand-in folders made here."""

import json
import shutil
from pathlib import Path

import pytest

from configs.preflight import (
    MissingInputsError,
    check_inputs,
    missing_inputs,
    model_folder_problems,
    required_inputs,
)
from configs.profiles import load_profile
from models.checkpoint import CheckpointError, check_checkpoint
from storage.digests import tree_digest
from tests.real_checkpoints import decoder, llama_style_tokenizer, save_checkpoint

GPU = "gpu-qwen"


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    tokenizer = llama_style_tokenizer()
    folder = tmp_path_factory.mktemp("llama") / "Llama-stand-in"
    return save_checkpoint(folder, decoder(tokenizer, "llama", 16, 1), tokenizer)


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def test_the_tiny_profiles_need_no_local_inputs():
    assert required_inputs(load_profile("tiny")) == []
    check_inputs(load_profile("micro"))


def test_each_flow_checks_what_it_opens():
    config = load_profile(GPU)
    flows = ("r1_zero", "distill", "evaluate_registered")
    keys = {flow: [i.key for i in required_inputs(config, flow)] for flow in flows}
    assert keys["r1_zero"] == ["bootstrap.path", "data.files.train_path", "data.files.heldout_path"]
    assert keys["distill"][:2] == ["distillation.students[0].path", "distillation.students[1].path"]
    assert "bootstrap.path" not in keys["distill"]
    assert keys["evaluate_registered"] == ["data.files.train_path", "data.files.heldout_path"]


def test_the_message_names_key_path_cause_and_remedy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingInputsError) as err:
        check_inputs(load_profile(GPU), source="configs/gpu-qwen.yaml")
    text = str(err.value)
    assert text.splitlines()[:4] == [
        "configs/gpu-qwen.yaml: 5 local input(s) missing or unusable; nothing has run:",
        "  bootstrap.path = checkpoints/Qwen2.5-1.5B-Instruct  (the policy's base)",
        f"    looked in {tmp_path}/checkpoints/Qwen2.5-1.5B-Instruct: no such folder",
        "    get it: hf download Qwen/Qwen2.5-1.5B-Instruct "
        "--local-dir checkpoints/Qwen2.5-1.5B-Instruct",
    ]
    assert "  data.files.heldout_path = data/gsm8k/test.jsonl  (held-out problems)" in text
    assert "columns 'question' and 'answer'" in text
    assert text.splitlines()[-1].endswith("--set bootstrap.path=/path/to/checkpoint")


def test_a_folder_that_is_not_a_model_says_what_it_lacks(tmp_path, llama_folder):
    assert model_folder_problems(tmp_path / "absent") == ["no such folder"]
    (tmp_path / "file").write_text("x")
    assert model_folder_problems(tmp_path / "file") == ["not a folder"]
    empty = tmp_path / "empty"
    empty.mkdir()
    problems = model_folder_problems(empty)
    assert [p.split(" (")[0] for p in problems] == [
        "no config.json",
        "no tokenizer files",
        "no weights",
    ]
    assert model_folder_problems(llama_folder) == []


def test_a_tokenizer_without_a_chat_template_is_refused_before_and_at_load(tmp_path, llama_folder):
    folder = copy_of(llama_folder, tmp_path)
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (problem,) = model_folder_problems(folder)
    assert problem.startswith("the tokenizer has no chat template")
    with pytest.raises(CheckpointError, match="no chat template"):
        check_checkpoint(folder)


def test_missing_inputs_lists_a_broken_student_among_good_ones(tmp_path, llama_folder):
    broken = copy_of(llama_folder, tmp_path)
    (broken / "config.json").unlink()
    students = f"[{{name: qwen, path: '{llama_folder}'}}, {{name: llama, path: '{broken}'}}]"
    config = load_profile(GPU, [f"distillation.students={students}"])
    missing = {m.input.key: m.problems for m in missing_inputs(config, "distill")}
    assert "distillation.students[0].path" not in missing
    assert missing["distillation.students[1].path"] == ("no config.json",)


def test_a_checkpoint_is_checked_and_described(llama_folder):
    checked = check_checkpoint(llama_folder)
    assert checked.model_type == "llama" and checked.end_of_turn == "<|eot_id|>"
    assert checked.embedding_rows >= checked.tokens == 400 and checked.parameters > 0


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path, llama_folder):
    folder = copy_of(llama_folder, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    small = decoder(llama_style_tokenizer(), "llama", 16, 1)
    small.resize_token_embeddings(300)
    small.save_pretrained(folder)
    assert (
        json.loads((folder / "config.json").read_text())["vocab_size"]
        == 300
        != config["vocab_size"]
    )
    with pytest.raises(
        CheckpointError, match="the tokenizer has 400 tokens but the model embeds only 300"
    ):
        check_checkpoint(folder)


def test_a_hub_downloads_bookkeeping_is_not_content(tmp_path, llama_folder):
    folder = copy_of(llama_folder, tmp_path)
    before = tree_digest(folder)
    metadata = folder / ".cache" / "huggingface" / "download" / "config.json.metadata"
    metadata.parent.mkdir(parents=True)
    metadata.write_text("abc123\netag\n1732300000.0\n")
    assert tree_digest(folder) == before
    (folder / "extra.txt").write_text("x")
    assert tree_digest(folder) != before


def test_weights_that_are_git_lfs_pointers_or_cut_short_are_refused_from_their_bytes(
    tmp_path, llama_folder
):
    pointer = copy_of(llama_folder, tmp_path / "lfs")
    (pointer / "model.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:6ab7\nsize 988097824\n"
    )
    (problem,) = model_folder_problems(pointer)
    assert problem.startswith("model.safetensors is a git-lfs pointer, not weights")
    with pytest.raises(CheckpointError, match=f"{pointer}: not a model folder: .*git-lfs"):
        check_checkpoint(pointer)
    cut = copy_of(llama_folder, tmp_path / "cut")
    weights = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[: len(weights) - 100])
    assert model_folder_problems(cut) == [
        "model.safetensors: truncated or not safetensors (an unfinished download?)"
    ]


def test_weights_that_fail_to_load_are_a_checkpoint_error_naming_the_folder(tmp_path, llama_folder):
    """Whatever loading raises (here transformers' RuntimeError for weights of another size)."""
    folder = copy_of(llama_folder, tmp_path)
    wider = tmp_path / "wider"
    decoder(llama_style_tokenizer(), "llama", 32, 1).save_pretrained(wider)
    shutil.copy(wider / "model.safetensors", folder / "model.safetensors")
    assert model_folder_problems(folder) == []
    with pytest.raises(CheckpointError, match=f"{folder}: the model does not load: RuntimeError"):
        check_checkpoint(folder)


def broken_students(llama_folder: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A student whose template ends turns in plain text and whose tokenizer has no EOS, and
    one whose config.json embeds fewer rows than its tokenizer has tokens."""
    no_end = copy_of(llama_folder, tmp_path / "no-end")
    (no_end / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tokenizer_config = json.loads((no_end / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (no_end / "tokenizer_config.json").write_text(
        json.dumps({**tokenizer_config, "eos_token": None})
    )
    small = copy_of(llama_folder, tmp_path / "small")
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 256}))
    return no_end, small


@pytest.mark.usefixtures("private_environment")  # `r1` points the environment at its state
def test_every_checkpoint_is_checked_before_anything_runs(tmp_path, llama_folder, capsys):
    """`r1 config` and the flows' first task (open_state) refuse a student that stage 7 would
    refuse, listing each, before any store is touched."""
    from cli.main import main
    from models.checkpoint import check_model_inputs
    from tasks.pipeline import open_state
    from tests.real_checkpoints import write_gsm8k

    no_end, small = broken_students(llama_folder, tmp_path)
    train, test = write_gsm8k(tmp_path / "data")
    students = f"[{{name: a, path: '{no_end}'}}, {{name: b, path: '{small}'}}]"
    overrides = [f"bootstrap.path={llama_folder}", f"distillation.students={students}",
                 f"data.files.train_path={train}", f"data.files.heldout_path={test}"]  # fmt: skip
    config = load_profile(GPU, overrides)
    check_inputs(config)  # the files are all there
    with pytest.raises(CheckpointError) as err:
        check_model_inputs(config, "r1_pipeline")
    lines = str(err.value).splitlines()
    assert lines[0] == f"profile {config.name}: 2 checkpoint(s) cannot be used; nothing has run:"
    assert lines[1].startswith(f"  distillation.students[0].path (student 'a' base): {no_end}:")
    assert "no EOS token" in lines[1]
    assert lines[2].endswith("the tokenizer has 400 tokens but the model embeds only 256")
    with pytest.raises(CheckpointError, match="2 checkpoint"):
        open_state(config, "distill", trains=False)
    state = tmp_path / "state"
    args = [a for o in overrides for a in ("--set", o)]
    assert main(["config", "--profile", GPU, "--state-dir", str(state), *args]) == 3
    assert "2 checkpoint(s) cannot be used" in capsys.readouterr().err


def test_a_template_whose_generation_prompt_opens_think_is_refused(tmp_path, llama_folder):
    """DeepSeek-R1-Distill's and QwQ's generation prompts end in `<think>\\n`: our completions
    open it themselves, so every example would hold two."""
    from tests.real_checkpoints import LLAMA_TEMPLATE

    folder = copy_of(llama_folder, tmp_path)
    template = LLAMA_TEMPLATE.replace(
        "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}",
        "'<|start_header_id|>assistant<|end_header_id|>\\n\\n<think>\\n' }}",
    )
    assert template != LLAMA_TEMPLATE
    (folder / "chat_template.jinja").write_text(template)
    with pytest.raises(CheckpointError, match="generation prompt already writes '<think>'"):
        check_checkpoint(folder)


def test_on_policy_distillation_of_a_student_on_another_tokenizer_is_refused_before_it_runs(
    tmp_path, llama_folder
):
    """Its KL compares logits id by id: a student whose ids mean other tokens than the policy's
    would be refused only at stage 7, after every policy stage and the student's SFT."""
    from models.checkpoint import check_model_inputs
    from tests.real_checkpoints import qwen_style_tokenizer

    tokenizer = qwen_style_tokenizer()
    qwen = save_checkpoint(tmp_path / "qwen", decoder(tokenizer, "qwen2", 16, 1), tokenizer)
    same = copy_of(llama_folder, tmp_path)
    students = f"[{{name: same, path: '{same}'}}, {{name: other, path: '{qwen}'}}]"
    overrides = [f"bootstrap.path={llama_folder}", f"distillation.students={students}"]
    config = load_profile(GPU, [*overrides, "distillation.method=on_policy"])
    with pytest.raises(CheckpointError) as err:
        check_model_inputs(config, "distill")
    lines = str(err.value).splitlines()
    assert (
        len(lines) == 2 and "students[1].path (student 'other' base): not the policy's" in lines[1]
    )
    check_model_inputs(load_profile(GPU, overrides), "distill")  # sft: text crosses tokenizers
    fresh = load_profile(
        GPU, [*overrides[1:], "distillation.method=on_policy", "bootstrap.path=null"]
    )
    with pytest.raises(CheckpointError, match="the policy's is trained here"):
        check_model_inputs(fresh, "distill")

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

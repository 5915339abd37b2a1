"""Students cut from the base (`models.loading.cut_layers`, `student.base_layers`)."""

from types import SimpleNamespace

import pytest
import torch

from configs.schema import StudentConfig
from configs.supervised import CorpusConfig, ModelConfig
from models.loading import build_model, cut_layers, load_model
from models.saved import save_model
from problems.types import ProblemSet
from stages.bootstrap import pretrain_student


def _spec(architecture: str = "qwen2", num_layers: int = 3, hidden_size: int = 32) -> ModelConfig:
    return ModelConfig(
        architecture=architecture,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )


def _base(tokenizer):
    return build_model(_spec(), len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, 0)


def _cut(tokenizer, spec: ModelConfig, layers: list[int]):
    base = _base(tokenizer)
    return base, *cut_layers(base, spec, layers, tokenizer.pad_token_id, tokenizer.eos_token_id)


def test_all_layers_in_order_give_the_base_itself(tokenizer):
    base, student, left_out = _cut(tokenizer, _spec(), [0, 1, 2])
    ids = torch.tensor([tokenizer("What is 3 + 4?")["input_ids"]])
    assert left_out == []
    assert torch.equal(student(input_ids=ids).logits, base(input_ids=ids).logits)


def test_a_cut_student_holds_the_named_layers_in_order(tokenizer):
    base, student, _ = _cut(tokenizer, _spec(num_layers=2), [0, 2])
    assert len(student.model.layers) == 2
    for mine, theirs in ((0, 0), (1, 2)):
        a = student.model.layers[mine].mlp.down_proj.weight
        assert torch.equal(a, base.model.layers[theirs].mlp.down_proj.weight)
    assert torch.equal(student.model.embed_tokens.weight, base.model.embed_tokens.weight)
    ids = torch.tensor([tokenizer("What is 3 + 4?")["input_ids"]])
    assert not torch.allclose(student(input_ids=ids).logits, base(input_ids=ids).logits)


def test_a_llama_student_of_a_qwen2_base_leaves_out_the_attention_biases(tokenizer):
    base, student, left_out = _cut(tokenizer, _spec("llama", num_layers=2), [1, 2])  # by base name
    assert type(student).__name__ == "LlamaForCausalLM"
    assert sorted(left_out) == sorted(
        f"model.layers.{i}.self_attn.{p}_proj.bias" for i in (1, 2) for p in "qkv"
    )
    assert torch.equal(
        student.model.layers[0].self_attn.q_proj.weight,
        base.model.layers[1].self_attn.q_proj.weight,
    )


@pytest.mark.parametrize(
    ("spec", "layers", "message"),
    [
        (_spec(hidden_size=64), [0, 1, 2], "hidden_size 64 \\(base 32\\)"),
        (_spec(num_layers=2), [0, 1, 2], "3 layers named for a student of 2"),
        (_spec(num_layers=2), [0, 3], "each once"),
        (_spec(num_layers=2), [1, 1], "each once"),
    ],
)
def test_a_cut_that_does_not_fit_the_base_is_refused(tokenizer, spec, layers, message):
    with pytest.raises(ValueError, match=message):
        _cut(tokenizer, spec, layers)


def test_base_layers_need_a_tiny_world_student(tmp_path):
    with pytest.raises(ValueError, match="base_layers needs model"):
        StudentConfig(name="s", path=tmp_path, base_layers=[0])


def test_a_fresh_student_needs_pretraining():
    with pytest.raises(ValueError, match="fresh weights needs pretrain"):
        StudentConfig(name="s", model=_spec(num_layers=2), pretrain=None)


def test_an_unpretrained_cut_student_is_the_cut_itself(tokenizer, tmp_path):
    """`pretrain: null` with base_layers: the student's base is the cut model, saved as is."""
    base = _base(tokenizer)
    base_dir = save_model(base, tokenizer, tmp_path / "base")
    student = StudentConfig(name="s", model=_spec(num_layers=2), base_layers=[0, 2], pretrain=None)
    problems = ProblemSet(tmp_path / "missing.jsonl", tmp_path / "missing.jsonl", 0, 0)
    metrics: dict[str, float] = {}
    tracker = SimpleNamespace(log_metrics=lambda m, step=None: metrics.update(m))
    ref = pretrain_student(student, CorpusConfig(), base_dir, problems, tmp_path / "s", tracker)
    cut, _ = cut_layers(base, student.model, [0, 2], tokenizer.pad_token_id, tokenizer.eos_token_id)
    saved = load_model(ref.path).state_dict()
    assert saved.keys() == cut.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in cut.state_dict().items())
    assert metrics["model/parameters"] == ref.parameters

"""The weight sync's pure part: names, tied embeddings, chunks under a byte budget, gathering.

The engine here is a recorder, or a second transformers model loaded by name the way vLLM's
`load_weights` loads (tests/vllm_standin.py EngineModel); vLLM itself cannot run on CPU.
"""

import contextlib

import pytest
import torch

from configs.supervised import ModelConfig
from models.loading import build_model
from sampling.weight_sync import (
    WeightSync,
    WeightSyncError,
    chunks,
    engine_name,
    engine_weights,
    full_bytes,
    gather_for,
    no_gather,
    zero3_gather,
)
from tests.tiny_models import tiny_model
from tests.vllm_standin import EngineModel, max_difference


class Recorder:
    """A `load` that keeps a copy of every tensor it is handed, call by call."""

    def __init__(self):
        self.calls: list[list[tuple[str, torch.Tensor]]] = []

    def __call__(self, weights):
        self.calls.append([(name, t.clone()) for name, t in weights])

    @property
    def loaded(self) -> dict[str, torch.Tensor]:
        flat = [pair for call in self.calls for pair in call]
        names = [name for name, _ in flat]
        assert len(names) == len(set(names)), "a tensor arrived twice"
        return dict(flat)


def llama(tokenizer, seed=0):
    spec = ModelConfig(
        architecture="llama", hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
        intermediate_size=32, max_position_embeddings=64,
    )  # fmt: skip
    model = build_model(spec, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    return model


@pytest.mark.parametrize(
    "raw, name",
    [
        ("model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("module.model.norm.weight", "model.norm.weight"),
        ("_orig_mod.lm_head.weight", "lm_head.weight"),
        ("module._orig_mod.model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        (
            "model.layers.1._checkpoint_wrapped_module.self_attn.q_proj.bias",
            "model.layers.1.self_attn.q_proj.bias",
        ),
        ("model.blocks.module.weight", "model.blocks.module.weight"),  # a real submodule's name
    ],
)
def test_engine_names_drop_wrapper_segments(raw, name):
    assert engine_name(raw) == name


def test_every_parameter_arrives_once_with_its_name_shape_and_values(tokenizer):
    """Qwen2 with tied embeddings: everything in the checkpoint but the LM head, which is the
    embedding itself (vLLM skips `lm_head.*` when tied)."""
    model = tiny_model(tokenizer)
    assert model.config.tie_word_embeddings
    record = Recorder()
    report = WeightSync(record).sync(model)
    state = model.state_dict()
    assert set(record.loaded) == set(state) - {"lm_head.weight"}
    for name, tensor in record.loaded.items():
        assert tensor.shape == state[name].shape
        assert torch.equal(tensor, state[name])
    assert report.tensors == len(record.loaded)
    assert report.bytes == sum(t.numel() * t.element_size() for t in record.loaded.values())


def test_an_untied_head_is_handed_over(tokenizer):
    model = llama(tokenizer)
    record = Recorder()
    WeightSync(record).sync(model)
    assert "lm_head.weight" in record.loaded
    assert set(record.loaded) == set(model.state_dict())


@pytest.mark.parametrize("make", [tiny_model, llama])
def test_an_engine_loading_by_name_ends_up_with_the_trainer_s_model(tokenizer, make):
    trainer, engine = make(tokenizer, seed=0), make(tokenizer, seed=1)
    assert max_difference(trainer, engine) > 0
    WeightSync(EngineModel(engine).load_weights).sync(trainer)
    assert max_difference(trainer, engine) == 0
    ids = torch.tensor([[3, 5, 7, 9]])
    assert torch.equal(trainer(ids).logits, engine(ids).logits)  # the head too, tied or not


def test_wrapped_models_sync_under_checkpoint_names(tokenizer):
    """A DeepSpeed/DDP-style `module` around a torch.compile wrapper; the tie is still found."""

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    model = tiny_model(tokenizer)
    wrapped = Wrapper(torch.compile(model))
    assert next(iter(dict(wrapped.named_parameters()))).startswith("module._orig_mod.")
    assert [n for n, _ in engine_weights(wrapped)] == [n for n, _ in engine_weights(model)]


def test_chunks_respect_the_byte_budget(tokenizer):
    model = llama(tokenizer)
    named = engine_weights(model)
    sizes = sorted(full_bytes(p) for _, p in named)
    budget = sizes[-1] + sizes[0]  # room for the largest and a little more
    record = Recorder()
    report = WeightSync(record, budget=budget).sync(model)
    assert report.chunks == len(record.calls) > 2
    for call in record.calls:
        nbytes = sum(t.numel() * t.element_size() for _, t in call)
        assert nbytes <= budget
    assert report.largest_chunk_bytes <= budget
    order = [name for call in record.calls for name, _ in call]
    assert order == [name for name, _ in named]  # consecutive, in the model's order
    tiny = list(chunks(named, budget=1))  # a parameter over the budget is a chunk of its own
    assert len(tiny) == len(named)


def test_a_second_sync_after_an_optimizer_step_carries_the_new_values(tokenizer):
    trainer, engine = tiny_model(tokenizer, seed=0), tiny_model(tokenizer, seed=1)
    events: list[str] = []
    engine_model = EngineModel(engine)

    def load(weights):
        events.append("load")
        engine_model.load_weights(weights)

    sync = WeightSync(load, budget=4096, after_sync=lambda: events.append("reset"))
    assert sync.sync(trainer).version == 1
    before = {n: p.detach().clone() for n, p in trainer.named_parameters()}
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=1e-2)
    trainer(torch.tensor([[3, 5, 7, 9]]), labels=torch.tensor([[3, 5, 7, 9]])).loss.backward()
    optimizer.step()
    assert max_difference(trainer, engine) > 0  # the engine is stale until the next sync
    report = sync.sync(trainer)
    assert report.version == 2 and max_difference(trainer, engine) == 0
    changed = [n for n, p in trainer.named_parameters() if not torch.equal(p, before[n])]
    assert changed == list(
        before
    )  # every parameter moved (AdamW decays even those without a gradient)
    assert events.count("reset") == 2 and events[-1] == "reset"  # once per sync, at its end
    assert report.metrics()["sync/version"] == 2.0


def partition(model: torch.nn.Module) -> dict[torch.nn.Parameter, torch.Tensor]:
    """Emulate ZeRO-3's partitioned parameters: each holds an empty shard and carries the
    whole tensor's `ds_shape`/`ds_numel`/`ds_id`, as DeepSpeed's do; the whole tensors are
    kept aside for the emulated gather."""
    whole = {}
    for i, p in enumerate(model.parameters()):
        whole[p] = p.data
        p.ds_id, p.ds_shape, p.ds_numel = i, p.shape, p.numel()
        p.data = torch.empty(0, dtype=p.dtype)
    return whole


class EmulatedGather:
    """GatheredParameters' effect: whole tensors inside the block, shards again after it."""

    def __init__(self, whole):
        self.whole, self.gathered, self.peak = whole, 0, 0

    @contextlib.contextmanager
    def __call__(self, params):
        for p in params:
            p.data = self.whole[p]
        self.gathered += sum(full_bytes(p) for p in params)
        self.peak = max(self.peak, self.gathered)
        try:
            yield
        finally:
            for p in params:
                p.data = torch.empty(0, dtype=p.dtype)
            self.gathered -= sum(full_bytes(p) for p in params)


def test_zero3_parameters_are_gathered_a_chunk_at_a_time(tokenizer):
    model = llama(tokenizer)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    whole = partition(model)
    assert gather_for(model) is zero3_gather
    gather = EmulatedGather(whole)
    budget = max(full_bytes(p) for p in model.parameters())
    record = Recorder()
    report = WeightSync(record, budget=budget).sync(model, gather=gather)
    assert set(record.loaded) == set(expected)
    for name, tensor in record.loaded.items():
        assert torch.equal(tensor, expected[name])
    assert report.chunks > 1 and gather.peak <= budget  # never more than one chunk whole
    assert all(p.numel() == 0 for p in model.parameters())  # partitioned again afterwards


def test_a_partitioned_parameter_that_was_not_gathered_is_refused(tokenizer):
    model = tiny_model(tokenizer)
    partition(model)
    with pytest.raises(WeightSyncError, match="must be gathered"):
        WeightSync(Recorder()).sync(model, gather=no_gather)

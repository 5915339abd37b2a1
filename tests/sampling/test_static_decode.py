"""Decode steps over a static cache (the GPU's path, CUDA graphs there) against the growing,
compacting cache's: the same tokens, the same logprobs up to float summation order, rows that
stop early padded as before, across the spans a step's attention reads."""

import copy

import pytest
import torch

from sampling import static_decode
from sampling.decode import decode
from sampling.streams import row_keys
from tests.tiny_models import gqa_model, make_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


PROMPTS = ["What is 3 + 4?", "What is 12 + 7? Think.", "What"]


def _model(architecture: str, tokenizer) -> torch.nn.Module:
    model = gqa_model(tokenizer, architecture)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():  # a flatter distribution: rows differ and some stop early
        model.lm_head.weight.mul_(0.3)
        model.lm_head.weight.add_(
            0.02 * torch.randn(model.lm_head.weight.shape, generator=generator)
        )
    return model.eval()


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_static_steps_sample_what_the_growing_cache_samples(
    architecture, temperature, top_p, tokenizer, monkeypatch
):
    monkeypatch.setattr(static_decode, "SPAN", 16)  # several spans within the call
    model = _model(architecture, tokenizer)
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    rows = [0, 0, 1, 1, 2, 2, 2]
    keys = row_keys(3, torch.tensor(rows), torch.tensor([0, 1, 0, 1, 0, 1, 2]))
    stop = [10, 11, 12, 13, 14]  # about one draw in sixty: some rows stop, some run out
    args = (model, prompts, rows, temperature, top_p, 50, stop, tokenizer.pad_token_id, keys)
    growing = decode(*args, static=False)
    static = decode(*args, static=True)
    assert [d.token_ids for d in static] == [d.token_ids for d in growing]
    assert [d.finish_reason for d in static] == [d.finish_reason for d in growing]
    for s, g in zip(static, growing, strict=True):
        assert s.logprobs == pytest.approx(g.logprobs, abs=1e-5)
    if temperature > 0:
        assert len({tuple(d.token_ids) for d in growing}) > 1  # the rows really sampled
        assert len({len(d.token_ids) for d in growing}) > 1  # rows stopped at different steps


def test_a_call_whose_rows_all_stop_ends_at_the_next_check(tokenizer, monkeypatch):
    """Every row stopped: the loop ends within CHECK_EVERY steps, the outputs as the growing
    cache's."""
    model = _model("qwen2", tokenizer)
    with torch.no_grad():  # the stop token wins every draw after the first few
        model.lm_head.bias = None
        model.lm_head.weight[tokenizer.eos_token_id].mul_(0).add_(model.lm_head.weight.sum(0))
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    rows = [0, 1, 2]
    keys = row_keys(0, torch.tensor(rows), torch.zeros(3, dtype=torch.long))
    args = (model, prompts, rows, 1.0, 1.0, 200, [tokenizer.eos_token_id],
            tokenizer.pad_token_id, keys)  # fmt: skip
    steps = []
    original = static_decode.StaticDecoder.__call__
    monkeypatch.setattr(
        static_decode.StaticDecoder, "__call__",
        lambda self, length: steps.append(length) or original(self, length),
    )  # fmt: skip
    static, growing = decode(*args, static=True), decode(*args, static=False)
    assert [d.token_ids for d in static] == [d.token_ids for d in growing]
    assert all(d.finish_reason == "stop" for d in static)
    assert len(steps) < static_decode.CHECK_EVERY + max(len(d.token_ids) for d in static)


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_the_compiled_step_samples_what_the_plain_step_samples(
    architecture, tokenizer, monkeypatch
):
    """The static step compiled by Inductor (`compile_step`, its elementwise ops fused): the
    same tokens and logprobs as the uncompiled static step over many spans, with at most three
    graphs compiled however many spans the call reads (torch's automatic dynamic shapes: a
    graph a span would pass torch's recompile limit, past which the step runs uncompiled)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(static_decode, "SPAN", 16)  # 120 tokens: eight spans and more
    model = _model(architecture, tokenizer)
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    rows = [0, 1, 2, 2]
    keys = row_keys(3, torch.tensor(rows), torch.tensor([0, 0, 0, 1]))
    args = (model, prompts, rows, 1.0, 1.0, 120, [10], tokenizer.pad_token_id, keys)
    plain = decode(*args, static=True)
    torch._dynamo.reset()
    counters.clear()
    compiled = decode(*args, static=True, compile_step=True)
    assert [d.token_ids for d in compiled] == [d.token_ids for d in plain]
    for c, p in zip(compiled, plain, strict=True):
        assert c.logprobs == pytest.approx(p.logprobs, abs=1e-4)
    assert max(len(d.token_ids) for d in plain) > 16 * 8 - 10  # the call read eight spans
    assert 1 <= counters["stats"]["unique_graphs"] <= 3
    # another model of the shape (the next stage's) samples from its own weights, not the
    # first one's compiled in
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    others = (other, *args[1:])
    moved = decode(*others, static=True)
    assert [d.token_ids for d in moved] != [d.token_ids for d in plain]
    compiled = decode(*others, static=True, compile_step=True)
    assert [d.token_ids for d in compiled] == [d.token_ids for d in moved]

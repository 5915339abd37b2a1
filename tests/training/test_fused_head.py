"""The chunked head with its elementwise work compiled (`engine.fused_head`,
training/fused_head.py) against the eager chunks it replaces: the same log-probabilities,
entropies, cross-entropy and gradients on the hidden states, the head's weight and its bias, in
float32 and within bf16's rounding in bf16; and the memory model's account of it. The compiled
kernels are torch.compile's real ones (a few seconds each to compile here)."""

import pytest
import torch

from tests.training.test_chunked_head import _grads, _head, _inputs
from training.logits import chunked_nll, chunked_token_logprobs
from training.memory import FP32, ModelShape, Placement, Step, logits_moments


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.mark.parametrize("bias", [False, True])
def test_fused_logprobs_entropies_and_gradients_are_the_eager_chunks(bias):
    head = _head(50, 16, bias, torch.float32)
    h, targets = _inputs(13, 16, 50, torch.float32)
    upstream = torch.randn(13, generator=torch.Generator().manual_seed(2))
    results = {}
    for fused in (False, True):
        logp, entropy = chunked_token_logprobs(head, h, targets, 0.7, True, 4, fused=fused)
        (logp * upstream).sum().backward()
        results[fused] = (logp.detach(), entropy, _grads(head, h))
    (logp, entropy, grads), (f_logp, f_entropy, f_grads) = results[False], results[True]
    assert f_logp.dtype == torch.float32 and f_entropy is not None
    assert not f_entropy.requires_grad
    assert torch.allclose(f_logp, logp, atol=1e-5)
    assert torch.allclose(f_entropy, entropy, atol=1e-5)
    for got, expected in zip(f_grads, grads, strict=True):
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_cross_entropy_and_its_gradients_are_the_eager_chunks(bias):
    head = _head(40, 12, bias, torch.float32)
    h, targets = _inputs(11, 12, 40, torch.float32)
    losses, grads = {}, {}
    for fused in (False, True):
        loss = chunked_nll(head, h, targets, 5, fused=fused)
        (loss * 0.3).backward()
        losses[fused], grads[fused] = float(loss.detach()), _grads(head, h)
    assert abs(losses[True] - losses[False]) < 1e-4
    for got, expected in zip(grads[True], grads[False], strict=True):
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # no gradient asked: the loss alone
        assert abs(float(chunked_nll(head, h, targets, 5, fused=True)) - losses[False]) < 1e-4


def test_bf16_fused_chunks_are_the_eager_ones_within_bf16_rounding():
    """Both cast the gradient on the logits to bf16 before the matmuls; the fused kernel rounds
    once where the eager chunk rounds after each in-place step in float32 first."""
    head = _head(64, 32, False, torch.bfloat16)
    h, targets = _inputs(20, 32, 64, torch.bfloat16)
    out = {}
    for fused in (False, True):
        logp, _ = chunked_token_logprobs(head, h, targets, 1.0, False, 6, fused=fused)
        logp.sum().backward()
        logp_grads = _grads(head, h)
        chunked_nll(head, h, targets, 6, fused=fused).backward()
        out[fused] = (logp.detach(), logp_grads, _grads(head, h))
    assert torch.allclose(out[True][0], out[False][0], atol=1e-5)
    for which in (1, 2):
        for got, expected in zip(out[True][which], out[False][which], strict=True):
            assert got.dtype == torch.bfloat16
            assert _relative(got, expected) < 1e-2


def test_the_memory_model_holds_no_float32_chunk_when_fused():
    """A bf16 GRPO pass of 4,096 completion positions in chunks of 1,000 over a 1,000-token
    vocabulary: fused, the forward holds a chunk's bf16 logits (c x V x 2) where the eager chunk
    holds them and their float32 copy, then a second float32 tensor; the backward, the logits
    and their gradient (2 x c x V x 2) against a float32 copy and the bf16 gradient."""
    shape = ModelShape(
        layers=2, hidden=64, intermediate=128, heads=4, kv_heads=4, vocab=1000, tied=True
    )
    place = Placement(precision="bf16", device="cuda")
    step = Step(8192, 4096, "grpo", logits_budget=1000 * 1000, entropy=False)
    fused = Step(8192, 4096, "grpo", logits_budget=1000 * 1000, entropy=False, fused_head=True)
    c, v, h, k = 1000, 1000, 64, 4096
    eager_forward, eager_backward = logits_moments(shape, place, step)
    fused_forward, fused_backward = logits_moments(shape, place, fused)
    kept = k * h * 2 + k * FP32  # the positions' hidden states and their log-sum-exps
    assert fused_forward == kept + c * v * 2
    assert eager_forward == kept + 2 * c * v * FP32
    product = v * h * 2  # a chunk's share of the head's gradient, bf16
    gradients = k * h * 2 + v * h * FP32  # the hidden states' gradient, the head's in float32
    assert fused_backward == kept + gradients + max(2 * c * v * 2, c * v * 2 + product)
    assert eager_backward == kept + gradients + c * v * (FP32 + 2) + product


def test_sft_training_with_the_fused_head_is_training_with_the_eager_one(
    tokenizer, tmp_path, fused_middle_calls
):
    """`engine.fused_head` reaches the SFT stage's loss: three steps with the head in chunks of
    two positions give the eager chunks' losses and weights, through the fused middle."""
    from configs.supervised import EngineConfig, TrainConfig
    from tests.tiny_models import TEXTS, tiny_model
    from training.examples import lm_examples
    from training.supervised import train

    cfg = TrainConfig(epochs=1, batch_size=8, learning_rate=1e-3, warmup_steps=0, log_every=1)
    examples = lm_examples(tokenizer, TEXTS[:24], max_length=48)
    runs = {}
    calls = fused_middle_calls
    for fused in (False, True):
        torch.manual_seed(0)
        model = tiny_model(tokenizer)
        chunks = EngineConfig(logits_chunk_mb=2 * len(tokenizer) * 4 / 2**20, fused_head=fused)
        losses: list[float] = []
        train(model, examples, cfg, tmp_path / str(fused), "fp",
              lambda m, s, losses=losses: losses.append(m["train/loss"]),
              tokenizer.pad_token_id, engine_config=chunks)  # fmt: skip
        runs[fused] = losses, [p.detach().clone() for p in model.parameters()]
        assert bool(calls) == fused and set(calls) <= {"nll_middle"}
    assert len(runs[True][0]) == 3
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-5)
    for got, expected in zip(runs[True][1], runs[False][1], strict=True):
        assert torch.allclose(got, expected, atol=1e-6, rtol=1e-4)


def test_a_temperature_each_compiles_nothing_more():
    """A pipeline whose stages sample at a dozen temperatures compiles the log-probabilities'
    kernels once (with dynamic shapes torch takes a float argument as a symbol; a constant each
    would pass its recompile limit)."""
    from torch._dynamo.utils import counters

    head = _head(30, 8, False, torch.float32)
    h, targets = _inputs(9, 8, 30, torch.float32)
    chunked_token_logprobs(head, h, targets, 1.0, False, 4, fused=True)[0].sum().backward()
    counters.clear()
    for temperature in [0.3 + 0.1 * i for i in range(12)]:
        logp, _ = chunked_token_logprobs(head, h, targets, temperature, False, 4, fused=True)
        logp.sum().backward()
        expected, _ = chunked_token_logprobs(head, h, targets, temperature, False, 4)
        assert torch.allclose(logp.detach(), expected, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 0

"""A GRPO update bounded in memory: micro-batches and chunked log-probabilities give the loss,
statistics and gradients of the whole step in one pass; truncated importance sampling on worked
numbers; gradient checkpointing changes nothing but memory."""

import copy
import math

import pytest
import torch

from configs.supervised import EngineConfig
from rl.losses import grpo_loss, truncated_is_weights
from rl.rollouts import build_batch, completion_logprobs
from rl.update import PolicyUpdate, UpdateRows
from tests.tiny_models import gqa_model, grpo_config
from training.collective import Solo
from training.engines import LocalEngine
from training.finite import LossGuard
from training.logits import chunked_token_logprobs, token_logprobs
from training.micro import micro_batches

PROMPTS = ["What is 1 + 1?", "Name a colour.", "What is 12 + 30?", "Say hi."]


def test_micro_batches_keep_each_group_within_the_budget_and_the_order():
    assert micro_batches([3, 4, 2, 5, 1], budget=7) == [[0, 1], [2, 3], [4]]
    assert micro_batches([9, 2], budget=5) == [[0], [1]]  # a long row stands alone
    assert micro_batches([1, 1, 1], budget=100) == [[0, 1, 2]]
    assert micro_batches([], budget=4) == []


def test_truncated_importance_weights_on_worked_numbers():
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.3]]))
    sampler = torch.log(torch.tensor([[0.25, 0.4, 0.3, 0.01]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is padding
    weights, ratio_sum, clipped = truncated_is_weights(trainer, sampler, mask, cap=2.5)
    # ratios 2, 0.5, 3 (capped at 2.5); padding weighs 1 and is not counted
    assert weights.tolist()[0] == pytest.approx([2.0, 0.5, 2.5, 1.0])
    assert float(ratio_sum) == pytest.approx(5.5) and int(clipped) == 1


def test_weights_scale_the_surrogate_and_not_the_kl():
    logp = torch.log(torch.tensor([[0.6, 0.5]]))
    ref = torch.log(torch.tensor([[0.4, 0.5]]))
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    w = torch.tensor([[2.0, 0.5]])
    loss, _ = grpo_loss(logp, logp.detach(), adv, mask, ref_logp=ref, beta=0.1, weights=w)
    kl = 0.4 / 0.6 - math.log(0.4 / 0.6) - 1  # DESIGN.md's worked number, 0.072
    # ratio 1: surrogate = A per token; per token -(w * 1) + 0.1 * kl; mean over 2 tokens
    assert float(loss) == pytest.approx((-(2.0) + 0.1 * kl + -(0.5) + 0.0) / 2, abs=1e-6)


def batch_of(tokenizer, lengths=(5, 9, 3, 7)):
    completions = [[(7 * i + j) % 50 + 10 for j in range(n)] for i, n in enumerate(lengths)]
    return build_batch(tokenizer, PROMPTS, completions, tokenizer.pad_token_id), completions


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("packed", [True, False])
def test_chunked_log_probabilities_equal_the_whole_pass(tokenizer, packed, fused):
    model = gqa_model(tokenizer)
    batch, _ = batch_of(tokenizer)
    whole, whole_h = completion_logprobs(model, batch, 0.7, with_entropy=True, packed=packed)
    (whole * batch.completion_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    vocab = model.config.vocab_size
    small = 3 * vocab  # three positions of logits per chunk
    chunked, chunked_h = completion_logprobs(
        model, batch, 0.7, with_entropy=True, packed=packed, logits_budget=small, fused_head=fused
    )
    (chunked * batch.completion_mask).sum().backward()
    assert torch.allclose(chunked, whole, atol=1e-5) and torch.allclose(
        chunked_h, whole_h, atol=1e-5
    )
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], atol=1e-5), name


def test_chunks_are_recomputed_not_kept(tokenizer):
    """With gradients on, a chunk's logits are not saved for the backward pass: only the
    hidden states (K, H) are, not K x V logits."""
    head = torch.nn.Linear(8, 1000, bias=False)
    hidden = torch.randn(40, 8, requires_grad=True)
    targets = torch.randint(0, 1000, (40,))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = chunked_token_logprobs(head, hidden, targets, 1.0, False, chunk=10)
    assert max(saved) < 10 * 1000  # no chunk's logits, let alone all 40 x 1000
    full, _ = token_logprobs(head(hidden), targets, 1.0, False)
    assert torch.allclose(logp, full, atol=1e-6)


class RecordingEngine(LocalEngine):
    """Keeps each optimizer step's gradients: Adam's first steps move every weight by about the
    learning rate whatever the gradient's size, so weights compare poorly; gradients do."""

    def step(self, guard):
        self.grads = getattr(self, "grads", []) + [
            {n: p.grad.clone() for n, p in self.module.named_parameters()}
        ]
        return super().step(guard)


def update_once(tokenizer, engine_config: EngineConfig, **cfg_overrides):
    """One PolicyUpdate on a fixed set of rows: each optimizer step's gradients and the step's
    statistics."""
    torch.manual_seed(0)
    model = gqa_model(tokenizer)
    cfg = grpo_config(engine=engine_config, **cfg_overrides)
    reference = copy.deepcopy(model).eval() if cfg.beta > 0 else None
    checkpointing = engine_config.gradient_checkpointing
    engine = RecordingEngine(model, 1e-5, 1.0, gradient_checkpointing=checkpointing)
    _, completions = batch_of(tokenizer)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])
    if cfg.supervision == "process":
        adv = adv[:, None] * torch.linspace(1.0, 0.1, 9)[None, :]  # (N, T) per token
    sampler_logp = [[-1.0 - 0.01 * j for j in range(len(c))] for c in completions]
    rows = UpdateRows(PROMPTS, completions, adv, sampler_logp)
    update = PolicyUpdate(cfg, tokenizer, engine, Solo(), reference, LossGuard("test"))
    stats = update(rows, fallback=rows)
    return engine.grads, stats


def assert_same_gradients(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for step_a, step_b in zip(a, b, strict=True):
        for name, grad in step_a.items():
            assert torch.allclose(grad, step_b[name], rtol=1e-4, atol=1e-7), name


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"aggregation": "token_mean"},
        {"aggregation": "constant", "inner_iterations": 2},
        {"beta": 0.1, "supervision": "process"},
        {"importance_sampling_cap": 2.0},
    ],
)
@pytest.mark.parametrize("fused", [False, True])
def test_micro_batches_and_chunks_give_the_one_pass_update(
    tokenizer, overrides, fused, fused_middle_calls
):
    whole_grads, whole = update_once(tokenizer, EngineConfig(), **overrides)
    # 4 micro-batches, the head in chunks (eager or fused: training/fused_head.py)
    small = EngineConfig(micro_batch_tokens=20, logits_chunk_mb=0.01, fused_head=fused)
    split_grads, split = update_once(tokenizer, small, **overrides)
    expected = {"logprob_middle", "logprob_grad_middle"} if fused else set()
    assert set(fused_middle_calls) == expected
    assert whole.keys() == split.keys()
    for key in whole:
        assert split[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    assert_same_gradients(whole_grads, split_grads)


def test_gradient_checkpointing_changes_memory_not_the_update(tokenizer):
    plain_grads, plain = update_once(tokenizer, EngineConfig())
    ckpt_grads, ckpt = update_once(tokenizer, EngineConfig(gradient_checkpointing=True))
    assert ckpt["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert_same_gradients(plain_grads, ckpt_grads)


def test_importance_sampling_is_logged_per_step(tokenizer):
    _, stats = update_once(tokenizer, EngineConfig(), importance_sampling_cap=2.0)
    assert stats["tis/mean_ratio"] > 0 and 0.0 <= stats["tis/clipped_fraction"] <= 1.0
    _, off = update_once(tokenizer, EngineConfig())
    assert "tis/mean_ratio" not in off


def update_peak(tokenizer, rows: int, micro_batch_tokens: int) -> int:
    """The most bytes live at once over one update of `rows` rows (torch's allocation record,
    the model and the optimizer's state included)."""
    from benchmarks.memory_model import AllocationRecord

    with AllocationRecord() as record:
        torch.manual_seed(0)
        model = gqa_model(tokenizer)
        cfg = grpo_config(engine=EngineConfig(micro_batch_tokens=micro_batch_tokens))
        engine = LocalEngine(model, 1e-5, 1.0)
        completions = [[(5 * i + j) % 50 + 10 for j in range(32)] for i in range(rows)]
        prompts = [PROMPTS[i % 4] for i in range(rows)]
        batch = UpdateRows(prompts, completions, torch.linspace(-1, 1, rows), [[-1.0] * 32] * rows)
        update = PolicyUpdate(cfg, tokenizer, engine, Solo(), None, LossGuard("test"))
        update(batch, fallback=batch)  # AdamW's moments exist from here on, as in later steps
        record.measure(lambda: update(batch, fallback=batch))
    return record.peak


@pytest.mark.heavy
def test_a_step_s_memory_is_bounded_by_the_micro_batch_not_the_step(tokenizer):
    """Four times the rows in one step: with micro-batches of about four rows the peak stays
    where four rows put it; in one pass (as every step ran before micro-batches) it grows."""
    budget = 4 * 44  # about four rows of prompt and completion
    four, sixteen = update_peak(tokenizer, 4, budget), update_peak(tokenizer, 16, budget)
    assert sixteen < 1.2 * four
    one_pass = update_peak(tokenizer, 16, 10**6)
    assert one_pass > 2 * four

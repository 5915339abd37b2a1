"""Packed batches (`training.batches.pack`, `rl.rollouts.pack_policy_batch`) and the attention that
runs them (`training.varlen`): each example keeps the loss it has in a row of its own."""

import contextlib

import pytest
import torch

from configs.supervised import TrainConfig
from rl.rollouts import build_batch, completion_logprobs, pack_policy_batch
from tests.tiny_models import gqa_model
from training.batches import collate, pack
from training.distributed import target_count
from training.examples import IGNORE, Example
from training.supervised import train
from training.varlen import NAME, packed_attention, sequence_lengths


def _examples(vocab: int, lengths: list[int], seed: int = 0) -> list[Example]:
    """Random token examples; every other one an SFT example with no loss on its first third."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(3, vocab, (n,), generator=generator).tolist()
        prompt = n // 3 if i % 2 else 0
        out.append(Example(ids, [IGNORE] * prompt + ids[prompt:]))
    return out


def _alone_loss(model, examples: list[Example]) -> torch.Tensor:
    """The token-mean loss of `examples`, each run in a batch of its own (no padding at all)."""
    total, count = torch.zeros(()), 0
    for e in examples:
        out = model(
            input_ids=torch.tensor([e.input_ids]), labels=torch.tensor([e.labels]), use_cache=False
        )
        n = target_count([e])
        total, count = total + out.loss * n, count + n
    return total / count


def test_pack_lays_the_examples_end_to_end_in_one_row():
    examples = _examples(50, [10, 3, 7, 2, 9, 1])
    batch = pack(examples, pad_id=0)
    assert batch["input_ids"].shape == (1, 32)
    assert batch["input_ids"][0].tolist() == [t for e in examples for t in e.input_ids]
    assert sequence_lengths(batch["position_ids"]) == [10, 3, 7, 2, 9, 1]
    assert batch["position_ids"][0, 10:13].tolist() == [0, 1, 2]
    assert int((batch["labels"] != IGNORE).sum()) == target_count(examples)
    assert "attention_mask" not in batch


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
@pytest.mark.parametrize("per_sequence", [True, False])
def test_a_packed_batch_has_the_loss_and_gradient_of_its_examples_alone(
    tokenizer, architecture, per_sequence
):
    """Under `packed_attention` each example attends to itself; without it transformers builds
    the row's block-diagonal mask. Either way: the loss and gradient of the examples alone."""
    model = gqa_model(tokenizer, architecture)
    examples = _examples(len(tokenizer), [40, 12, 29, 33, 5, 18, 21, 40], seed=1)
    reference = _alone_loss(model, examples)
    packed = pack(examples, tokenizer.pad_token_id)
    attention = packed_attention(model) if per_sequence else contextlib.nullcontext()
    with attention:
        loss = model(**packed, use_cache=False).loss
    assert model.config._attn_implementation == "sdpa"  # restored
    assert abs(float((loss - reference).detach())) < 2e-6  # a few float32 steps at a loss near 5.7
    # with a cache the model does not read the restarts: tokens see the example before them
    leaky = model(**packed, use_cache=True).loss
    assert abs(float((leaky - reference).detach())) > 2e-5

    loss.backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(**collate(examples, tokenizer.pad_token_id), use_cache=False).loss.backward()
    for a, b in zip(packed_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_padded_batches_keep_their_mask_under_packed_attention(tokenizer):
    model = gqa_model(tokenizer, "qwen2")
    batch = collate(_examples(len(tokenizer), [30, 7, 19], seed=3), tokenizer.pad_token_id)
    plain = model(**batch, use_cache=False).loss
    with packed_attention(model):
        assert model.config._attn_implementation == NAME
        ours = model(**batch, use_cache=False).loss
    assert abs(float((ours - plain).detach())) < 1e-6


def test_sequence_lengths_need_a_row_that_starts_a_sequence():
    assert sequence_lengths(torch.tensor([[0, 1, 2, 0, 0, 1]])) == [3, 1, 2]
    with pytest.raises(ValueError, match="start at 0"):
        sequence_lengths(torch.tensor([[1, 2, 0]]))


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_packed_completion_logprobs_are_the_padded_ones(tokenizer, architecture):
    """One row without padding against left-padded prompts and right-padded completions: the
    same log-probabilities and entropies on every completion token, 0 past each end, and the
    same gradient of their sum."""
    model = gqa_model(tokenizer, architecture)
    generator = torch.Generator().manual_seed(4)
    prompts = ["What is 1 + 2?", "7", "What is 9 + 9? The answer is", "a b"]
    completions = [
        torch.randint(3, len(tokenizer), (n,), generator=generator).tolist() for n in (5, 17, 1, 9)
    ]
    batch = build_batch(tokenizer, prompts, completions, tokenizer.pad_token_id)
    row = pack_policy_batch(batch)
    assert row.input_ids.shape == (1, int(batch.attention_mask.sum()))
    assert row.valid.sum(dim=1).tolist() == [5, 17, 1, 9]

    grads = []
    outputs = []
    for packed in (True, False):
        logp, entropy = completion_logprobs(model, batch, 0.7, with_entropy=True, packed=packed)
        mask = batch.completion_mask.bool()
        (logp * mask).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        model.zero_grad()
        outputs.append((logp.detach(), entropy, mask))
    (logp, entropy, mask), (ref_logp, ref_entropy, _) = outputs
    assert torch.allclose(logp[mask], ref_logp[mask], atol=1e-5)
    assert torch.allclose(entropy[mask], ref_entropy[mask], atol=1e-5)
    assert not logp[~mask].any() and not entropy[~mask].any()
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_training_on_packed_batches_reaches_the_weights_of_padded_ones(tokenizer, tmp_path):
    examples = _examples(len(tokenizer), [5 + (7 * i) % 40 for i in range(48)], seed=2)
    weights = []
    for packing in (False, True):
        model = gqa_model(tokenizer, "qwen2")
        cfg = TrainConfig(
            epochs=1, batch_size=8, learning_rate=1e-2, warmup_steps=0, packing=packing
        )
        train(
            model,
            examples,
            cfg,
            tmp_path / str(packing),
            "fp",
            lambda m, s: None,
            tokenizer.pad_token_id,
        )
        weights.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*weights, strict=True):
        assert torch.allclose(a, b, atol=1e-4)


def test_models_with_sliding_window_layers_keep_their_attention(tokenizer):
    model = gqa_model(tokenizer, "qwen2")
    model.config.layer_types = ["full_attention", "sliding_attention"]
    with packed_attention(model):
        assert model.config._attn_implementation == "sdpa"


def test_one_sliding_window_for_every_layer_keeps_its_attention(tokenizer):
    """Mistral-7B-v0.1 and Phi-3 declare `sliding_window` without `layer_types`: a packed example
    longer than the window keeps the loss it has alone (here a window of 8 binds on rows of 12 to
    23); Qwen2's `sliding_window` under `use_sliding_window: false` is no window."""
    from types import SimpleNamespace

    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
        max_position_embeddings=256, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    examples = _examples(len(tokenizer), [17, 23, 12], seed=2)
    with torch.no_grad(), packed_attention(model):
        loss = model(**pack(examples, tokenizer.pad_token_id), use_cache=False).loss
    assert abs(float(loss - _alone_loss(model, examples).detach())) < 2e-6  # outside no_grad
    from training.varlen import has_sliding_window

    qwen2 = SimpleNamespace(sliding_window=4096, use_sliding_window=False)
    assert not has_sliding_window(qwen2) and has_sliding_window(model.config)
    assert not has_sliding_window(gqa_model(tokenizer, "qwen2").config)


def test_the_packed_kernel_is_chosen_by_device_and_refused_where_it_cannot_run(monkeypatch):
    """On CPU `auto` is the per-sequence kernel (exactly the reference); varlen FlashAttention is
    for CUDA GPUs and is refused by name elsewhere; $R1_PACKED_ATTENTION overrides `auto`."""
    from training.varlen import OVERRIDE, choose_kernel

    cpu = torch.device("cpu")
    assert choose_kernel(cpu) == "per_sequence"
    with pytest.raises(ValueError, match="CUDA GPU"):
        choose_kernel(cpu, "varlen")
    monkeypatch.setenv(OVERRIDE, "flex")
    assert choose_kernel(cpu) == "flex"
    monkeypatch.setenv(OVERRIDE, "fastest")
    with pytest.raises(ValueError, match="R1_PACKED_ATTENTION='fastest'"):
        choose_kernel(cpu)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA finds no GPU")
def test_a_cuda_device_that_is_not_there_is_answered_not_raised():
    """Asked about `cuda` where torch finds no GPU (a CPU build, or a CUDA build of torch on a
    machine without a driver), the kernel check answers no and `auto` picks the per-sequence
    kernel; naming varlen is refused with the reason, not with torch's initialisation error."""
    from training.varlen import choose_kernel, varlen_available

    cuda = torch.device("cuda")
    assert varlen_available(cuda) is False
    assert choose_kernel(cuda) == "per_sequence"
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        choose_kernel(cuda, "varlen")


@pytest.mark.parametrize(
    "kernel",
    [
        "flex",  # on CPU: forward only (FlexAttention has no CPU backward)
        pytest.param("varlen", marks=pytest.mark.gpu),  # CUDA only: forward and backward
    ],
)
def test_compiled_layers_take_packed_rows_whole(tokenizer, kernel):
    """The row's bounds (varlen) or block mask (flex) are found before the first layer and handed
    to every layer as attention arguments, so that each decoder layer compiles to one graph
    (`fullgraph`: a graph break raises) with no device sync in it; rows of other lengths give
    the uncompiled model's logits (and gradients, where the kernel has a backward)."""
    from training.varlen import varlen_available

    device = torch.device("cuda" if kernel == "varlen" else "cpu")
    if kernel == "varlen" and not varlen_available(device):
        pytest.skip("the varlen kernel needs a CUDA GPU with FlashAttention 2")
    backward = device.type == "cuda"
    # the reference: the model uncompiled, through the per-sequence kernel on CPU (exactly each
    # sequence alone), through the same kernel on a GPU
    reference = kernel if device.type == "cuda" else "per_sequence"
    eager, compiled = (gqa_model(tokenizer, "qwen2").to(device) for _ in range(2))
    # on CPU, Inductor's C++ FlexAttention template fails to build for a dynamic row length
    # (torch 2.13); the graphs dynamo captures are the point, run by AOT autograd there
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    for layer in compiled.model.layers:
        layer.compile(fullgraph=True, backend=backend)
    vocab = len(tokenizer)
    for lengths in ([10, 17, 13], [5, 30], [8, 8, 8, 9]):
        examples = _examples(vocab, lengths, seed=len(lengths))
        batch = {k: v.to(device) for k, v in pack(examples, pad_id=0).items() if k != "labels"}
        outputs = []
        for model, used in ((eager, reference), (compiled, kernel)):
            model.zero_grad()
            with packed_attention(model, used), torch.set_grad_enabled(backward):
                logits = model(**batch, use_cache=False).logits
                if backward:
                    logits.float().square().mean().backward()
            grads = [p.grad for p in model.parameters()] if backward else []
            outputs.append((logits.detach(), grads))
        (want, want_grads), (got, got_grads) = outputs
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("packing", [True, False])
def test_the_chunked_sft_loss_has_the_whole_losss_value_and_gradients(tokenizer, packing):
    """A micro-batch whose logits exceed the budget computes its loss a chunk of positions at a
    time (training/logits.py `causal_lm_loss`): the same loss and gradients as transformers'
    cross-entropy over the whole batch, packed or padded, as a mean or over `num_items`, its
    chunks eager or fused (training/fused_head.py)."""
    from training.logits import causal_lm_loss

    model = gqa_model(tokenizer, "qwen2")
    examples = _examples(len(tokenizer), [30, 7, 19, 12], seed=5)
    batch = (
        pack(examples, tokenizer.pad_token_id)
        if packing
        else collate(examples, tokenizer.pad_token_id)
    )
    for num_items in (None, 50):
        grads = []
        losses = []
        chunked = 3 * len(tokenizer)  # three positions a chunk
        for budget, fused in ((None, False), (chunked, False), (chunked, True)):
            with packed_attention(model):
                loss = causal_lm_loss(model, batch, num_items, budget, fused)
            loss.backward()
            losses.append(float(loss.detach()))
            grads.append([p.grad.clone() for p in model.parameters()])
            model.zero_grad()
        for loss, got in zip(losses[1:], grads[1:], strict=True):
            assert loss == pytest.approx(losses[0], rel=1e-5)
            for a, b in zip(got, grads[0], strict=True):
                assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)

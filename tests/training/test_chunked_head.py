"""The chunked LM head (training/logits.py) against the plain one: the same log-probabilities,
entropies, cross-entropy and gradients on the hidden states, the head's weight and its bias,
whatever the chunk, with the head's gradient delivered once."""

import pytest
import torch
import torch.nn.functional as F

from training.logits import chunked_nll, chunked_token_logprobs, token_logprobs


def _head(vocab: int, hidden: int, bias: bool, dtype: torch.dtype) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(hidden, vocab, bias=bias, dtype=dtype)


def _inputs(n: int, hidden: int, vocab: int, dtype: torch.dtype):
    generator = torch.Generator().manual_seed(1)
    h = torch.randn(n, hidden, generator=generator, dtype=dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=generator)
    return h, targets


def _grads(head: torch.nn.Linear, h: torch.Tensor) -> list[torch.Tensor]:
    out = [h.grad.clone(), head.weight.grad.clone()]
    if head.bias is not None:
        out.append(head.bias.grad.clone())
    h.grad = None
    head.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_their_gradients_are_the_plain_ones(chunk, bias, temperature):
    head = _head(50, 16, bias, torch.float64)
    h, targets = _inputs(13, 16, 50, torch.float64)
    upstream = torch.randn(13, dtype=torch.float64)  # any gradient reaching the log-probs

    logp, entropy = token_logprobs(head(h), targets, temperature, with_entropy=True)
    (logp * upstream).sum().backward()
    expected = _grads(head, h)

    got_logp, got_entropy = chunked_token_logprobs(head, h, targets, temperature, True, chunk)
    (got_logp * upstream.float()).sum().backward()
    got = _grads(head, h)

    assert got_logp.dtype == torch.float32 and got_entropy is not None
    assert torch.allclose(got_logp.double(), logp.double(), atol=1e-6)
    assert torch.allclose(got_entropy.double(), entropy.double(), atol=1e-6)
    assert not got_entropy.requires_grad
    for a, b in zip(got, expected, strict=True):
        assert torch.allclose(a.double(), b.double(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_cross_entropy_and_its_gradients_are_the_plain_ones(chunk, bias):
    head = _head(40, 12, bias, torch.float64)
    h, targets = _inputs(11, 12, 40, torch.float64)

    loss = F.cross_entropy(head(h).float(), targets, reduction="sum")
    (loss * 0.3).backward()
    expected = _grads(head, h)

    got = chunked_nll(head, h, targets, chunk)
    (got * 0.3).backward()  # the loss's gradient scales what the forward pass computed
    assert got.dtype == torch.float32
    assert abs(float(got.detach()) - float(loss.detach())) < 1e-5
    for a, b in zip(_grads(head, h), expected, strict=True):
        assert torch.allclose(a.double(), b.double(), atol=1e-6, rtol=1e-5)


def test_bf16_chunks_are_the_plain_bf16_head():
    """In bf16 the head's matmul rounds as the plain path's does; only the gradient on the
    logits (float32 here, bf16 out of the plain path's upcast) and the sums' order differ."""
    head = _head(64, 32, False, torch.bfloat16)
    h, targets = _inputs(20, 32, 64, torch.bfloat16)
    logp, _ = token_logprobs(head(h), targets, 1.0, with_entropy=False)
    logp.sum().backward()
    expected = _grads(head, h)
    got_logp, _ = chunked_token_logprobs(head, h, targets, 1.0, False, 6)
    got_logp.sum().backward()
    assert got_logp.dtype == torch.float32
    assert torch.allclose(got_logp, logp, atol=1e-5)
    for a, b in zip(_grads(head, h), expected, strict=True):
        assert a.dtype == torch.bfloat16
        assert (a.float() - b.float()).norm() / b.float().norm() < 1e-2


def test_the_head_gets_one_gradient_per_call_and_its_forward_is_restored():
    """ZeRO-3 reduces a parameter's gradient once per backward pass: a head recomputed chunk
    by chunk under activation checkpointing would hand it one per chunk."""
    head = _head(30, 8, False, torch.float32)
    h, targets = _inputs(17, 8, 30, torch.float32)
    deliveries = []
    head.weight.register_hook(lambda g: deliveries.append(g.shape))
    logp, _ = chunked_token_logprobs(head, h, targets, 1.0, False, 2)
    logp.sum().backward()
    assert deliveries == [head.weight.shape]
    chunked_nll(head, h, targets, 2).backward()
    assert len(deliveries) == 2
    assert "forward" not in head.__dict__  # the class's own forward again


def test_without_gradients_the_chunked_loss_computes_none():
    head = _head(30, 8, False, torch.float32)
    h, targets = _inputs(9, 8, 30, torch.float32)
    with torch.no_grad():
        loss = chunked_nll(head, h, targets, 4)
    reference = F.cross_entropy(head(h), targets, reduction="sum")
    assert abs(float(loss) - float(reference.detach())) < 1e-4
    assert not loss.requires_grad

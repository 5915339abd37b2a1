"""The one-process mixed-precision engine (training/mixed.py): updates far below bf16's
resolution are kept in the fp32 master weights and reach the bf16 weights once they add up (a
bf16 optimizer rounds every one away); a non-finite gradient under a finite loss is never
applied; in fp32 it steps as the plain engine does; an SFT run saves the master weights."""

from __future__ import annotations

import copy

import pytest
import torch

from training.engines import LocalEngine
from training.finite import LossGuard, NonFiniteLossError
from training.mixed import MixedPrecisionEngine


def _layer(value: float = 0.02) -> torch.nn.Linear:
    layer = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(value)
    return layer


def _step(engine, x: torch.Tensor) -> float:
    loss = engine.forward_model(x.to(next(engine.module.parameters()).dtype)).sum()
    engine.backward(loss)
    return engine.step(LossGuard("test"))


def test_updates_below_bf16_resolution_add_up_in_the_master_weights():
    """lr 1e-6 on weights of 0.02: Adam moves each by about 1e-6 a step, a 61st of half a bf16
    step there (6.1e-5): after 100 steps the masters moved 1e-4 and the bf16 weights followed."""
    x = torch.ones(1, 4)
    mixed = MixedPrecisionEngine(_layer(), 1e-6, max_grad_norm=1e9)
    plain = torch.nn.Linear(4, 1, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        plain.weight.fill_(0.02)
    bf16_adam = torch.optim.AdamW(plain.parameters(), lr=1e-6, weight_decay=0.0)
    for _ in range(100):
        _step(mixed, x)
        plain(x.bfloat16()).sum().backward()
        bf16_adam.step()
        bf16_adam.zero_grad()
    moved = 0.02 - mixed.masters[0].detach()
    assert torch.allclose(moved, torch.full_like(moved, 1e-4), rtol=0.02)
    assert (mixed.module.weight.detach().float() < 0.02 - 5e-5).all()  # the bf16 copy followed
    assert mixed.module.weight.dtype == torch.bfloat16
    start = torch.tensor(0.02, dtype=torch.bfloat16)
    assert (plain.weight.detach() == start).all()  # every bf16 update rounded away


def test_a_nan_gradient_under_a_finite_loss_is_never_applied():
    engine = MixedPrecisionEngine(_layer(), 1e-2, max_grad_norm=1.0)
    _step(engine, torch.ones(1, 4))
    masters = [m.detach().clone() for m in engine.masters]
    weights = engine.module.weight.detach().clone()
    steps = engine.optimizer.state[engine.masters[0]]["step"].clone()
    hook = engine.module.weight.register_hook(lambda grad: grad * float("nan"))
    loss = engine.forward_model(torch.ones(1, 4).bfloat16()).sum()
    assert torch.isfinite(loss)
    engine.backward(loss)
    with pytest.raises(NonFiniteLossError, match="gradient norm"):
        engine.step(LossGuard("test"))
    hook.remove()
    assert all(torch.equal(a, b.detach()) for a, b in zip(masters, engine.masters, strict=True))
    assert torch.equal(weights, engine.module.weight.detach())
    assert torch.equal(steps, engine.optimizer.state[engine.masters[0]]["step"])
    assert all(m.grad is None for m in engine.masters)  # the bad gradients are dropped too


def test_in_fp32_it_steps_as_the_plain_engine_does():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    ours_model, theirs_model = copy.deepcopy(base), copy.deepcopy(base)
    ours = MixedPrecisionEngine(ours_model, 1e-2, 0.5, weight_decay=0.1, dtype=torch.float32)
    theirs = LocalEngine(theirs_model, 1e-2, 0.5, weight_decay=0.1)
    x = torch.randn(8, 6)
    for _ in range(5):
        for engine in (ours, theirs):
            for half in x.split(4):  # two micro-batches a step
                engine.backward(engine.forward_model(half).pow(2).sum())
        assert ours.step(LossGuard("a")) == pytest.approx(theirs.step(LossGuard("b")), rel=1e-5)
    for a, b in zip(ours_model.parameters(), theirs_model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_after_training_the_model_holds_the_master_weights_in_fp32(tmp_path):
    """What a stage saves, and what a checkpoint brings back."""
    engine = MixedPrecisionEngine(_layer(), 1e-6, max_grad_norm=1e9)
    for _ in range(3):
        _step(engine, torch.ones(1, 4))
    engine.save(tmp_path, {"fingerprint": "f"})
    again = MixedPrecisionEngine(_layer(), 1e-6, max_grad_norm=1e9)
    again.load(tmp_path, "f")
    assert torch.equal(again.masters[0].detach(), engine.masters[0].detach())
    model = engine.full_precision()
    assert model.weight.dtype == torch.float32
    assert torch.equal(model.weight.detach(), engine.masters[0].detach())
    assert (model.weight.detach() < 0.02).all()  # moved by 3e-6, kept in fp32

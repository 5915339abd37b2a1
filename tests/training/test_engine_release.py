"""A closed DeepSpeed engine lets go of everything (DeepSpeed 0.19 keeps a ZeRO-3 engine's model
and optimizer alive after `destroy()`), and gradient checkpointing under ZeRO-3 keeps DeepSpeed's
module stack flat while training as it trains without it. A ZeRO-3 engine's replacement of
`torch.nn.functional.linear` for the whole process ends when it closes."""

from __future__ import annotations

import pytest

from tests.deepspeed_cpu import driver_result
from training import distributed

pytestmark = pytest.mark.skipif(
    not distributed.deepspeed_installed(),
    reason="deepspeed is not installed (the `dev` extra installs it)",
)


def _run(*cases: str) -> dict:
    return driver_result("tests.training.release_driver", *cases)


def test_closed_engines_free_their_model_optimizer_and_reference():
    runs = _run("3:plain", "2:plain", "2:noscan", "1:plain")
    for case, run in runs.items():
        assert run["alive"] == [], case  # nothing reachable once the caller drops it
        assert run["stack_after"] == 0, case  # the root modules left DeepSpeed's stack
        assert run["linear_restored"], case  # ZeRO-3's F.linear replacement was put back


def test_checkpointing_under_zero3_keeps_the_module_stack_flat_and_the_losses():
    runs = _run("3:ckpt", "3:plain")
    checkpointed, plain = runs["3:ckpt"], runs["3:plain"]
    assert len(set(checkpointed["stack"])) == 1, checkpointed["stack"]  # no growth step to step
    assert checkpointed["alive"] == []
    for a, b in zip(checkpointed["losses"], plain["losses"], strict=True):
        assert abs(a - b) < 1e-5 * max(1.0, abs(b))  # the same training, recomputed

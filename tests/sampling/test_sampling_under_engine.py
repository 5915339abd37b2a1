"""A policy trained under DeepSpeed ZeRO-2 (or ZeRO-1) samples from the engine's module through
the plain-ops decode step (sampling/decode_step.py), as a bare model does: the engine's own
forward hooks (timers, profiler, input casts) do not change a step's logits, so they do not force
every token through transformers' forward. Same tokens as the bare model; the wrapped model's
forward runs only for the prompts' prefill."""

from __future__ import annotations

import pytest

from tests.deepspeed_cpu import driver_result
from training import distributed

pytestmark = pytest.mark.skipif(
    not distributed.deepspeed_installed(),
    reason="deepspeed is not installed (the `dev` extra installs it)",
)


def _run(stage: int) -> dict:
    return driver_result("tests.sampling.engine_sampling_driver", str(stage), timeout=300)


@pytest.mark.parametrize("stage", [2, 1])
def test_zero_engine_module_samples_through_the_plain_step(stage):
    """ZeRO-2 in fp32, ZeRO-1 in bf16 (its weights moved into one flat buffer, its gradient
    hooks on every parameter) against a bf16 bare model."""
    run = _run(stage)
    assert run["bare_lean"] and all(run["bare_lean"])
    assert run["engine_lean"] and all(run["engine_lean"])  # was False: DeepSpeed's hooks
    assert run["engine"] == run["bare"]
    assert len({tuple(t) for t in run["engine"]}) > 1  # the rows really sampled
    # one forward of the wrapped model per decode call (the prefill), not one per token
    assert run["engine_forwards"] == len(run["engine_lean"])

"""ZeRO-2 in bf16 without DeepSpeed's overflow scan (`engine.overflow_scan: false`), and ZeRO-1's
BF16_Optimizer, which scans nothing: a NaN gradient under a finite loss is refused before
anything is applied, as with the scan, where DeepSpeed alone would apply it; and updates far
below bf16's resolution reach the fp32 master weights, then the bf16 weights, in each.
DeepSpeed on CPU in a process of its own (tests/training/finite_driver.py)."""

from __future__ import annotations

import pytest

from configs.supervised import EngineConfig
from tests.deepspeed_cpu import driver_result
from training import distributed
from training.engines import deepspeed_config

pytestmark = [
    pytest.mark.heavy,  # DeepSpeed in a process of its own
    pytest.mark.skipif(
        not distributed.deepspeed_installed(),
        reason="deepspeed is not installed (the `dev` extra installs it)",
    ),
]


def _run(*cases: str) -> dict:
    return driver_result("tests.training.finite_driver", *cases)


@pytest.fixture(scope="module")
def results() -> dict:
    return _run(
        "nan:bf16:scan", "nan:bf16:norm", "nan:bf16:none", "nan:fp32:norm",
        "small:bf16:scan", "small:bf16:norm", "nan:bf16:zero1", "small:bf16:zero1",
        "sum:bf16:zero1", "sum:bf16:zero1-default", "sum:bf16:scan",
    )  # fmt: skip


@pytest.mark.parametrize(
    "case", ["nan:bf16:scan", "nan:bf16:norm", "nan:fp32:norm", "nan:bf16:zero1"]
)
def test_a_nan_gradient_under_a_finite_loss_is_never_applied(results, case):
    run = results[case]
    assert run["loss_finite"]
    assert run["raised"] and "gradient norm is" in run["raised"], run
    assert run["weights_kept"] and run["masters_kept"] and run["steps_kept"], run


def test_without_the_scan_deepspeed_alone_applies_the_nan(results):
    """What the norm's check stands in for: with the scan off and nothing in its place, the
    update goes through and the weights turn NaN; the guard's reading of the norm DeepSpeed
    reports afterwards comes too late (so the cases above test the check, not the guard)."""
    run = results["nan:bf16:none"]
    assert run["loss_finite"]
    assert not run["weights_kept"] and not run["masters_kept"] and not run["weights_finite"], run


@pytest.mark.parametrize("case", ["small:bf16:scan", "small:bf16:norm", "small:bf16:zero1"])
def test_updates_below_bf16_resolution_reach_the_weights(results, case):
    """lr 1e-6 on weights of 0.02: Adam moves each by about 1e-6 a step; after 100 steps the
    masters moved 1e-4 and the bf16 weights (half a step there: 6.1e-5) followed."""
    run = results[case]
    assert run["dtype"] == "torch.bfloat16"
    assert all(moved == pytest.approx(1e-4, rel=0.02) for moved in run["master_moved"]), run
    assert all(moved > 5e-5 for moved in run["weight_moved"]), run


@pytest.mark.parametrize("case", ["sum:bf16:zero1", "sum:bf16:scan"])
def test_the_update_is_handed_the_fp32_sum_of_the_micro_batches_gradients(results, case):
    """Micro-batches' bf16 gradients add up in fp32 (`grad_accum_dtype`); ZeRO-1 and ZeRO-2
    update with that sum exactly (a bf16 copy of the model outside DeepSpeed adds them up)."""
    run = results[case]
    assert run["sum_needs_fp32"] and run["applied_is_the_sum"], run


def test_deepspeeds_default_zero1_rounds_the_sum_to_bf16(results):
    """What `communication_data_type: fp32` stands in for: by default DeepSpeed 0.19 all-reduces
    BF16_Optimizer's fp32 gradients in bf16 and copies them back, on a world of one too, and the
    update sees the sum rounded to bf16."""
    default = results["sum:bf16:zero1-default"]
    assert default["sum_needs_fp32"]
    assert not default["applied_is_the_sum"] and default["applied_in_bf16"], default


def test_the_switch_reaches_deepspeed_in_bf16_only():
    on = EngineConfig(kind="deepspeed", processes=1, precision="bf16")
    off = on.model_copy(update={"overflow_scan": False})
    assert "check_grad_overflow" not in deepspeed_config(on, 1.0, 1, 1)["bf16"]
    assert deepspeed_config(off, 1.0, 1, 1)["bf16"]["check_grad_overflow"] is False
    fp32 = off.model_copy(update={"precision": "fp32"})
    assert "check_grad_overflow" not in deepspeed_config(fp32, 1.0, 1, 1)["bf16"]


@pytest.mark.parametrize("stage", [1, 3])
def test_zero1_and_zero3_have_no_scan_to_turn_off(stage):
    with pytest.raises(ValueError, match="overflow_scan: false applies to zero_stage 2"):
        EngineConfig(kind="deepspeed", zero_stage=stage, precision="bf16", overflow_scan=False)


def test_zero1_is_deepspeeds_bf16_optimizer_and_nothing_else():
    """ZeRO-1 in bf16 with fp32 accumulation is the one configuration DeepSpeed 0.19 serves with
    BF16_Optimizer (engine.py `_do_optimizer_sanity_check`); in fp32 it would be another
    optimizer the project has never measured, so it is refused by name."""
    with pytest.raises(ValueError, match="zero_stage: 1 is DeepSpeed's bf16 optimizer"):
        EngineConfig(kind="deepspeed", zero_stage=1)
    zero1 = EngineConfig(kind="deepspeed", processes=1, zero_stage=1, precision="bf16")
    config = deepspeed_config(zero1, 1.0, 1, 1)
    assert config["zero_optimization"]["stage"] == 1
    assert config["bf16"] == {"enabled": True, "immediate_grad_update": True}
    assert config["data_types"] == {"grad_accum_dtype": "fp32"}
    assert config["communication_data_type"] == "fp32"
    zero2 = zero1.model_copy(update={"zero_stage": 2})
    assert "immediate_grad_update" not in deepspeed_config(zero2, 1.0, 1, 1)["bf16"]


def test_an_optimizer_without_the_norm_is_named():
    from training.finite import check_norm_before_update

    with pytest.raises(TypeError, match="overflow_scan: true"):
        check_norm_before_update(object())

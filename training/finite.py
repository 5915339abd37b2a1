"""The stop on a non-finite loss: a NaN or infinite loss (or gradient norm) ends a training stage
before the bad update reaches the weights or a checkpoint, so the last good checkpoint stays on
disk and a rerun resumes from it."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


class NonFiniteLossError(FloatingPointError):
    """A training stage met a NaN or infinite value and stopped before applying it.

    The message names the stage, the step (as its metrics count steps), the value and the
    checkpoint that is kept.
    """

    def __init__(
        self,
        desc: str,
        step: int,
        what: str,
        value: float,
        checkpoint_step: int = 0,
        ckpt_dir: Path | None = None,
    ):
        self.desc, self.step, self.what, self.value = desc, step, what, value
        self.checkpoint_step, self.ckpt_dir = checkpoint_step, ckpt_dir
        where = f" in {ckpt_dir}" if ckpt_dir is not None else ""
        kept = (
            f"the last checkpoint (step {checkpoint_step}){where} is kept"
            if checkpoint_step
            else f"no checkpoint had been saved yet{where}"
        )
        super().__init__(
            f"{desc}: {what} is {value} at step {step}; stopped before the update, {kept}. "
            "Lower the learning rate or look at this step's data; a rerun resumes from the "
            "checkpoint"
        )

    def __reduce__(self):  # keeps the error picklable (Prefect stores a failed task's error)
        return (
            type(self),
            (self.desc, self.step, self.what, self.value, self.checkpoint_step, self.ckpt_dir),
        )


@dataclass
class LossGuard:
    """Where a training run stands, so a non-finite value is reported with its step and with the
    checkpoint that is kept. The loop sets `step` before each update and `checkpoint_step` when
    it saves or resumes."""

    desc: str
    ckpt_dir: Path | None = None
    step: int = 0  # the step being computed, counted from 1 as the metrics are
    checkpoint_step: int = 0  # the step of the checkpoint on disk; 0: none

    def check(self, what: str, value: torch.Tensor | float) -> float:
        """`value` as a float; raises NonFiniteLossError if it is NaN or infinite."""
        number = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
        if not math.isfinite(number):
            raise NonFiniteLossError(
                self.desc, self.step, what, number, self.checkpoint_step, self.ckpt_dir
            )
        return number


class NonFiniteNorm(FloatingPointError):
    """Raised inside a ZeRO optimizer's step by `check_norm_before_update`, before anything is
    applied; the engine's `step` turns it into the guard's NonFiniteLossError."""

    def __init__(self, norm: float):
        super().__init__(f"the global gradient norm is {norm}")
        self.norm = norm


def check_norm_before_update(optimizer: Any) -> None:
    """Have a DeepSpeed ZeRO-1/2 optimizer (`DeepSpeedZeroOptimizer`) raise NonFiniteNorm when
    the global gradient norm that its step computes for clipping is NaN or infinite, before the
    update. It stands in for DeepSpeed's bf16 overflow scan (`bf16.check_grad_overflow`), which
    reduces every gradient twice and reads the verdict back each step: with the scan off,
    DeepSpeed 0.19 clips a bf16 step by an infinite norm and applies the NaN. One read-back a
    step, of a norm computed anyway. DeepSpeed marks an invalid group norm infinite or -1
    (`combine_grad_norm_groups`), so a negative one is refused too."""
    if getattr(optimizer, "scaled_global_norm", None) is None:
        raise TypeError(
            f"engine.overflow_scan: false needs a DeepSpeed ZeRO-1/2 optimizer with "
            f"`scaled_global_norm` (DeepSpeed 0.19's); this one is {type(optimizer).__name__}: "
            "set engine.overflow_scan: true"
        )

    compute = type(optimizer).scaled_global_norm
    owner = weakref.ref(optimizer)  # the optimizer holds `checked`: no cycle back to it

    def checked(*args: Any, **kwargs: Any) -> torch.Tensor:
        norm = compute(owner(), *args, **kwargs)
        value = float(norm)
        if not math.isfinite(value) or value < 0:
            raise NonFiniteNorm(value)
        return norm

    optimizer.scaled_global_norm = checked

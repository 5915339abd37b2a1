"""The stop on a non-finite loss: a NaN or infinite loss (or gradient norm) ends a training stage
before the bad update reaches the weights or a checkpoint, so the last good checkpoint stays on
disk and a rerun resumes from it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

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

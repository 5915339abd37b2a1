"""Synchronous GRPO: every step samples with the trainer's own sampler from the policy as it is
after the last update (version = step), while training waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from rl.sources import Draw, DrawPlan, DrawRequest
from sampling.factory import Sampler


class ColocatedSource:
    """Rollouts from `sampler()` (the trainer's, opened by the trainer) over `model`."""

    def __init__(self, sampler: Callable[[], Sampler], model: torch.nn.Module):
        self.sampler = sampler
        self.model = model

    def begin(
        self, first: int, plan: DrawPlan, model: torch.nn.Module, carried: Any | None
    ) -> None:
        """Nothing: each step's request comes with `take`."""

    def take(self, step: int, request: DrawRequest) -> Draw:
        began = time.perf_counter()
        self.model.eval()
        with torch.no_grad():
            groups = self.sampler().generate(request.prompts, request.n, request.params)
        seconds = time.perf_counter() - began
        return Draw(step, groups, step, seconds, seconds)

    def publish(self, model: torch.nn.Module, version: int, changed: bool) -> None:
        """Nothing: the sampler samples from the policy itself, or the trainer syncs it."""

    def carried(self) -> None:
        return None

    def close(self) -> None:
        """Nothing: the sampler is the trainer's to close."""

"""Where a GRPO trainer's rollouts come from (its "rollout source").

- `ColocatedSource` (rl/sources/colocated.py): the trainer's own sampler, on the policy as it is,
  step after step: synchronous GRPO, as the paper runs it.
- `PipelinedSource` (rl/sources/pipelined.py): sampling workers (processes on this machine, or
  Ray actors) that draw the next steps' groups while the trainer updates, each step from the
  policy exactly `max_staleness` updates older than the one it trains (fewer at the start).

Each draw says which policy version made it: version v is the policy after v steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sampling.interface import Completion, SamplingParams


@dataclass(frozen=True)
class DrawRequest:
    """What a step samples: `n` completions of each prompt with `params`."""

    prompts: list[str]
    n: int
    params: SamplingParams


DrawPlan = Callable[[int], DrawRequest]  # step -> its request, a pure function of the step


@dataclass(frozen=True)
class Draw:
    """A step's groups (one per prompt, in prompt order) and where they came from."""

    step: int
    groups: list[list[Completion]]
    version: int  # the policy version whose weights sampled them
    wait_seconds: float  # the trainer's time from asking for them to having them
    sample_seconds: float  # the sampler's time generating them

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/policy_version": float(self.version),
            "rollout/staleness": float(self.step - self.version),
            "time/sampler_seconds": self.sample_seconds,
        }


class RolloutSource(Protocol):
    """What a GRPO trainer draws its rollouts from (rl/trainer.py)."""

    def begin(
        self, first: int, plan: DrawPlan, model: torch.nn.Module, carried: Any | None
    ) -> None:
        """Before step `first` (after a resume, if any): `plan` names each step's request,
        `model` holds the weights of version `first`, and `carried` is what `carried()` returned
        when the checkpoint being resumed was written."""
        ...

    def take(self, step: int, request: DrawRequest) -> Draw:
        """Step `step`'s draw of `request` (steps are taken in order; a source that drew ahead
        drew what `plan(step)` named, which is `request`)."""
        ...

    def publish(self, model: torch.nn.Module, version: int, changed: bool) -> None:
        """`model` now holds version `version` (`changed`: an update ran since the last)."""
        ...

    def carried(self) -> Any | None:
        """What a checkpoint written now must keep for a resumed run to draw what this one
        draws: the draws made for steps not yet trained whose weights it will not have."""
        ...

    def close(self) -> None: ...

"""The one training loop: every trainer (pretraining and SFT, in one process or under DeepSpeed;
GRPO; on-policy distillation; the reward model) runs its steps through `run_loop`.

A trainer is a `Stepper`: it makes one update per call of `run_step` through its engine
(training.engines), and names what it adds to a checkpoint. The loop owns what they share:
resuming from the last checkpoint of the same run (weights, optimizer and schedule through the
engine, RNG state and the step, the data cursor: batch order is a pure function of the seed),
the progress bar, the guard against a non-finite loss, periodic checkpoints, metrics every
`log_every` steps with the progress fraction, and an optional time budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from host.terminal import progress_bar
from training import PROGRESS
from training.engines import UpdateEngine
from training.finite import LossGuard

log = logging.getLogger(__name__)

MetricsFn = Callable[[dict[str, float], int], None]


class Stepper(Protocol):
    """What a trainer gives the loop."""

    engine: UpdateEngine
    guard: LossGuard  # the loop sets its step and checkpoint; the trainer checks its values

    def start(self, resumed_from: int) -> None:
        """Before the first step of this call (after a resume, if any)."""
        ...

    def run_step(self, step: int) -> dict[str, float]:
        """Step `step` (counted from 0): one update; returns its metrics."""
        ...

    def checkpoint_state(self) -> dict[str, Any]:
        """What the trainer keeps in a checkpoint beyond the engine's weights and optimizer."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what `checkpoint_state` kept."""
        ...


@dataclass(frozen=True)
class LoopPlan:
    desc: str
    steps: int
    checkpoint_every: int
    log_every: int = 1
    # metrics logged as their mean over the steps since the last log (others: the last step's)
    window_mean: tuple[str, ...] = ()
    postfix: tuple[str, str] | None = None  # (label, metric) the progress bar shows
    show_progress: bool = True
    log_line_every: int = 0  # an info line every this many steps; 0: none
    # called before each step with the seconds spent; True ends the run there, checkpointed
    out_of_time: Callable[[float], bool] | None = None


@dataclass
class LoopReport:
    steps: int  # steps done when the loop ended: the plan's, or fewer when time ran out
    resumed_from: int
    seconds: float
    last: dict[str, float] = field(default_factory=dict)  # the last step's metrics


def run_loop(
    stepper: Stepper,
    plan: LoopPlan,
    ckpt_dir: Path | None,
    fingerprint: str,
    log_metrics: MetricsFn,
) -> LoopReport:
    """Run `plan.steps` steps of `stepper`, resuming from `ckpt_dir` if it holds a checkpoint of
    the run named by `fingerprint` (no `ckpt_dir`: no checkpoints). A NaN or infinite loss or
    gradient norm stops the run with NonFiniteLossError before the update, keeping the last
    checkpoint."""
    guard = stepper.guard
    guard.ckpt_dir = ckpt_dir
    start = _resume(stepper, plan, ckpt_dir, fingerprint, log_metrics)
    stepper.start(start)
    began = time.perf_counter()
    bar = progress_bar(
        plan.show_progress,
        total=plan.steps,
        initial=start,
        desc=plan.desc,
        unit="step",
        leave=False,
    )
    window: dict[str, list[float]] = {key: [] for key in plan.window_mean}
    done, metrics = start, {}
    for step in range(start, plan.steps):
        if plan.out_of_time is not None and plan.out_of_time(time.perf_counter() - began):
            log.info("%s: time budget spent after %d steps", plan.desc, step)
            _checkpoint(stepper, ckpt_dir, fingerprint, step)
            break
        guard.step = step + 1
        metrics = stepper.run_step(step)
        done = step + 1
        bar.update(1)
        if plan.postfix is not None:
            label, key = plan.postfix
            bar.set_postfix({label: f"{metrics[key]:.3f}"})
        for key, values in window.items():
            values.append(metrics[key])
        if done % plan.log_every == 0 or done == plan.steps:
            means = {key: sum(values) / len(values) for key, values in window.items()}
            log_metrics(metrics | means | {PROGRESS: done / plan.steps}, done)
            window = {key: [] for key in plan.window_mean}
        if plan.log_line_every and done % plan.log_line_every == 0 and plan.postfix is not None:
            label, key = plan.postfix
            log.info("%s: step %d/%d %s %.4f", plan.desc, done, plan.steps, label, metrics[key])
        if done % plan.checkpoint_every == 0 or done == plan.steps:
            _checkpoint(stepper, ckpt_dir, fingerprint, done)
    bar.close()
    stepper.engine.module.eval()
    return LoopReport(done, start, time.perf_counter() - began, metrics)


def _resume(
    stepper: Stepper,
    plan: LoopPlan,
    ckpt_dir: Path | None,
    fingerprint: str,
    log_metrics: MetricsFn,
) -> int:
    if ckpt_dir is None:
        return 0
    state = stepper.engine.load(ckpt_dir, fingerprint)
    if state is None:
        return 0
    stepper.restore(state)
    torch.set_rng_state(state["rng"])
    start = stepper.guard.checkpoint_step = state["step"]
    log.info("%s: resuming from step %d of %d", plan.desc, start, plan.steps)
    log_metrics({"train/resumed_from_step": float(start)}, start)
    return start


def _checkpoint(stepper: Stepper, ckpt_dir: Path | None, fingerprint: str, step: int) -> None:
    if ckpt_dir is None:
        return
    state = {"rng": torch.get_rng_state(), "step": step, "fingerprint": fingerprint}
    stepper.engine.save(ckpt_dir, stepper.checkpoint_state() | state)
    stepper.guard.checkpoint_step = step

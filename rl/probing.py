"""A GRPO stage's held-out probe (the paper's Figure 2, small, and what the guard reads), on the
trainer's path or off it.

- On the path (`InlineProbes`): after a probe step's update the trainer's own sampler draws the
  probe's completions from the policy as it is, and training waits. Synchronous GRPO, and any
  probe that is only a function of a sampler.
- Off it (`OffPathProbes`, where `probe.on_workers` asks; off by default, docs/guard.md): where
  rollouts come from sampling workers (rl/sources/pipelined.py),
  the probe of the policy after step s is a job for the workers like any step's draw, naming
  policy version s, and the trainer grades what they drew `lag` steps later, at step s + lag
  (at the stage's last step at the latest), waiting only where it has not landed. The step
  that reads a probe is fixed by the schedule, not by how fast either side runs, so a run's
  history, and what the guard reads in it, is the same however fast the workers are, and after
  a resume: a checkpoint keeps the probes drawn from versions before its own and not yet read,
  as it keeps draws made ahead, and a resumed run draws the probe of its own version again.

A probe read off the path lands in the history entry of the step that reads it, with
`probe/policy_version` naming the version it measured; its figures are logged there too, the
curves plot them at that version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from guard.history import PROBE_VERSION
from guard.paired import ITEMS
from rl.sources import DrawRequest
from sampling.factory import Sampler
from sampling.interface import Completion

Groups = list[list[Completion]]
ProbeFn = Callable[[Sampler], dict[str, float]]


@dataclass
class HeldoutProbe:
    """What a probe draws (`request`) and how its draw is graded (`grade`: figures by name,
    `items/...` per-problem values among them); `context_length` is the longest prompt plus
    the tokens it may sample, for a sampler that must be sized for it."""

    request: DrawRequest
    grade: Callable[[Groups], dict[str, float]]
    context_length: int = 0

    @property
    def rows(self) -> int:
        """The completions it draws (prompts x samples)."""
        return len(self.request.prompts) * self.request.n

    def __call__(self, sampler: Sampler) -> dict[str, float]:
        r = self.request
        return self.grade(sampler.generate(r.prompts, r.n, r.params))


# the most rows a CPU probe decodes at once: a large probe (problems x samples) is cut into
# batches of this many rather than held as one cache
MOST_PROBE_ROWS = 1024


def sampler_rows(step_rows: int, probe: object, model: Any) -> int:
    """The rows a trainer's own sampler decodes together: a step's, and where `model` is on the
    CPU the whole probe's where it has more, up to MOST_PROBE_ROWS (a step's draw is one batch
    either way). There a decode step's cost is mostly per step, not per row: R1-Zero's probe of
    300 rows took 1.7 s in one batch against 2.4 s in five of 64 (`python -m
    benchmarks.probe_cost`, docs/guard.md). On a device the batch's cache takes memory the step
    does not need (300 rows of 1,200 tokens hold about 10 GB of a 1.5B Qwen's), so there it
    stays a step's."""
    if model.device.type == "cpu" and isinstance(probe, HeldoutProbe):
        return max(step_rows, min(probe.rows, MOST_PROBE_ROWS))
    return step_rows


@dataclass
class Reading:
    """What a step's probing adds: `metrics` logged with the step's, `items` kept in the step's
    history entry only, and `entries`: probes of earlier versions read now, each a history entry
    of its own (before the step's) and logged at the version it measured."""

    metrics: dict[str, float] = field(default_factory=dict)
    items: dict[str, float] = field(default_factory=dict)
    entries: list[dict[str, float]] = field(default_factory=list)


class ProbeRunner(Protocol):
    """Where the trainer's probe runs. `inline`: on the trainer's own sampler (which the trainer
    then opens)."""

    inline: bool

    def start(self, resumed_from: int) -> Reading:
        """Before the first step trained here (the probe before training, where it is read at
        once, as `entries`)."""
        ...

    def after(self, step: int) -> Reading:
        """After step `step`'s update (policy version `step`)."""
        ...

    def flush(self, step: int) -> None:
        """Before a checkpoint written after step `step`."""
        ...


def probe_steps(every: int, steps: int) -> list[int]:
    """The policy versions a stage probes: before training, every `every` steps, and its last;
    a regular one less than half an interval before the last is left out (85 steps every 20:
    0, 20, 40, 60, 85), as the last reads the policy of nearly the same steps."""
    regular = [s for s in range(every, steps, every) if steps - s >= every / 2]
    return sorted({0, *regular, steps})


def longest_probe_gap(every: int, steps: int) -> int:
    """The most steps between two probes of a stage (under 1.5 intervals; 0: no probe)."""
    if every <= 0:
        return 0
    versions = probe_steps(every, steps)
    return max((b - a for a, b in zip(versions, versions[1:], strict=False)), default=0)


def split_figures(figures: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """A probe's figures as `heldout/<name>` metrics, and its per-problem values apart."""
    items = {k: v for k, v in figures.items() if k.startswith(ITEMS)}
    metrics = {f"heldout/{k}": v for k, v in figures.items() if not k.startswith(ITEMS)}
    return metrics, items


class InlineProbes:
    """The probe on the trainer's path: `measure()` runs it on the policy as it is now."""

    inline = True

    def __init__(self, measure: Callable[[], dict[str, float]], every: int, steps: int):
        self.measure, self.versions = measure, probe_steps(every, steps)

    def start(self, resumed_from: int) -> Reading:
        if resumed_from:
            return Reading()
        metrics, items = self._run()
        return Reading(entries=[{"step": 0.0, **metrics, **items}])

    def after(self, step: int) -> Reading:
        if step not in self.versions:
            return Reading()
        metrics, items = self._run()
        return Reading(metrics, items)

    def flush(self, step: int) -> None:
        """Nothing: every probe here is read when it is drawn."""

    def _run(self) -> tuple[dict[str, float], dict[str, float]]:
        began = time.perf_counter()
        metrics, items = split_figures(self.measure())
        return metrics | {"time/probe_seconds": time.perf_counter() - began}, items


class ProbingSource(Protocol):
    """A rollout source that draws probes too (rl/sources/pipelined.py)."""

    def submit_probe(self, version: int, request: DrawRequest, part: int, parts: int) -> None:
        """Part `part` of `parts` of the probe of `version` (its prompts in even slices)."""
        ...

    def probe_draw(self, version: int) -> tuple[Groups, float]:
        """The probe of `version`'s groups and the workers' seconds on it, waited for."""
        ...


class OffPathProbes:
    """The probe drawn by the sampling workers of `source`, read `lag` steps after the version
    it measures (module docstring). It is sent a slice a step over those `lag` steps, each slice
    behind that step's draw in the workers' queue, so that it fills the time they would wait
    for the trainer instead of holding up the next step's rollouts; a checkpoint first sends
    the slices still unsent of the probes it must keep (`flush`)."""

    inline = False

    def __init__(
        self, probe: HeldoutProbe, source: ProbingSource, every: int, steps: int, lag: int
    ):
        self.probe, self.source, self.lag, self.steps = probe, source, max(1, lag), steps
        self.versions = probe_steps(every, steps)
        self.first = 0  # the step training (re)started from: older probes come from the checkpoint
        self.flushed: set[int] = set()  # probes sent whole ahead of a checkpoint

    def read_at(self, version: int) -> int:
        """The step after which the probe of `version` is read."""
        return min(version + self.lag, self.steps)

    def parts(self, version: int) -> int:
        """The slices the probe of `version` is sent in: one a step until it is read."""
        return max(1, min(self.read_at(version) - version, len(self.probe.request.prompts)))

    def start(self, resumed_from: int) -> Reading:
        """Send the first slice of the probe of the version training starts from, where one is
        due (a resumed run's checkpoint keeps the probes of older versions not yet read)."""
        self.first = resumed_from
        self._send(resumed_from)
        return Reading()

    def after(self, step: int) -> Reading:
        self._send(step)
        reading = Reading()
        began = time.perf_counter()
        for version in (v for v in self.versions if v <= step and self.read_at(v) == step):
            groups, drawn = self.source.probe_draw(version)  # the last: drawn now, waited for
            metrics, items = split_figures(self.probe.grade(groups))
            entry = {"step": float(step), PROBE_VERSION: float(version), **metrics, **items}
            reading.entries.append(entry | {"time/probe_sampler_seconds": drawn})
        if reading.entries:
            reading.metrics["time/probe_seconds"] = time.perf_counter() - began
        return reading

    def flush(self, step: int) -> None:
        """Before a checkpoint written after step `step`: send every slice not yet sent of the
        probes of versions before it that are read after it (a resumed run has not their
        weights, so the checkpoint must keep them drawn whole)."""
        for version in self._mine():
            parts = self.parts(version)
            if version < step < self.read_at(version):
                for part in range(step - version + 1, parts):
                    self.source.submit_probe(version, self.probe.request, part, parts)
                self.flushed.add(version)

    def _send(self, step: int) -> None:
        """The slice of each probe due at `step`: slice `step - v` of the probe of version v."""
        for version in self._mine():
            part, parts = step - version, self.parts(version)
            if 0 <= part < parts and version not in self.flushed:
                self.source.submit_probe(version, self.probe.request, part, parts)

    def _mine(self) -> list[int]:
        return [v for v in self.versions if v >= self.first]

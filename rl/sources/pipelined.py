"""Asynchronous GRPO with bounded staleness: sampling workers draw the next steps' groups while
the trainer updates.

Step s is always drawn from policy version max(0, s - k), k = `max_staleness`: the policy after
step s - k's update. That version exists once the trainer has finished step s - k - 1, so while
it trains step t the workers may draw steps t + 1 ... t + k, and never from weights more than k
updates old. The schedule is fixed rather than "the newest weights a worker has": which version
made a step's samples is then a function of the step alone, so a run gives the same rows and
curves however fast either side is, on one worker or many, and after a resume. At k = 0 each
step waits for the update before it: synchronous GRPO on a worker.

A checkpoint written before step c keeps the draws of steps c ... c + k - 1 (they were drawn
from versions older than c, which a resumed run does not hold): `carried()` waits for them and
returns them, and `begin` takes them back. Step c + k and later are drawn again from the
checkpoint's own weights, exactly as the first run drew them.

The workers draw the trainer's held-out probe too (rl/probing.py): `submit_probe` sends a part of
the probe of a published version as a job of its own, `probe_draw` waits for what they drew. A
checkpoint keeps the probes of versions before its own not yet read, as it keeps draws.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from rl.sources import Draw, DrawPlan, DrawRequest
from sampling.interface import Completion
from sampling.workers import DrawJob, DrawResult, Workers
from sampling.workers.versions import VersionFolder, VersionMismatchError

log = logging.getLogger(__name__)


class MissingRolloutsError(RuntimeError):
    """A checkpoint that lacks the draws a resumed asynchronous run needs."""


class PipelinedSource:
    """Rollouts from `workers`, drawn up to `max_staleness` steps ahead of training; policy
    versions are handed over as files in `folder`. Owns the workers: `close()` ends them."""

    def __init__(self, workers: Workers, folder: Path, max_staleness: int, steps: int):
        self.workers, self.folder, self.k, self.steps = workers, folder, max_staleness, steps
        self.versions: VersionFolder | None = None
        self.plan: DrawPlan | None = None
        self.ready: dict[int, Draw] = {}  # drawn whole, not yet taken
        self.parts: dict[int, dict[int, DrawResult]] = {}  # step -> chunk -> result
        self.chunks: dict[int, int] = {}  # submitted, not yet drawn whole: step -> its chunks
        self.next = 0  # the next step to submit
        self.taking = 0  # the next step the trainer takes
        self.latest = -1  # the newest version published
        self.probe_parts: dict[int, dict[int, DrawResult]] = {}  # version -> chunk -> result
        self.probe_chunks: dict[int, int] = {}  # probes submitted, not yet drawn whole
        self.probes: dict[int, tuple[list[list[Completion]], float]] = {}  # drawn, not yet read

    def needs(self, step: int) -> int:
        """The policy version step `step` is drawn from."""
        return max(0, step - self.k)

    def begin(
        self, first: int, plan: DrawPlan, model: torch.nn.Module, carried: Any | None
    ) -> None:
        self.plan, self.taking = plan, first
        self.versions = VersionFolder(self.folder)
        records = carried or []
        self.ready = {
            d.step: d for d in map(draw_from_record, (r for r in records if "probe" not in r))
        }
        self.probes = {
            r["version"]: (draw_from_record(r).groups, 0.0) for r in records if "probe" in r
        }
        wanted = range(first, min(first + self.k, self.steps))
        missing = [s for s in wanted if self.needs(s) < first and s not in self.ready]
        if missing:
            raise MissingRolloutsError(
                f"the checkpoint at step {first} does not hold the rollouts of steps {missing}, "
                f"drawn from policy versions before {first} (max_staleness {self.k}); it was not "
                "written by this run's settings"
            )
        self.next = max([first - 1, *self.ready]) + 1
        self.publish(model, first, changed=True)

    def publish(self, model: torch.nn.Module, version: int, changed: bool) -> None:
        assert self.versions is not None, "begin() first"
        self.versions.publish(model, version, changed)
        self.latest = version
        self._submit()

    def _submit(self) -> None:
        """Send every step whose version is published, then forget versions no job needs."""
        assert self.plan is not None and self.versions is not None
        while self.next < self.steps and self.needs(self.next) <= self.latest:
            step = self.next
            version = self.versions.versions[self.needs(step)]
            jobs = split(step, self.plan(step), version, self.workers.size)
            for job in jobs:
                self.workers.submit(job)
            self.chunks[step] = len(jobs)
            self.next += 1
        needed = [self.needs(s) for s in self.chunks] + list(self.probe_chunks)
        self.versions.release(min(needed + [self.latest]))

    def submit_probe(self, version: int, request: DrawRequest, part: int, parts: int) -> None:
        """Part `part` of `parts` of the probe of published version `version` (its prompts in
        `parts` slices as even as can be, each a job of its own, so that a probe can be sent a
        slice a step, between the steps' draws); its version is kept until every part is drawn."""
        assert self.versions is not None and version in self.versions.versions, version
        assert 0 <= part < parts <= len(request.prompts), (part, parts)
        n = len(request.prompts)
        start, end = part * n // parts, (part + 1) * n // parts
        params = dataclasses.replace(
            request.params, prompt_offset=request.params.prompt_offset + start
        )
        job = DrawJob(
            version,
            part,
            request.prompts[start:end],
            request.n,
            params,
            self.versions.versions[version],
            probe=True,
        )
        self.workers.submit(job)
        self.probe_chunks[version] = parts

    def probe_draw(self, version: int) -> tuple[list[list[Completion]], float]:
        """The probe of `version`'s groups and the workers' seconds on it, waited for."""
        if version not in self.probes and version not in self.probe_chunks:
            raise RuntimeError(f"no probe of policy version {version} was submitted")
        while version not in self.probes:
            self._collect(self.workers.result())
        return self.probes.pop(version)

    def take(self, step: int, request: DrawRequest) -> Draw:
        if step != self.taking or step >= self.next:
            raise RuntimeError(f"step {step} taken out of order (next is {self.taking})")
        began = time.perf_counter()
        while step not in self.ready:
            self._collect(self.workers.result())
        self.taking = step + 1
        return dataclasses.replace(self.ready.pop(step), wait_seconds=time.perf_counter() - began)

    def _collect(self, result: DrawResult) -> None:
        if result.probe:
            self._collect_probe(result)
            return
        if result.version != self.needs(result.step):
            raise VersionMismatchError(
                f"step {result.step} was drawn from policy version {result.version}, not "
                f"{self.needs(result.step)} (worker pid {result.pid} on {result.node})"
            )
        ordered = gathered(self.parts, result, self.chunks[result.step])
        if ordered is None:
            return
        groups = [group for r in ordered for group in r.groups]
        self.ready[result.step] = Draw(result.step, groups, result.version, 0.0, seconds(ordered))
        del self.chunks[result.step]

    def _collect_probe(self, result: DrawResult) -> None:
        """A probe job's result (its `step` is the version it names)."""
        if result.version != result.step:
            raise VersionMismatchError(
                f"the probe of policy version {result.step} was drawn from version "
                f"{result.version} (worker pid {result.pid} on {result.node})"
            )
        ordered = gathered(self.probe_parts, result, self.probe_chunks[result.step])
        if ordered is None:
            return
        self.probes[result.step] = ([g for r in ordered for g in r.groups], seconds(ordered))
        del self.probe_chunks[result.step]

    def carried(self) -> list[dict[str, Any]]:
        """The draws of the steps after the last trained one that come from versions before
        the current one, and the probes of those versions not yet read, each waited for."""
        keep = [s for s in range(self.taking, self.next) if self.needs(s) < self.taking]
        probes = sorted(v for v in {*self.probe_chunks, *self.probes} if v < self.taking)
        while any(s not in self.ready for s in keep) or any(v not in self.probes for v in probes):
            self._collect(self.workers.result())
        records = [draw_record(self.ready[s]) for s in keep]
        return records + [probe_record(v, self.probes[v][0]) for v in probes]

    def close(self) -> None:
        """End the workers and remove the version files (a model's size each)."""
        self.workers.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def gathered(
    parts: dict[int, dict[int, DrawResult]], result: DrawResult, total: int
) -> list[DrawResult] | None:
    """`result` kept among its job's parts (by step, then chunk); once all `total` are in, every
    part in chunk order (and the job's entry forgotten), else None."""
    mine = parts.setdefault(result.step, {})
    mine[result.chunk] = result
    if len(mine) < total:
        return None
    del parts[result.step]
    return [mine[i] for i in range(total)]


def seconds(parts: list[DrawResult]) -> float:
    """The workers' time on a job's parts: generating and loading versions."""
    return sum(r.generate_seconds + r.load_seconds for r in parts)


def split(step: int, request: DrawRequest, version: Any, workers: int) -> list[DrawJob]:
    """The step's prompts in one chunk per worker (as even as can be); each chunk carries its
    first prompt's index, so its samples are those of the whole request."""
    size = max(1, math.ceil(len(request.prompts) / workers))
    offset = request.params.prompt_offset
    return [
        DrawJob(
            step,
            chunk,
            request.prompts[i : i + size],
            request.n,
            dataclasses.replace(request.params, prompt_offset=offset + i),
            version,
        )
        for chunk, i in enumerate(range(0, len(request.prompts), size))
    ]


def draw_record(draw: Draw) -> dict[str, Any]:
    """A draw as plain data, for a checkpoint."""
    groups = [[dataclasses.asdict(c) for c in group] for group in draw.groups]
    return {"step": draw.step, "version": draw.version, "groups": groups}


def probe_record(version: int, groups: list[list[Completion]]) -> dict[str, Any]:
    """A probe drawn and not yet read, as plain data, for a checkpoint."""
    plain = [[dataclasses.asdict(c) for c in group] for group in groups]
    return {"probe": True, "step": version, "version": version, "groups": plain}


def draw_from_record(record: dict[str, Any]) -> Draw:
    groups = [[Completion(**c) for c in group] for group in record["groups"]]
    return Draw(record["step"], groups, record["version"], 0.0, 0.0)

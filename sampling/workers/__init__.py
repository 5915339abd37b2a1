"""Sampling workers for a trainer: samplers in processes (or Ray actors) of their own that draw a
trainer's rollouts from the policy version each job names, while the trainer updates.

A job is one step's prompts (or a chunk of them) and the version of the policy to sample them
with; a worker loads that version's weights (sampling/workers/versions.py) unless it holds them,
samples, and answers with the groups and the version that made them. Sampling is keyed by
(seed, prompt index, sample index) streams (sampling/streams.py), so a job's samples depend only
on the job: which worker draws it, beside which other jobs, and whether it is drawn again after
a worker died, changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sampling.interface import Completion, SamplingParams
from sampling.workers.versions import PolicyVersion


class RolloutWorkerError(RuntimeError):
    """Sampling workers that failed, or died more often than they may be replaced."""


@dataclass(frozen=True)
class DrawJob:
    """`n` samples of each prompt of step `step`'s chunk `chunk`, drawn with `version`."""

    step: int
    chunk: int
    prompts: list[str]
    n: int
    params: SamplingParams
    version: PolicyVersion
    probe: bool = False  # the held-out probe of `version` (rl/probing.py), not a step's draw


@dataclass(frozen=True)
class DrawResult:
    step: int
    chunk: int
    groups: list[list[Completion]]
    version: int  # the policy version whose weights sampled them
    generate_seconds: float  # the worker's time in generate
    load_seconds: float  # its time loading the version's weights before it (0: it held them)
    pid: int
    node: str
    probe: bool = False  # the job's own


class Workers(Protocol):
    """A pool of sampling workers: jobs in, results out in the order they finish. A worker that
    dies is replaced and the jobs it held are drawn again."""

    size: int  # workers in the pool

    def submit(self, job: DrawJob) -> None: ...

    def result(self) -> DrawResult:
        """The next finished job; raises RolloutWorkerError when none comes within the pool's
        time limit or a worker fails."""
        ...

    def close(self) -> None: ...

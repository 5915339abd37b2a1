"""Sampling in chunks: a chunk is a list of prompts with its own `SamplingParams` (its own seed,
or its prompts' global offset), so its samples are the same whoever samples it. A sampler in
this process takes chunks one after another; a cluster's actors (cluster.actors) take them in
parallel and hand them back as they finish."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sampling.factory import Sampler
from sampling.interface import Completion, SamplingParams


@dataclass(frozen=True)
class ChunkJob:
    """Prompts to sample `n` times each with `params`."""

    prompts: list[str]
    n: int
    params: SamplingParams


def sample_chunks(
    sampler: Sampler, jobs: Sequence[ChunkJob]
) -> Iterator[tuple[int, list[list[Completion]]]]:
    """(job index, its samples) for every job: in order from a sampler in this process, as they
    finish from one that runs chunks itself (a `run_chunks` method: a cluster's actors)."""
    run_chunks = getattr(sampler, "run_chunks", None)
    if callable(run_chunks):
        yield from run_chunks(jobs)
        return
    for index, job in enumerate(jobs):
        yield index, sampler.generate(job.prompts, job.n, job.params)

"""One sampling worker: a sampler that draws each job with the policy version the job names,
loading that version's weights first when it holds another. The same class serves a sampler
process on this machine (sampling/workers/process.py) and a Ray actor (cluster/actors.py).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from configs.reinforcement import SamplerConfig
from sampling.factory import Sampler, open_sampler
from sampling.weight_sync import SyncsWeights
from sampling.workers import DrawJob, DrawResult
from sampling.workers.versions import PolicyVersion, read_version


class RolloutWorker:
    """`draw(job)`: the job's groups, sampled with the weights of `job.version`.

    An hf sampler samples from its own model, into which a version is loaded. A sampler whose
    engine keeps its own copy of the weights (vLLM) gets them through its weight sync from
    `holder`, a copy of the model on the host that each version is loaded into first.
    """

    def __init__(self, sampler: Sampler, holder: torch.nn.Module | None = None):
        self.sampler = sampler
        self.holder = holder
        self.version: int | None = None  # None: the model as opened, no version loaded
        self.node = socket.gethostname()

    @classmethod
    def open(
        cls, config: SamplerConfig, model_path: Path, batch_size: int, threads: int
    ) -> RolloutWorker:
        """A worker over `model_path` (its architecture and tokenizer; the weights each job
        samples with come from its version), with `threads` torch threads."""
        from models.loading import load_tokenizer

        torch.set_num_threads(threads)
        sampler = open_sampler(config, model_path, load_tokenizer(model_path), batch_size)
        if hasattr(sampler, "show_progress"):
            sampler.show_progress = False  # progress is the trainer's
        return cls.around(sampler, model_path)

    @classmethod
    def around(cls, sampler: Sampler, model_path: Path) -> RolloutWorker:
        """A worker over an open sampler of the model at `model_path`."""
        from models.loading import load_model

        return cls(sampler, load_model(model_path) if isinstance(sampler, SyncsWeights) else None)

    def draw(self, job: DrawJob) -> DrawResult:
        began = time.perf_counter()
        if self.version != job.version.number:
            self.load(job.version)
        loaded = time.perf_counter()
        with torch.no_grad():
            groups = self.sampler.generate(job.prompts, job.n, job.params)
        assert self.version == job.version.number
        return DrawResult(
            job.step,
            job.chunk,
            groups,
            job.version.number,
            time.perf_counter() - loaded,
            loaded - began,
            os.getpid(),
            self.node,
            job.probe,
        )

    def load(self, version: PolicyVersion) -> None:
        """Take `version`'s weights (checked against its digest) into the sampler."""
        state = read_version(version)
        if self.holder is not None:
            self.holder.load_state_dict(state)
            self.sampler.sync_weights(self.holder)  # type: ignore[attr-defined]
        else:
            model: Any = getattr(self.sampler, "model", None)
            if model is None:
                raise TypeError(f"{type(self.sampler).__name__} takes no weights")
            model.load_state_dict(state)
        self.version = version.number

    def close(self) -> None:
        self.sampler.close()

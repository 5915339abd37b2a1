"""Small references that stages take and return; Prefect pickles these, never tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ProblemSet:
    train_path: Path
    heldout_path: Path
    n_train: int
    n_heldout: int


@dataclass(frozen=True)
class ModelRef:
    """A saved model folder (weights, config and tokenizer)."""

    path: Path
    parameters: int = 0


@dataclass(frozen=True)
class CuratedSet:
    """The curated traces as a Hugging Face dataset on disk, plus every candidate with its fate."""

    dataset_path: Path
    candidates_path: Path
    n_candidates: int
    n_kept: int
    filter_counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EvalReport:
    metrics: dict[str, float]
    samples_path: Path
    n_problems: int

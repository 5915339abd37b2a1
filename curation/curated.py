"""The curation stage's result as other stages see it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class CuratedSet:
    """The curated traces as a Hugging Face dataset on disk, plus every candidate with its fate."""

    dataset_path: Path
    candidates_path: Path
    n_candidates: int
    n_kept: int
    filter_counts: dict[str, int] = field(default_factory=dict)

"""Small references that stages take and return; Prefect pickles these, never tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from models.loading import parameter_count


@dataclass(frozen=True)
class ProblemSet:
    train_path: Path
    heldout_path: Path
    n_train: int
    n_heldout: int
    skipped_rows: dict[str, int] = field(default_factory=dict)  # "train/<reason>" -> rows


@dataclass(frozen=True)
class ModelRef:
    """A saved model folder (weights, config and tokenizer)."""

    path: Path
    parameters: int = 0


def save_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path
) -> ModelRef:
    """Save a stage's model with its tokenizer under `out_dir/model` and refer to it."""
    model_dir = out_dir / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return ModelRef(path=model_dir, parameters=parameter_count(model))


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

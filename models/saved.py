"""A saved model folder (weights, config and tokenizer) and how a stage saves one; Prefect
pickles these references between tasks, never tensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from models.loading import parameter_count


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

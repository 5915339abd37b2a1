"""A saved model folder (weights, config and tokenizer) and how a stage saves one; Prefect
pickles these references between tasks, never tensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from host.durable import sync_folder, sync_tree
from models.loading import parameter_count


@dataclass(frozen=True)
class ModelRef:
    """A saved model folder (weights, config and tokenizer)."""

    path: Path
    parameters: int = 0


def save_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path
) -> ModelRef:
    """Save a stage's model with its tokenizer under `out_dir/model` and refer to it, its files
    on disk before the stage's result names them (host/durable.py)."""
    model_dir = out_dir / "model"
    model.save_pretrained(model_dir)
    save_tokenizer(tokenizer, model_dir)
    sync_tree(model_dir)
    sync_folder(out_dir)
    return ModelRef(path=model_dir, parameters=parameter_count(model))


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, model_dir: Path) -> None:
    """Save the tokenizer without the padding and truncation a batch call left on its Rust
    backend (sampling sets left padding): tokenizer.json is part of the model's digest, so the
    same weights saved after sampling and after a resume that sampled nothing were two models to
    the stage cache and to lineage. Nothing is lost: every encode call sets its own again
    (transformers' `set_truncation_and_padding`)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_padding()
        backend.no_truncation()
    tokenizer.save_pretrained(model_dir)

"""The data side of supervised training: which examples form each step's batch (a seeded
permutation per epoch, optionally grouped by length), how a batch is laid out (padded rows or
one packed row), and the learning-rate schedule (linear warm-up, cosine decay)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from configs.supervised import TrainConfig
from training.examples import IGNORE, Example


def step_count(n_examples: int, cfg: TrainConfig) -> int:
    """Steps of a run over `n_examples`: `cfg.epochs` passes in batches, the last one cut."""
    return max(1, math.ceil(cfg.epochs * n_examples / cfg.batch_size))


def batch_order(
    n_examples: int, cfg: TrainConfig, lengths: Sequence[int] | None = None
) -> list[list[int]]:
    """Indices of each step's batch: one seeded permutation per epoch, fractional epochs cut.

    Given the examples' `lengths` and `cfg.length_window` > 1, each run of that many batches is
    sorted by length, cut into batches and those batches shuffled: a batch holds examples of
    like length, so little of it is padding, while which examples meet stays random.
    """
    total_steps = step_count(n_examples, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    flat: list[int] = []
    while len(flat) < total_steps * cfg.batch_size:
        flat += torch.randperm(n_examples, generator=generator).tolist()
    flat = flat[: total_steps * cfg.batch_size]
    if lengths is not None and cfg.length_window > 1:
        flat = _length_grouped(flat, lengths, cfg.batch_size, cfg.length_window, generator)
    return [flat[i * cfg.batch_size : (i + 1) * cfg.batch_size] for i in range(total_steps)]


def _length_grouped(
    flat: list[int],
    lengths: Sequence[int],
    batch_size: int,
    window: int,
    generator: torch.Generator,
) -> list[int]:
    """`flat`, each stretch of `window` batches sorted by length into batches, put in a seeded
    order; no example moves out of its stretch, so the epochs stay (nearly) where they were."""
    out: list[int] = []
    span = batch_size * window
    for start in range(0, len(flat), span):
        ranked = sorted(flat[start : start + span], key=lambda i: lengths[i])
        batches = [ranked[i : i + batch_size] for i in range(0, len(ranked), batch_size)]
        for j in torch.randperm(len(batches), generator=generator).tolist():
            out += batches[j]
    return out


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """One example per row, right-padded to the longest, with an attention mask."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(examples), width), dtype=torch.long)  # (B, T)
    for row, e in enumerate(examples):
        ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids)
        labels[row, : len(e.labels)] = torch.tensor(e.labels)
        mask[row, : len(e.input_ids)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def pack(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """The same examples laid end to end in one row, with position ids that restart at each
    example and no attention mask; `pad_id` is unused (nothing is padded).

    Each example's loss is what it is in a row of its own: its first label is ignored, as the
    causal-LM loss's shift drops it there, and no token attends across a restart. Run the model
    under `training.varlen.packed_attention`, which attends within each example; without it,
    transformers builds the row's whole block-diagonal causal mask (the same result, a mask the
    row's length squared). The model must run with `use_cache=False`: with a cache it does not
    read the restarts.
    """
    del pad_id
    ids = torch.tensor([t for e in examples for t in e.input_ids])[None]  # (1, T)
    labels = torch.tensor([t for e in examples for t in [IGNORE, *e.labels[1:]]])[None]  # (1, T)
    positions = torch.cat([torch.arange(len(e.input_ids)) for e in examples])[None]  # (1, T)
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def batch_inputs(cfg: TrainConfig) -> Callable[[list[Example], int], dict[str, torch.Tensor]]:
    """How `cfg` lays a batch out: packed in one row, or one padded row per example."""
    return pack if cfg.packing else collate


def lr_lambda(cfg: TrainConfig, total_steps: int):
    """Linear warm-up, then cosine decay to a tenth of the peak."""

    def scale(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return scale

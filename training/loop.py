"""The training loop shared by pretraining and SFT, with checkpoints that resume exactly.

A checkpoint holds weights, optimizer and scheduler state, RNG state and the data cursor (the
step: batch order is a pure function of the seed), so a run killed mid-way continues where its
last checkpoint left off instead of starting over.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from configs.supervised import TrainConfig
from training import PROGRESS
from training.checkpoints import load_checkpoint, save_checkpoint
from training.examples import IGNORE, Example
from training.finite import LossGuard
from training.varlen import packed_attention

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainReport:
    steps: int
    resumed_from: int
    final_loss: float
    tokens_per_second: float
    seconds: float


def batch_order(
    n_examples: int, cfg: TrainConfig, lengths: Sequence[int] | None = None
) -> list[list[int]]:
    """Indices of each step's batch: one seeded permutation per epoch, fractional epochs cut.

    Given the examples' `lengths` and `cfg.length_window` > 1, each run of that many batches is
    sorted by length, cut into batches and those batches shuffled: a batch holds examples of
    like length, so little of it is padding, while which examples meet stays random.
    """
    total_steps = max(1, math.ceil(cfg.epochs * n_examples / cfg.batch_size))
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


def train(
    model: PreTrainedModel,
    examples: list[Example],
    cfg: TrainConfig,
    ckpt_dir: Path,
    fingerprint: str,
    log_metrics: Callable[[dict[str, float], int], None],
    pad_id: int,
    desc: str = "train",
) -> TrainReport:
    """Train `model` in place on `examples`; resume from `ckpt_dir` if it holds this run's state.

    A NaN or infinite loss or gradient norm stops the run with NonFiniteLossError before the
    update, keeping the last checkpoint.
    """
    if not examples:
        raise ValueError(f"{desc}: no training examples")
    order = batch_order(len(examples), cfg, [len(e.input_ids) for e in examples])
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, len(order)))
    start = 0
    guard = LossGuard(desc, ckpt_dir)
    state = load_checkpoint(ckpt_dir, fingerprint)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        start = guard.checkpoint_step = state["step"]
        log.info("%s: resuming from step %d of %d", desc, start, len(order))
        log_metrics({"train/resumed_from_step": float(start)}, start)
    model.train()
    loss_value, tokens, began = float("nan"), 0, time.perf_counter()
    bar = tqdm(total=len(order), initial=start, desc=desc, unit="step", leave=False)
    lay_out = batch_inputs(cfg)
    for step in range(start, len(order)):
        guard.step = step + 1
        rows = [examples[i] for i in order[step]]
        with packed_attention(model):
            loss = model(**lay_out(rows, pad_id), use_cache=False).loss
        loss_value = guard.check("loss", loss)
        loss.backward()
        guard.check(
            "gradient norm", torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        )
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += sum(len(e.input_ids) for e in rows)
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}")
        done = step + 1
        if done % cfg.log_every == 0 or done == len(order):
            log_metrics(
                {
                    "train/loss": loss_value,
                    "train/lr": scheduler.get_last_lr()[0],
                    PROGRESS: done / len(order),
                },
                done,
            )
            if done % (cfg.log_every * 10) == 0:
                log.info("%s: step %d/%d loss %.4f", desc, done, len(order), loss_value)
        if done % cfg.checkpoint_every == 0 or done == len(order):
            save_checkpoint(
                ckpt_dir,
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "rng": torch.get_rng_state(),
                    "step": done,
                    "fingerprint": fingerprint,
                },
            )
            guard.checkpoint_step = done
    bar.close()
    model.eval()
    seconds = time.perf_counter() - began
    return TrainReport(len(order), start, loss_value, tokens / max(seconds, 1e-9), seconds)

"""Fit a reward model on preference pairs with the Bradley-Terry loss, resumably.

Each step scores the chosen and the rejected responses of a batch of pairs in one forward pass
(2B rows) and pushes their margin up. Batch order, warm-up and cosine schedule and checkpoints
are those of the SFT loop (training/loop.py), so a killed run resumes at its last checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from configs.supervised import TrainConfig
from preference.bradley_terry import bt_loss, pairwise_accuracy
from preference.model import pad_batch, score_ids, sequence_scores
from training.checkpoints import load_checkpoint, save_checkpoint
from training.finite import LossGuard
from training.loop import batch_order, lr_lambda

log = logging.getLogger(__name__)

MetricsFn = Callable[[dict[str, float], int], None]


@dataclass(frozen=True)
class EncodedPair:
    chosen: list[int]
    rejected: list[int]
    group: str = ""  # e.g. the rejection kind, for per-group accuracy


@dataclass(frozen=True)
class RMTrainReport:
    steps: int
    resumed_from: int
    final_loss: float
    seconds: float


def evaluate_pairs(
    model: PreTrainedModel, pairs: Sequence[EncodedPair], pad_id: int, batch_size: int
) -> dict[str, float]:
    """Pairwise accuracy and BT loss over `pairs`, and accuracy per group ("accuracy/<group>")."""
    chosen = torch.tensor(score_ids(model, [p.chosen for p in pairs], pad_id, batch_size))
    rejected = torch.tensor(score_ids(model, [p.rejected for p in pairs], pad_id, batch_size))
    metrics = {
        "accuracy": pairwise_accuracy(chosen, rejected),
        "loss": float(bt_loss(chosen, rejected)),
        "margin": float((chosen - rejected).mean()),
    }
    for group in sorted({p.group for p in pairs} - {""}):
        rows = torch.tensor([p.group == group for p in pairs])
        metrics[f"accuracy/{group}"] = pairwise_accuracy(chosen[rows], rejected[rows])
    return metrics


def _step_loss(
    model: PreTrainedModel, batch: Sequence[EncodedPair], pad_id: int
) -> tuple[torch.Tensor, float]:
    ids, mask = pad_batch([p.chosen for p in batch] + [p.rejected for p in batch], pad_id)
    scores = sequence_scores(model, ids, mask)  # (2B,)
    chosen, rejected = scores[: len(batch)], scores[len(batch) :]
    return bt_loss(chosen, rejected), pairwise_accuracy(chosen.detach(), rejected.detach())


def train_reward_model(
    model: PreTrainedModel,
    pairs: Sequence[EncodedPair],
    cfg: TrainConfig,
    ckpt_dir: Path,
    fingerprint: str,
    log_metrics: MetricsFn,
    pad_id: int,
    show_progress: bool = True,
) -> RMTrainReport:
    """Train `model` in place on `pairs` (AdamW); resume from `ckpt_dir` if it holds this run.

    A NaN or infinite loss or gradient norm stops the run with NonFiniteLossError before the
    update, keeping the last checkpoint.
    """
    if not pairs:
        raise ValueError("reward model: no training pairs")
    order = batch_order(len(pairs), cfg)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, len(order)))
    start = _resume(model, optimizer, scheduler, ckpt_dir, fingerprint)
    guard = LossGuard("reward model", ckpt_dir, checkpoint_step=start)
    model.train()
    loss_value, accs, began = float("nan"), [], time.perf_counter()
    bar = tqdm(total=len(order), initial=start, desc="reward model", leave=False)
    bar.disable = bar.disable or not show_progress
    for step in range(start, len(order)):
        guard.step = step + 1
        loss, acc = _step_loss(model, [pairs[i] for i in order[step]], pad_id)
        loss_value = guard.check("loss", loss)
        loss.backward()
        guard.check(
            "gradient norm", torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        )
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        accs.append(acc)
        bar.update(1)
        done = step + 1
        if done % cfg.log_every == 0 or done == len(order):
            metrics = {"train/loss": loss_value, "train/accuracy": sum(accs) / len(accs)}
            log_metrics(metrics | {"train/lr": scheduler.get_last_lr()[0]}, done)
            accs = []
        if done % cfg.checkpoint_every == 0 or done == len(order):
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            state |= {"scheduler": scheduler.state_dict(), "rng": torch.get_rng_state()}
            save_checkpoint(ckpt_dir, state | {"step": done, "fingerprint": fingerprint})
            guard.checkpoint_step = done
    bar.close()
    model.eval()
    return RMTrainReport(len(order), start, loss_value, time.perf_counter() - began)


def _resume(model, optimizer, scheduler, ckpt_dir: Path, fingerprint: str) -> int:
    state = load_checkpoint(ckpt_dir, fingerprint)
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    log.info("reward model: resuming from step %d", state["step"])
    return state["step"]

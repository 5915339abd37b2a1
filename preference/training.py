"""Fit a reward model on preference pairs with the Bradley-Terry loss, resumably.

Each step scores the chosen and the rejected responses of a batch of pairs in one forward pass
(2B rows) and pushes their margin up. Batch order, warm-up and cosine schedule and checkpoints
are those of SFT, run by the shared loop (training/loop.py), so a killed run resumes at its last
checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from configs.supervised import TrainConfig
from preference.bradley_terry import bt_loss, pairwise_accuracy
from preference.model import pad_batch, score_ids, sequence_scores
from training.batches import batch_order, lr_lambda, step_count
from training.engines import LocalEngine, UpdateEngine
from training.finite import LossGuard
from training.loop import LoopPlan, MetricsFn, run_loop

log = logging.getLogger(__name__)


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


class RewardModelStepper:
    """One step of the reward model in the shared loop (training.loop)."""

    def __init__(
        self, engine: UpdateEngine, pairs: Sequence[EncodedPair], cfg: TrainConfig, pad_id: int
    ):
        self.engine, self.pairs, self.pad_id = engine, pairs, pad_id
        self.guard = LossGuard("reward model")
        self.order = batch_order(len(pairs), cfg)

    def start(self, resumed_from: int) -> None:
        self.engine.module.train()

    def run_step(self, step: int) -> dict[str, float]:
        batch = [self.pairs[i] for i in self.order[step]]
        loss, accuracy = _step_loss(self.engine.forward_model, batch, self.pad_id)
        loss_value = self.guard.check("loss", loss)
        self.engine.backward(loss)
        self.engine.step(self.guard)
        lr = self.engine.learning_rate()
        return {"train/loss": loss_value, "train/accuracy": accuracy, "train/lr": lr}

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        return None


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
    """Train `model` in place on `pairs` (AdamW, the SFT schedule); resume from `ckpt_dir` if it
    holds this run. The logged accuracy is the mean over the steps since the last log."""
    if not pairs:
        raise ValueError("reward model: no training pairs")
    steps = step_count(len(pairs), cfg)
    engine = LocalEngine(
        model, cfg.learning_rate, cfg.max_grad_norm, cfg.weight_decay, lr_lambda(cfg, steps)
    )
    plan = LoopPlan(
        desc="reward model",
        steps=steps,
        checkpoint_every=cfg.checkpoint_every,
        log_every=cfg.log_every,
        window_mean=("train/accuracy",),
        show_progress=show_progress,
    )
    stepper = RewardModelStepper(engine, pairs, cfg, pad_id)
    report = run_loop(stepper, plan, ckpt_dir, fingerprint, log_metrics)
    final_loss = report.last.get("train/loss", float("nan"))
    return RMTrainReport(report.steps, report.resumed_from, final_loss, report.seconds)

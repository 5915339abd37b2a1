"""Pretraining and SFT as a stepper of the one loop (training.loop): token-level cross-entropy
on each batch of examples, in this process or as one rank of a DeepSpeed run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from configs.supervised import EngineConfig, TrainConfig
from models.loading import model_device
from training.batches import batch_inputs, batch_order, lr_lambda, step_count
from training.collective import Collective, Solo
from training.distributed import rank_share, target_count
from training.engines import LocalEngine, UpdateEngine
from training.examples import Example
from training.finite import LossGuard
from training.logits import causal_lm_loss
from training.loop import LoopPlan, MetricsFn, run_loop
from training.memory_fit import micro_batch_tokens
from training.micro import micro_batches, padded_plan
from training.mixed import MixedPrecisionEngine
from training.varlen import packed_attention


@dataclass(frozen=True)
class TrainReport:
    steps: int
    resumed_from: int
    final_loss: float
    tokens_per_second: float
    seconds: float


class SFTStepper:
    """One step: the batch's loss over its target tokens, backward, one update through the
    engine. As one of `world` data-parallel ranks it takes its share of each batch, with the loss
    scaled by the whole batch's target tokens, so the ranks' update is the one-process update.
    A batch (or a rank's share) of more than `micro_batch_tokens` tokens runs as micro-batches,
    each scaled the same way, their gradients accumulated into the one update."""

    def __init__(
        self,
        engine: UpdateEngine,
        examples: Sequence[Example],
        cfg: TrainConfig,
        pad_id: int,
        desc: str,
        collective: Collective | None = None,
        rank: int = 0,
        world: int = 1,
        memory: EngineConfig | None = None,
    ):
        """`memory`: the engine's memory settings. Its micro-batches hold at most
        `micro_batch_tokens` (with `auto`, the most the memory model fits the device,
        training/memory_fit.py); a micro-batch whose float32 logits would exceed
        `logits_chunk_mb` computes its loss a chunk of positions at a time
        (training/logits.py)."""
        self.engine, self.examples, self.cfg, self.pad_id = engine, examples, cfg, pad_id
        self.guard = LossGuard(desc)
        self.collective = collective or Solo()
        self.rank, self.world = rank, world
        memory = memory or EngineConfig()
        longest = max((len(e.input_ids) for e in examples), default=1)
        rows = max(1, cfg.batch_size // world)
        self.micro_batch_tokens = micro_batch_tokens(
            memory, engine.module, "sft", longest, longest, rows
        )
        self.logits_budget, self.fused_head = memory.logits_budget, memory.fused_head
        self.order = batch_order(len(examples), cfg, [len(e.input_ids) for e in examples])
        self.lay_out = batch_inputs(cfg)
        self.tokens = 0  # the tokens this call of the loop has trained on

    def start(self, resumed_from: int) -> None:
        self.engine.module.train()

    def run_step(self, step: int) -> dict[str, float]:
        rows = [self.examples[i] for i in self.order[step]]
        mine = rows if self.world == 1 else rank_share(rows, self.rank, self.world)
        groups = micro_batches([len(e.input_ids) for e in mine], self.micro_batch_tokens)
        extra = 0
        if self.world > 1:
            groups, extra = padded_plan(groups, self.collective)
        # per-sequence attention over forward and backward (checkpointed layers recompute)
        with packed_attention(self.engine.forward_model):
            if self.world == 1 and len(groups) == 1:  # the whole batch in one pass: its mean
                loss = self._loss(mine, None)
                self.engine.backward(loss)
                loss_value = self.guard.check("loss", loss)
            else:
                loss_value = self._accumulate(mine, groups, extra, target_count(rows))
        self.engine.step(self.guard)
        self.tokens += sum(len(e.input_ids) for e in rows)
        return {"train/loss": loss_value, "train/lr": self.engine.learning_rate()}

    def _accumulate(
        self, mine: list[Example], groups: list[list[int]], extra: int, targets: int
    ) -> float:
        """Each micro-batch's loss (its target tokens over the whole batch's), backward; then
        `extra` zero-weight passes to match the rank with the most. The whole batch's loss,
        which every rank checks together."""
        total = 0.0
        for index in groups:
            loss = self._loss([mine[i] for i in index], targets)
            total += float(loss.detach())
            self.engine.backward(loss)
        for _ in range(extra):
            self.engine.backward(self._loss(mine[:1], targets) * 0.0)
        whole = self.collective.sum([total])[0] if self.world > 1 else total
        return self.guard.check("loss", whole)  # every rank stops together

    def _loss(self, rows: list[Example], num_items: int | None) -> torch.Tensor:
        """The causal-LM loss of `rows`: their mean, or their sum over `num_items` targets."""
        inputs = self.lay_out(rows, self.pad_id)
        device = next(self.engine.module.parameters()).device
        inputs = {key: value.to(device) for key, value in inputs.items()}
        return causal_lm_loss(
            self.engine.forward_model, inputs, num_items, self.logits_budget, self.fused_head
        )

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        return None


def sft_plan(cfg: TrainConfig, steps: int, desc: str, show_progress: bool = True) -> LoopPlan:
    return LoopPlan(
        desc=desc,
        steps=steps,
        checkpoint_every=cfg.checkpoint_every,
        log_every=cfg.log_every,
        postfix=("loss", "train/loss"),
        show_progress=show_progress,
        log_line_every=cfg.log_every * 10,
    )


def train(
    model: PreTrainedModel,
    examples: list[Example],
    cfg: TrainConfig,
    ckpt_dir: Path,
    fingerprint: str,
    log_metrics: MetricsFn,
    pad_id: int,
    desc: str = "train",
    engine_config: EngineConfig | None = None,
) -> TrainReport:
    """Train `model` in place on `examples` (AdamW, linear warm-up then cosine decay); resume
    from `ckpt_dir` if it holds this run's state. `engine_config` gives the step's memory
    settings (micro-batch tokens, gradient checkpointing). The model moves to the process's
    device first (models/loading.py `use_device`)."""
    if not examples:
        raise ValueError(f"{desc}: no training examples")
    model.to(model_device())
    memory = engine_config or EngineConfig()
    steps = step_count(len(examples), cfg)
    engine = local_engine(model, cfg, lr_lambda(cfg, steps), memory)
    stepper = SFTStepper(engine, examples, cfg, pad_id, desc, memory=memory)
    report = run_loop(stepper, sft_plan(cfg, steps, desc), ckpt_dir, fingerprint, log_metrics)
    if isinstance(engine, MixedPrecisionEngine):
        engine.full_precision()  # the stage saves the master weights
    final_loss = report.last.get("train/loss", float("nan"))
    rate = stepper.tokens / max(report.seconds, 1e-9)
    return TrainReport(report.steps, report.resumed_from, final_loss, rate, report.seconds)


def local_engine(
    model: PreTrainedModel, cfg: TrainConfig, schedule, memory: EngineConfig
) -> LocalEngine | MixedPrecisionEngine:
    """This process's engine: fp32 AdamW on the model's own weights, or, with `precision: bf16`,
    bf16 weights with fp32 master weights (training/mixed.py)."""
    kind = MixedPrecisionEngine if memory.precision == "bf16" else LocalEngine
    return kind(
        model, cfg.learning_rate, cfg.max_grad_norm, cfg.weight_decay, schedule,
        gradient_checkpointing=memory.gradient_checkpointing,
    )  # fmt: skip

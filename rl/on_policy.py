"""On-policy distillation: the student samples, the teacher scores the student's own tokens, and
the student minimises the per-token reverse KL(student || teacher) on the states it visits.

Unlike SFT on teacher traces (stage 7 of the R1 paper), the student learns where its own mistakes
take it; unlike RL, every token gets a dense signal. The losses and their two estimators are in
rl.kl_losses. The KL is taken at temperature 1 whatever the sampling temperature: that is the
distribution the student ships with; sampling at temperature 1 (the default) keeps the update
exactly on-policy.

The per-token KL on the student's own samples is not monotone in training: as the student moves
it visits other states, often ones where the teacher is sharper. Both the per-token and the
per-sequence value are logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configs.schema import OnPolicyDistillConfig
from models.tokenizer import vocabulary_mismatch
from rl.kl_losses import DISTILL_LOSSES, masked_mean, reverse_kl
from rl.rollouts import PolicyBatch, build_batch
from rl.trainer import prompt_order
from sampling.hf import HFSampler
from sampling.interface import Completion, SamplingParams
from training.engines import LocalEngine
from training.finite import LossGuard
from training.loop import LoopPlan, run_loop

log = logging.getLogger(__name__)

MetricsFn = Callable[[dict[str, float], int], None]


class TokenizerMismatchError(ValueError):
    """Teacher and student do not share a vocabulary, so their per-token distributions differ in
    meaning and no per-token KL between them is defined."""


@dataclass
class DistillReport:
    steps: int
    resumed_from: int
    kl_curve: list[float] = field(default_factory=list)  # mean per-token reverse KL per step
    seconds: float = 0.0


# ---- models ------------------------------------------------------------------------------------


def completion_log_probs(
    model: PreTrainedModel, batch: PolicyBatch, width: int | None = None
) -> torch.Tensor:
    """Log-probabilities (N, C, V) over the vocabulary at each completion position.

    As `rl.rollouts.completion_logprobs`, but keeping the whole distribution, which the exact KL
    needs; only completion positions go through the output projection. `width`: the first
    `width` columns only, normalised over them (a teacher whose embedding is padded wider than
    the student's: `output_width`).
    """
    position_ids = (batch.attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids,
        logits_to_keep=batch.completion_width + 1,
    ).logits[:, :-1, :width]  # (N, C, V): position t predicts completion token t
    return torch.log_softmax(logits.float(), dim=-1)


def output_width(model: PreTrainedModel) -> int:
    """The columns a model predicts over: its tokenizer's tokens and the embedding's padding."""
    return model.get_output_embeddings().weight.shape[0]


def check_shared_tokenizer(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    teacher_tokenizer: PreTrainedTokenizerBase | None = None,
) -> None:
    """Refuse a teacher whose token ids do not mean what the student's mean.

    Given the teacher's tokenizer, its special-token map and then its whole vocabulary (each
    token's id) must equal the student's; the embeddings may be padded to other widths (Qwen2.5
    7B's 152,064 rows against 0.5B's 151,936, one tokenizer of 151,665 tokens), the teacher's at
    least as wide as the student's: the KL is taken over the student's columns, the teacher's
    renormalised over them (its extra rows name no token). Without it the caller vouches that
    the teacher was trained with `tokenizer`, and only equal widths are taken for that (model
    configs' eos ids are not compared: base and chat checkpoints of one tokenizer differ).
    """
    s_width, t_width = output_width(student), output_width(teacher)
    if len(tokenizer) > s_width:
        raise TokenizerMismatchError(
            f"the tokenizer has {len(tokenizer)} tokens but the student predicts only {s_width}"
        )
    if teacher_tokenizer is None:
        if s_width != t_width:
            raise TokenizerMismatchError(
                f"student predicts over {s_width} tokens and teacher over {t_width}, and no "
                "teacher tokenizer was given to compare: on-policy distillation needs one "
                "shared tokenizer (cross-tokenizer distillation is not offered)"
            )
        return
    shared = "on-policy distillation needs one shared tokenizer (cross-tokenizer distillation "
    shared += "is not offered)"
    mismatch = vocabulary_mismatch(tokenizer, teacher_tokenizer)
    if mismatch is not None:
        raise TokenizerMismatchError(f"{mismatch}: {shared}")
    if s_width > t_width:
        raise TokenizerMismatchError(
            f"student predicts over {s_width} tokens, more than the teacher's {t_width}: its "
            "samples could name ids the teacher has no logit for"
        )


@torch.no_grad()
def measure_reverse_kl(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    samples_per_prompt: int = 4,
    max_new_tokens: int = 32,
    seed: int = 0,
) -> float:
    """Mean per-token exact reverse KL on the student's own samples at temperature 1: the number
    distillation drives down, measured the same way before and after training."""
    sampler = HFSampler(student, tokenizer, batch_size=64, show_progress=False)
    groups = sampler.generate(
        prompts, samples_per_prompt, SamplingParams(1.0, 1.0, max_new_tokens, seed)
    )
    flat = [c for group in groups for c in group]
    batch = build_batch(
        tokenizer,
        [p for p in prompts for _ in range(samples_per_prompt)],
        [c.token_ids for c in flat],
        tokenizer.pad_token_id,
    )
    width = output_width(student)  # a teacher padded wider is read over the student's columns
    kl = reverse_kl(
        completion_log_probs(student, batch, width), completion_log_probs(teacher, batch, width)
    )
    return float(masked_mean(kl, batch.completion_mask))


# ---- the loop ----------------------------------------------------------------------------------


class OnPolicyDistiller:
    def __init__(
        self,
        student: PreTrainedModel,
        teacher: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: OnPolicyDistillConfig,
        log_metrics: MetricsFn,
        show_progress: bool = True,
        teacher_tokenizer: PreTrainedTokenizerBase | None = None,
    ):
        check_shared_tokenizer(student, teacher, tokenizer, teacher_tokenizer)
        self.width = output_width(student)  # the teacher's may be padded wider
        self.student = student
        self.teacher = teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.log_metrics = log_metrics
        self.show_progress = show_progress
        self.loss_fn = DISTILL_LOSSES[cfg.estimator]
        self.engine = LocalEngine(student, cfg.learning_rate, cfg.max_grad_norm)
        self.sampler = HFSampler(
            student,
            tokenizer,
            batch_size=cfg.prompts_per_step * cfg.samples_per_prompt,
            show_progress=False,
        )
        self._curve: list[float] = []
        self.guard = LossGuard("distill")  # a non-finite loss stops training, naming the step

    def train(self, prompts: Sequence[str], ckpt_dir: Path, fingerprint: str) -> DistillReport:
        """Distil on `prompts` (already rendered with the chat template), resuming from the last
        checkpoint in `ckpt_dir` that carries `fingerprint`. A NaN or infinite loss or gradient
        norm stops training with NonFiniteLossError before the update, keeping that checkpoint."""
        cfg = self.cfg
        self.prompts = prompts
        self.order = prompt_order(len(prompts), cfg.steps, cfg.prompts_per_step, cfg.seed)
        self._curve = []
        plan = LoopPlan(
            desc="distill",
            steps=cfg.steps,
            checkpoint_every=cfg.checkpoint_every,
            postfix=("kl", "reverse_kl"),
            show_progress=self.show_progress,
        )
        loop = run_loop(self, plan, ckpt_dir, fingerprint, self.log_metrics)
        return DistillReport(loop.steps, loop.resumed_from, list(self._curve), loop.seconds)

    # ---- the shared loop's stepper (training.loop) ---------------------------------------------

    def start(self, resumed_from: int) -> None:
        return None

    def run_step(self, step: int) -> dict[str, float]:
        metrics = self.step(step, [self.prompts[i] for i in self.order[step]])
        self._curve.append(metrics["reverse_kl"])
        return metrics

    def checkpoint_state(self) -> dict[str, Any]:
        return {"curve": list(self._curve)}

    def restore(self, state: dict[str, Any]) -> None:
        self._curve = list(state["curve"])

    def step(self, step: int, prompts: Sequence[str]) -> dict[str, float]:
        """Sample from the student, then one update on every sampled completion."""
        cfg = self.cfg
        t0 = time.perf_counter()
        params = SamplingParams(
            cfg.temperature, 1.0, cfg.max_new_tokens, seed=cfg.seed * 1_000_003 + step
        )
        self.student.eval()
        with torch.no_grad():
            groups = self.sampler.generate(prompts, cfg.samples_per_prompt, params)
        t_sample = time.perf_counter() - t0
        flat = [c for group in groups for c in group]
        metrics = self._update([p for p in prompts for _ in range(cfg.samples_per_prompt)], flat)
        metrics |= completion_metrics(flat)
        metrics["time/sample_seconds"] = t_sample
        metrics["time/step_seconds"] = time.perf_counter() - t0
        metrics["time/tokens_per_second"] = (
            sum(len(c.token_ids) for c in flat) / metrics["time/step_seconds"]
        )
        return metrics

    def _update(self, prompts: list[str], completions: list[Completion]) -> dict[str, float]:
        """One optimizer step over micro-batches, weighted so the loss is the token mean over the
        whole batch. The mask (from `build_batch`) covers completion tokens up to and including
        EOS, truncated completions too; padding carries no loss."""
        cfg = self.cfg
        total = sum(len(c.token_ids) for c in completions)
        kl_sum = sampled_sum = loss_sum = 0.0
        self.student.train()
        for start in range(0, len(completions), cfg.micro_batch_size):
            rows = slice(start, start + cfg.micro_batch_size)
            batch = build_batch(
                self.tokenizer,
                prompts[rows],
                [c.token_ids for c in completions[rows]],
                self.tokenizer.pad_token_id,
            )
            mask = batch.completion_mask  # (n, C)
            targets = batch.input_ids[:, batch.prompt_width :]  # (n, C)
            with torch.no_grad():
                teacher_logp = completion_log_probs(self.teacher, batch, self.width)  # (n, C, V)
            student_logp = completion_log_probs(self.student, batch, self.width)  # (n, C, V)
            weight = float(mask.sum()) / total
            loss = self.loss_fn(student_logp, teacher_logp, targets, mask, cfg.discount) * weight
            loss_sum += self.guard.check("loss", loss)
            self.engine.backward(loss)
            with torch.no_grad():
                m = mask.float()
                kl_sum += float((reverse_kl(student_logp, teacher_logp) * m).sum())
                index = targets.unsqueeze(-1)
                gap = student_logp.gather(-1, index) - teacher_logp.gather(-1, index)  # (n, C, 1)
                sampled_sum += float((gap.squeeze(-1) * m).sum())
        grad_norm = self.engine.step(self.guard)
        return {
            "reverse_kl": kl_sum / total,
            "reverse_kl/per_sequence": kl_sum / len(completions),  # length shifts show here
            "reverse_kl/sampled_estimate": sampled_sum / total,
            "loss": loss_sum,
            "grad_norm": float(grad_norm),
        }


def completion_metrics(flat: Sequence[Completion]) -> dict[str, float]:
    lengths = torch.tensor([len(c.token_ids) for c in flat], dtype=torch.float32)
    return {
        "completion/mean_tokens": float(lengths.mean()),
        "completion/max_tokens": float(lengths.max()),
        "completion/truncated_fraction": sum(c.finish_reason == "length" for c in flat) / len(flat),
    }

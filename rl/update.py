"""One GRPO policy update: the step's trained rows in micro-batches, one optimizer step.

The rows are cut into micro-batches of at most `engine.micro_batch_tokens` tokens
(training/micro.py; with `auto`, the most the memory model fits the device:
training/memory_fit.py); each micro-batch's forward and backward runs on its own and its loss is
its rows' share of the whole step's loss (the aggregation's denominator is the step's, summed over
the ranks), so the accumulated gradient, the statistics and the one optimizer step are those of
the whole step in one pass. Log-probabilities are computed within `engine.logits_chunk_mb`
(training/logits.py). With `importance_sampling_cap`, each token's surrogate is weighted by the
truncated ratio of the trainer's probability to the sampler's (rl/losses.py
`truncated_is_weights`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configs.reinforcement import GRPOConfig
from rl.losses import AGGREGATIONS, grpo_loss, truncated_is_weights
from rl.rollouts import PolicyBatch, build_batch, completion_logprobs
from training.collective import Collective
from training.engines import UpdateEngine
from training.finite import LossGuard
from training.memory_fit import micro_batch_tokens
from training.micro import micro_batches, padded_plan
from training.varlen import packed_attention


@dataclass
class UpdateRows:
    """The rows a rank trains on in one step."""

    prompts: list[str]
    completions: list[list[int]]  # token ids
    advantages: torch.Tensor  # (N,) per sample, or (N, T) per token
    sampler_logprobs: list[list[float]]  # each sampled token's, as the sampler reported it


@dataclass
class MicroBatch:
    batch: PolicyBatch
    advantages: torch.Tensor  # (n,) or (n, C)
    mask: torch.Tensor  # (n, C) float, all 0 in a zero-weight pass
    sampler_logp: torch.Tensor  # (n, C)
    live: bool  # False: a zero-weight pass, run only to take part in the ranks' collectives
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None


def padded_logprobs(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Per-token log-probabilities (n, width), 0 past each row's end."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row[:width], dtype=torch.float32)
    return out


class PolicyUpdate:
    """`update(rows)`: one optimizer step of `engine` on `rows`, every rank taking part."""

    def __init__(
        self,
        cfg: GRPOConfig,
        tokenizer: PreTrainedTokenizerBase,
        engine: UpdateEngine,
        collective: Collective,
        reference: PreTrainedModel | None,
        guard: LossGuard,
    ):
        self.cfg, self.tokenizer, self.engine = cfg, tokenizer, engine
        self.collective, self.reference, self.guard = collective, reference, guard
        self.aggregation = AGGREGATIONS[cfg.aggregation]

    def __call__(self, rows: UpdateRows, fallback: UpdateRows) -> dict[str, float]:
        """A rank with no row to train on while others do still takes part in every collective:
        it runs `fallback` (one sample) through the same passes at zero weight."""
        cfg = self.cfg
        idle = not rows.prompts
        if idle:
            rows = fallback
        groups, extra = padded_plan(self._groups(rows), self.collective)
        micros = [self._micro(rows, g, live=not idle) for g in groups]
        micros += [self._micro(rows, groups[0][:1], live=False) for _ in range(extra)]
        mine = [m for m in micros if m.live]
        local = sum(float(self.aggregation.denominator(m.mask, cfg.max_new_tokens)) for m in mine)
        denominator = self.collective.sum([local])[0]
        self.engine.module.train()
        self._frozen_passes(micros)
        stats: dict[str, float] = {}
        for _ in range(cfg.inner_iterations):
            stats = self._accumulate(micros, denominator)
            stats["grad_norm"] = self.engine.step(self.guard)
            self.engine.after_update()
        return stats

    def _groups(self, rows: UpdateRows) -> list[list[int]]:
        prompt_ids = self.tokenizer(rows.prompts, add_special_tokens=False)["input_ids"]
        lengths = [len(p) + len(c) for p, c in zip(prompt_ids, rows.completions, strict=True)]
        longest_completion = max((len(c) for c in rows.completions), default=1)
        budget = micro_batch_tokens(
            self.cfg.engine, self.engine.module, "grpo", max(lengths, default=1),
            longest_completion, len(lengths), reference=self.reference is not None,
        )  # fmt: skip
        return micro_batches(lengths, budget)

    def _micro(self, rows: UpdateRows, index: list[int], live: bool) -> MicroBatch:
        device = next(self.engine.module.parameters()).device
        batch = build_batch(
            self.tokenizer,
            [rows.prompts[i] for i in index],
            [rows.completions[i] for i in index],
            self.tokenizer.pad_token_id,
        ).to(device)
        width = batch.completion_width
        adv = rows.advantages[index].to(device)
        if adv.dim() == 2:
            adv = adv[:, :width]
        mask = batch.completion_mask.float() * (1.0 if live else 0.0)
        sampler_logp = padded_logprobs([rows.sampler_logprobs[i] for i in index], width)
        return MicroBatch(batch, adv, mask, sampler_logp.to(device), live)

    def _logprobs(
        self, model: torch.nn.Module, batch: PolicyBatch, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cfg = self.cfg
        return completion_logprobs(
            model,
            batch,
            cfg.temperature,
            with_entropy=with_entropy,
            packed=cfg.packing,
            logits_budget=cfg.engine.logits_budget,
            fused_head=cfg.engine.fused_head,
        )

    def _frozen_passes(self, micros: list[MicroBatch]) -> None:
        """pi_old's log-probabilities (needed when mu > 1; with mu = 1 pi_old is the policy
        itself: ratio 1) and the reference's, without gradients."""
        with torch.no_grad():
            for m in micros:
                if self.cfg.inner_iterations > 1:
                    m.old_logp, _ = self._logprobs(self.engine.forward_model, m.batch)
                if self.reference is not None:
                    m.ref_logp, _ = self._logprobs(self.reference, m.batch)

    def _accumulate(self, micros: list[MicroBatch], denominator: float) -> dict[str, float]:
        """Every micro-batch's forward and backward; the step's statistics per token."""
        loss_sum = tokens = 0.0
        sums: dict[str, float] = {}
        for m in micros:
            with self._attention():  # the backward pass recomputes layers with checkpointing
                loss, token_sums = self._forward_backward(m, denominator)
            for key, value in token_sums.items():
                sums[key] = sums.get(key, 0.0) + value
            loss_sum += loss
            tokens += float(m.mask.sum())
        totals = self.collective.sum([loss_sum, tokens, *sums.values()])
        per_token = {k: v / max(totals[1], 1.0) for k, v in zip(sums, totals[2:], strict=True)}
        return per_token | {"loss": self.guard.check("loss", totals[0])}  # the whole batch's

    def _attention(self) -> AbstractContextManager[None]:
        """Per-sequence attention over the forward and the backward pass of a packed row."""
        return packed_attention(self.engine.forward_model) if self.cfg.packing else nullcontext()

    def _forward_backward(
        self, m: MicroBatch, denominator: float
    ) -> tuple[float, dict[str, float]]:
        """One micro-batch's loss (its share of the step's), backward; the loss and the token
        sums of its statistics."""
        cfg = self.cfg
        logp, entropy = self._logprobs(self.engine.forward_model, m.batch, with_entropy=True)
        old = logp.detach() if m.old_logp is None else m.old_logp
        weights, extra = self._importance_weights(old, m)
        loss, stats = grpo_loss(
            logp,
            old,
            m.advantages,
            m.mask,
            ref_logp=m.ref_logp,
            beta=cfg.beta,
            eps_low=cfg.eps_low,
            eps_high=cfg.eps_high,
            kl_estimator=cfg.kl_estimator,
            aggregation=self.aggregation,
            max_len=cfg.max_new_tokens,
            denominator=denominator,
            weights=weights,
        )
        n = float(m.mask.sum())
        assert entropy is not None
        token_sums = {k: v * n for k, v in stats.items()}
        token_sums["entropy"] = float((entropy * m.mask).sum())
        self.engine.backward(loss)
        return float(loss.detach()), token_sums | extra

    def _importance_weights(
        self, old_logp: torch.Tensor, m: MicroBatch
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """TIS weights and their token sums (`tis/mean_ratio`, `tis/clipped_fraction` once
        divided by the tokens), or none when the correction is off."""
        cap = self.cfg.importance_sampling_cap
        if cap is None:
            return None, {}
        weights, ratio_sum, clipped = truncated_is_weights(old_logp, m.sampler_logp, m.mask, cap)
        return weights, {"tis/mean_ratio": float(ratio_sum), "tis/clipped_fraction": float(clipped)}

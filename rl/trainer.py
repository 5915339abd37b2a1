"""The GRPO loop: sample G completions per prompt from pi_old, score, normalise within groups,
and update the policy for mu inner iterations on the samples that carry signal.

Departures from the paper, by name in the config: clip-higher (eps_high), token-level or
constant-normaliser aggregation, centred-only advantages, dynamic sampling (groups with equal
rewards are dropped before any gradient work and counted), masking of truncated completions,
and periodic reference refresh. With beta = 0 no reference model is kept at all.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configs.reinforcement import GRPOConfig
from models.chat import render_prompt
from problems.types import Problem
from rewards.registry import RewardFn, RewardSet, verifier_metrics
from rl import reference as kl_reference
from rl.probing import (
    PROBE_VERSION,
    HeldoutProbe,
    InlineProbes,
    OffPathProbes,
    ProbeFn,
    ProbeRunner,
    Reading,
    sampler_rows,
)
from rl.scoring import (
    RankRollouts,
    ScoredGroups,
    kind_metrics,
    masked_advantages,
    score,
    step_advantages,
)
from rl.signals import step_signals
from rl.sources import DrawRequest, RolloutSource
from rl.sources.colocated import ColocatedSource
from rl.update import PolicyUpdate, UpdateRows
from sampling.factory import Sampler, context_length, policy_sampler
from sampling.interface import Completion, SamplingParams
from sampling.weight_sync import SyncsWeights
from training.collective import Collective, Solo
from training.engines import LocalEngine, UpdateEngine
from training.finite import LossGuard
from training.loop import LoopPlan, run_loop
from training.whole_copy import zero3_sampling

log = logging.getLogger(__name__)

MetricsFn = Callable[[dict[str, float], int], None]
SamplesFn = Callable[[int, list[dict[str, Any]]], None]
StepHook = Callable[[int, list[dict[str, float]]], None]  # (step, history); may raise to stop
LOGGED = ("heldout/", "time/probe", "probe/")  # a probe reading's metrics (not its items)


@dataclass
class GRPOReport:
    steps: int
    resumed_from: int
    history: list[dict[str, float]] = field(default_factory=list)  # each step's metrics, "step"
    seconds: float = 0.0

    @property
    def reward_curve(self) -> list[float]:
        """Mean total reward per step."""
        return [h["reward/mean"] for h in self.history if "reward/mean" in h]


def prompt_order(n_problems: int, steps: int, per_step: int, seed: int) -> list[list[int]]:
    """Problem indices for each step: seeded permutations, one after another."""
    generator = torch.Generator().manual_seed(seed)
    flat: list[int] = []
    while len(flat) < steps * per_step:
        flat += torch.randperm(n_problems, generator=generator).tolist()
    return [flat[i * per_step : (i + 1) * per_step] for i in range(steps)]


def kind_prompt_order(
    kinds: Sequence[str], steps: int, per_step: int, general_per_step: int, seed: int
) -> list[list[int]]:
    """Problem indices for each step, `general_per_step` of them general prompts and the rest
    reasoning problems, each kind taken in its own seeded permutations."""
    general = [i for i, kind in enumerate(kinds) if kind == "general"]
    reasoning = [i for i, kind in enumerate(kinds) if kind != "general"]
    if not general or not reasoning:
        raise ValueError(
            f"a fixed number of general prompts per step needs both kinds; got {len(general)} "
            f"general and {len(reasoning)} reasoning problems"
        )
    picks = zip(
        prompt_order(len(reasoning), steps, per_step - general_per_step, seed),
        prompt_order(len(general), steps, general_per_step, seed + 1),
        strict=True,
    )
    return [[reasoning[i] for i in r] + [general[i] for i in g] for r, g in picks]


class GRPOTrainer:
    """GRPO on one process, or on one data-parallel rank of several (`collective`, `engine`).

    Each rank samples, scores and normalises the groups of its share of a step's prompts (groups
    never straddle ranks), the ranks exchange their rollouts for the step's metrics, and each
    rank's loss is its rows' share of the whole batch's loss, so that the update the engine makes
    is the single-process one. Sampling is keyed by prompt index (SamplingParams.prompt_offset),
    so the ranks together draw what one process draws.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: GRPOConfig,
        log_metrics: MetricsFn,
        log_samples: SamplesFn | None = None,
        show_progress: bool = True,
        extra_rewards: dict[str, RewardFn] | None = None,
        engine: UpdateEngine | None = None,
        collective: Collective | None = None,
        reference: PreTrainedModel | None = None,
        sampler: Sampler | None = None,
        policy_path: str | Path | None = None,
        probe: ProbeFn | None = None,
        source: RolloutSource | None = None,
    ):
        """`extra_rewards` supplies rewards that need a model built at run time ("preference").
        Without `engine` the update runs in this process; with one (DeepSpeed), `model` is the
        engine's module and `reference` the engine's frozen copy of the starting policy when
        beta > 0 (DeepSpeedEngine.frozen_reference). Without `sampler`, `cfg.sampler` names one
        (sampling.factory.policy_sampler), opened when training starts and closed by `close()`;
        a vLLM engine starts from `policy_path` and is synced after every update. Rollouts come
        from `source` (rl/sources: sampling workers, possibly drawing ahead), else from that
        sampler, step by step; the trainer closes the source."""
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.log_metrics = log_metrics
        self.log_samples = log_samples
        self.show_progress = show_progress
        self.rewards = RewardSet.from_terms(cfg.rewards, extra_rewards)
        self.reward_fns = self.rewards.fns
        self.engine = engine or LocalEngine(
            model,
            cfg.learning_rate,
            cfg.max_grad_norm,
            gradient_checkpointing=cfg.engine.gradient_checkpointing,
        )
        self.collective = collective or Solo()
        self.model = self.engine.module
        self.reference = None
        if cfg.beta > 0:
            # in the policy's own dtype: a bf16 policy against an fp32 reference would start
            # its KL at the precision gap instead of 0
            self.reference = reference or frozen(
                copy.deepcopy(self.engine.sampling_model()).to(policy_dtype(self.model))
            )
        self._history: list[dict[str, float]] = []
        self.probe = probe
        self.probes: ProbeRunner | None = None  # where the probe runs: set by train()
        self._done = 0  # steps trained, as of the last step run
        self.guard = LossGuard("grpo")  # a non-finite loss stops training, naming the step
        self.update = PolicyUpdate(
            cfg, tokenizer, self.engine, self.collective, self.reference, self.guard
        )
        self.policy_path = policy_path
        self._owns_sampler = sampler is None  # opened (and closed) here
        self.sampler: Sampler | None = sampler
        self.source: RolloutSource = source or ColocatedSource(self._sampler, self.model)
        self._colocated = source is None
        self._carried: Any = None  # a resumed checkpoint's draws made ahead
        self.on_step: StepHook | None = None  # after each step (the guard, stages/guarded.py)

    def open_sampler(self, problems: Sequence[Problem]) -> Sampler:
        """The sampler `cfg.sampler` names, sized for `problems` (a vLLM engine holds their
        longest prompt + max_new_tokens, and the probe's), unless one was given."""
        if self.sampler is None:
            cfg = self.cfg
            longest = None
            if cfg.sampler.backend == "vllm":
                prompts = [render_prompt(self.tokenizer, p.question) for p in problems]
                longest = max(
                    context_length(self.tokenizer, prompts, cfg.max_new_tokens),
                    getattr(self.probe, "context_length", 0),
                )
            model = self.engine.sampling_model()
            self.sampler = policy_sampler(
                cfg.sampler,
                model,
                self.tokenizer,
                batch_size=sampler_rows(cfg.prompts_per_step * cfg.group_size, self.probe, model),
                policy_path=self.policy_path,
                max_model_len=longest,
                **zero3_sampling(model, self.collective, cfg.engine.zero3_sampling),
            )
        return self.sampler

    def close(self) -> None:
        """Close the sampler this trainer opened (a vLLM engine's memory; an in-process engine
        also ends torch.distributed's group, so call this after the last collective)."""
        if self._owns_sampler and self.sampler is not None:
            self.sampler.close()
            self.sampler = None
        self.source.close()

    def train(self, problems: Sequence[Problem], ckpt_dir: Path, fingerprint: str) -> GRPOReport:
        """Train on `problems`, resuming from `ckpt_dir`; a NaN or infinite loss or gradient norm
        stops training with NonFiniteLossError before the update, keeping the last checkpoint."""
        cfg = self.cfg
        self.problems = problems
        self.probes = self._probe_runner()
        if self._colocated or (self.probes is not None and self.probes.inline):
            self.open_sampler(problems)
        if cfg.general_per_step is None:
            self.order = prompt_order(len(problems), cfg.steps, cfg.prompts_per_step, cfg.seed)
        else:
            kinds = [p.kind for p in problems]
            self.order = kind_prompt_order(
                kinds, cfg.steps, cfg.prompts_per_step, cfg.general_per_step, cfg.seed
            )
        self._history = []
        plan = LoopPlan(
            desc="grpo",
            steps=cfg.steps,
            checkpoint_every=cfg.checkpoint_every,
            postfix=("reward", "reward/mean"),
            show_progress=self.show_progress,
            out_of_time=self._out_of_time,
        )
        loop = run_loop(self, plan, ckpt_dir, fingerprint, self.log_metrics)
        report = GRPOReport(steps=loop.steps, resumed_from=loop.resumed_from)
        report.history = self._history
        report.seconds = loop.seconds
        self._warn_if_untrained()
        return report

    # ---- the shared loop's stepper (training.loop) ---------------------------------------------

    def start(self, resumed_from: int) -> None:
        """Bring the sampler to the engine's weights (a resume may have changed them), and probe
        the held-out pass@1 before the first step; the rollout source starts drawing."""
        self.source.begin(resumed_from, self._plan, self.engine.sampling_model(), self._carried)
        self._done = resumed_from
        if synced := self._sync_sampler():
            self.log_metrics(synced, resumed_from)
        if self.probes is not None:
            self._add_probes(self.probes.start(resumed_from).entries)

    def run_step(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        metrics = self.step(step, [self.problems[i] for i in self.order[step]])
        self._done = step + 1
        reading = self.probes.after(step + 1) if self.probes is not None else Reading()
        self._add_probes(reading.entries)
        metrics |= reading.metrics
        self._history.append({"step": float(step + 1), **metrics, **reading.items})
        if self.on_step is not None:
            self.on_step(step + 1, self._history)
        if cfg.ref_refresh_every and (step + 1) % cfg.ref_refresh_every == 0 and self.reference:
            kl_reference.refresh(self.reference, self.engine.module)
        return metrics

    def checkpoint_state(self) -> dict[str, Any]:
        """The reference only when it changes (`ref_refresh_every`): else it is the starting
        policy, which a resumed run loads again."""
        weights = None
        if self.reference is not None and self.cfg.ref_refresh_every:
            weights = kl_reference.state(self.reference)
        if self.probes is not None:
            self.probes.flush(self._done)  # probes the checkpoint keeps, drawn whole
        state = {"reference": weights, "history": list(self._history)}
        return state | {"rollouts": self.source.carried()}

    def restore(self, state: dict[str, Any]) -> None:
        if self.reference is not None and state.get("reference") is not None:
            kl_reference.load_state(self.reference, state["reference"])
        self._history = list(state["history"])
        self._carried = state.get("rollouts")

    def _warn_if_untrained(self) -> None:
        """Say so when no step of this run trained a single sample: the model leaves unchanged."""
        steps = [h for h in self._history if "samples/trained" in h]
        if steps and not any(h["samples/trained"] for h in steps):
            masked = " or truncated (mask_truncated)" if self.cfg.mask_truncated else ""
            log.warning(
                "grpo: none of %d steps trained a sample (every group with zero reward spread%s):"
                " the model is unchanged",
                len(steps),
                masked,
            )

    def _probe_runner(self) -> ProbeRunner | None:
        """Where the probe runs (rl/probing.py): on the sampling workers where rollouts come
        from them, `probe.on_workers` asks for it and the probe says what it draws, read
        `probe.every` steps later; else on the trainer's own sampler after the step."""
        probe, cfg = self.probe, self.cfg.probe
        if probe is None or cfg.every == 0:
            return None
        if (
            cfg.on_workers
            and isinstance(probe, HeldoutProbe)
            and hasattr(self.source, "submit_probe")
        ):
            return OffPathProbes(probe, self.source, cfg.every, self.cfg.steps, lag=cfg.every)  # type: ignore[arg-type]
        return InlineProbes(self._measure, cfg.every, self.cfg.steps)

    def _measure(self) -> dict[str, float]:
        """The probe on the policy as it is, with the trainer's own sampler."""
        assert self.probe is not None
        self.model.eval()
        with torch.no_grad():
            return self.probe(self._sampler())

    def _add_probes(self, entries: list[dict[str, float]]) -> None:
        """Probe readings as history entries of their own, each logged at the policy version
        it measured (its per-problem values, `items/...`, kept in the history only)."""
        for entry in entries:
            self._history.append(entry)
            version = int(entry.get(PROBE_VERSION, entry["step"]))
            self.log_metrics({k: v for k, v in entry.items() if k.startswith(LOGGED)}, version)

    def _out_of_time(self, seconds: float) -> bool:
        """Whether the time budget is spent after `seconds`; the ranks stop together, when any
        one is out."""
        budget = self.cfg.max_seconds
        if budget is None:
            return False
        spent = float(seconds >= budget)
        return self.collective.sum([spent])[0] > 0

    def _plan(self, step: int) -> DrawRequest:
        """What step `step` samples (this rank's share): a rollout source drawing ahead asks."""
        local, offset = self.collective.share([self.problems[i] for i in self.order[step]])
        return self._request(step, local, offset)

    def _request(self, step: int, local: Sequence[Problem], offset: int) -> DrawRequest:
        cfg = self.cfg
        params = SamplingParams(
            cfg.temperature,
            cfg.top_p,
            cfg.max_new_tokens,
            seed=cfg.seed * 1_000_003 + step,
            prompt_offset=offset,
        )
        prompts = [render_prompt(self.tokenizer, p.question) for p in local]
        return DrawRequest(prompts, cfg.group_size, params)

    def step(self, step: int, batch: Sequence[Problem]) -> dict[str, float]:
        """One GRPO step on the whole step's `batch`, of which this rank takes its share."""
        cfg = self.cfg
        t0 = time.perf_counter()
        local, offset = self.collective.share(batch)
        request = self._request(step, local, offset)
        draw = self.source.take(step, request)
        prompts, groups, t_sample = request.prompts, draw.groups, draw.wait_seconds
        scored = score(local, prompts, groups, self.rewards)
        mine = RankRollouts(list(local), groups, scored, torch.zeros(0, dtype=torch.bool))
        if cfg.supervision == "process":
            advantages, mine.zero, mine.steps_seen, mine.steps_right = step_advantages(
                self.tokenizer, local, groups, scored.rewards, cfg.step_reward, cfg.scale_std
            )
            mine.process = True
        else:
            advantages, mine.zero = masked_advantages(scored.rewards, cfg.scale_std)
        rows = self._trained_rows(mine)
        whole = RankRollouts.merge(self.collective.gather(mine))
        metrics = self._rollout_metrics(whole, t_sample) | draw.metrics()
        metrics |= whole.step_metrics() | kind_metrics(whole.batch, whole.scored.rewards)
        metrics |= verifier_metrics(self.reward_fns)  # this rank's
        metrics |= step_signals(whole, self.rewards)
        trained = int(self.collective.sum([len(rows)])[0])
        metrics["samples/trained"] = float(trained)
        if trained:
            flat = mine.flat
            self._sleep_sampler()
            metrics |= self.update(
                UpdateRows(
                    [prompts[i // cfg.group_size] for i in rows],
                    [flat[i].token_ids for i in rows],
                    advantages.flatten(0, 1)[rows],
                    [flat[i].logprobs for i in rows],
                ),
                fallback=UpdateRows(
                    [prompts[0]], [flat[0].token_ids], torch.zeros(1), [flat[0].logprobs]
                ),
            )
            metrics |= self._sync_sampler()
        self.source.publish(self.engine.sampling_model(), step + 1, changed=bool(trained))
        if self.log_samples and ((step + 1) % cfg.samples_every == 0 or step == 0):
            rows = self._sample_rows(whole.batch, whole.flat, whole.scored)
            self.log_samples(step + 1, [r | {"policy_version": draw.version} for r in rows])
        metrics["time/step_seconds"] = time.perf_counter() - t0
        metrics["time/tokens_per_second"] = (
            sum(len(c.token_ids) for c in whole.flat) / metrics["time/step_seconds"]
        )
        return metrics

    def _sampler(self) -> Sampler:
        if self.sampler is None:
            raise RuntimeError("the trainer's sampler is not open: train() opens it")
        return self.sampler

    def _sync_sampler(self) -> dict[str, float]:
        """Bring a sampler that holds its own copy of the weights (vLLM) up to date with the
        policy; a sampler over the policy itself (hf), or none, needs nothing."""
        sampler = self.sampler
        if not isinstance(sampler, SyncsWeights):
            return {}
        return sampler.sync_weights(self.engine.sampling_model()).metrics()

    def _sleep_sampler(self) -> None:
        """A colocated engine in sleep mode gives its device memory back for the update; the
        sync after it wakes the weights, the next generate the KV cache."""
        sleep = getattr(self.sampler, "sleep", None)
        if sleep is not None:
            sleep()

    def _trained_rows(self, mine: RankRollouts) -> list[int]:
        """Indices (into the flattened B x G samples) of the samples that carry signal: scorable,
        in a group with reward spread (dynamic sampling), not truncated (when masked)."""
        cfg = self.cfg
        keep = ~torch.isnan(mine.scored.rewards)  # (B, G)
        if cfg.dynamic_sampling:
            keep &= ~mine.zero[:, None]
        if cfg.mask_truncated:
            truncated = torch.tensor([c.finish_reason == "length" for c in mine.flat])
            keep &= ~truncated.view_as(keep)
        return keep.flatten().nonzero().flatten().tolist()

    def _rollout_metrics(self, whole: RankRollouts, t_sample: float) -> dict[str, float]:
        scored, zero, flat = whole.scored, whole.zero, whole.flat
        valid = scored.rewards[~torch.isnan(scored.rewards)]
        lengths = torch.tensor([len(c.token_ids) for c in flat], dtype=torch.float32)
        metrics = {
            "reward/mean": float(valid.mean()) if valid.numel() else 0.0,
            "reward/std": float(valid.std(unbiased=False)) if valid.numel() else 0.0,
            "reward/unscorable_fraction": 1.0 - valid.numel() / scored.rewards.numel(),
            "groups/zero_spread_fraction": float(zero.float().mean()),
            "completion/mean_tokens": float(lengths.mean()),
            "completion/max_tokens": float(lengths.max()),
            "completion/truncated_fraction": sum(c.finish_reason == "length" for c in flat)
            / len(flat),
            "time/sample_seconds": t_sample,
        }
        g = self.cfg.group_size
        for name, scores in scored.per_reward.items():
            applies = [
                i
                for i in range(len(scores))
                if self.rewards.applies(name, whole.batch[i // g].kind, whole.batch[i // g].family)
            ]
            metrics[f"reward/{name}/unscorable"] = float(sum(scores[i] is None for i in applies))
            known = torch.tensor([s for s in scores if s is not None], dtype=torch.float32)
            if known.numel():
                metrics[f"reward/{name}/mean"] = float(known.mean())
                metrics[f"reward/{name}/std"] = float(known.std(unbiased=False))
        return metrics

    def _sample_rows(
        self, batch: Sequence[Problem], flat: list[Completion], scored: ScoredGroups
    ) -> list[dict]:
        g = self.cfg.group_size
        return [
            {
                "problem_id": batch[i // g].id,
                "gold": batch[i // g].answer,
                "completion": c.text,
                "finish_reason": c.finish_reason,
                "reward": None
                if math.isnan(float(scored.rewards.flatten()[i]))
                else float(scored.rewards.flatten()[i]),
                **{f"reward/{name}": scores[i] for name, scores in scored.per_reward.items()},
            }
            for i, c in enumerate(flat)
        ]


def policy_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the policy's weights are in (bf16 under DeepSpeed's bf16)."""
    return next(model.parameters()).dtype


def frozen(model: PreTrainedModel) -> PreTrainedModel:
    """`model` in eval mode with no gradients: the KL reference."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model

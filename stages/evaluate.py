"""Evaluation on the held-out problems: n samples each, graded, summarised, samples kept."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerBase

from cluster.placement import close_sampler, stage_sampler
from configs.cluster import ClusterConfig
from configs.reinforcement import EvalConfig
from contracts.answer_format import is_well_formed
from evaluation.metrics import EvalReport, ProblemSamples, summarize
from models.chat import render_prompt
from models.loading import load_tokenizer
from models.saved import ModelRef
from problems.loader import load_problems
from problems.types import Problem, ProblemSet
from rewards.accuracy import verifiable_problems
from rewards.language import is_language_consistent
from rewards.registry import RewardFn
from rewards.verifiers import grade_readings
from sampling.factory import Sampler, sized
from sampling.interface import Completion, SamplingParams
from stages.tracker import Tracker


def general_score(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Problem],
    scorer: RewardFn,
    params: SamplingParams,
    n_samples: int = 1,
) -> dict[str, float]:
    """Mean reward-model score of `n_samples` samples per held-out general prompt (stage 6's
    target), with its standard error over prompts: a stage-to-stage change smaller than about
    twice that is noise.

    The reward model gets the raw questions and renders them with its own chat template: a
    student's template (Llama 3's) need not be the reward model's (the policy's, Qwen's)."""
    rendered = [render_prompt(tokenizer, p.question) for p in prompts]
    groups = sampler.generate(rendered, n_samples, params)
    questions = [p.question for p, group in zip(prompts, groups, strict=True) for _ in group]
    texts = [c.text for group in groups for c in group]
    scores = iter(scorer(questions, texts))
    per_prompt = []
    for group in groups:
        scored = [s for s in islice(scores, len(group)) if s is not None]
        if scored:
            per_prompt.append(statistics.fmean(scored))
    sem = statistics.stdev(per_prompt) / math.sqrt(len(per_prompt)) if len(per_prompt) > 1 else 0.0
    return {
        "general_score": statistics.fmean(per_prompt) if per_prompt else 0.0,
        "general_score_sem": sem,
        "general_format_rate": sum(is_well_formed(t) for t in texts) / len(texts),
    }


def run(
    config: EvalConfig,
    model: ModelRef,
    problems: ProblemSet,
    out_dir: Path,
    tracker: Tracker,
    general: Sequence[Problem] = (),
    scorer: RewardFn | None = None,
    cluster: ClusterConfig | None = None,
) -> EvalReport:
    """Held-out reasoning metrics, and the general score when a reward model (`scorer`) and
    general prompts are given. On a Ray cluster (`cluster`) actors sample chunks of the prompts,
    each prompt from its own stream: the same samples, so the same figures."""
    path = problems.heldout_path
    heldout = verifiable_problems(load_problems(path), f"evaluation on {path}")
    heldout = heldout[: config.max_problems]
    if not heldout:
        raise ValueError(f"{problems.heldout_path}: no held-out problem has a verifiable answer")
    tokenizer = load_tokenizer(model.path)
    prompts = [render_prompt(tokenizer, p.question) for p in heldout]
    scored = list(general[: config.general_prompts]) if scorer is not None else []
    sampler_config = sized(
        config.sampler, tokenizer,
        prompts + [render_prompt(tokenizer, p.question) for p in scored], config.max_new_tokens,
    )  # fmt: skip
    sampler = stage_sampler(sampler_config, model.path, tokenizer, config.batch_size, cluster)
    params = SamplingParams(config.temperature, config.top_p, config.max_new_tokens, config.seed)
    general_figures: dict[str, float] = {}
    try:  # the sampler (a vLLM engine's memory, the actors) is let go of before grading
        completions = sampler.generate(prompts, config.n_samples, params)
        if scored and scorer is not None:
            general_figures = general_score(
                sampler, tokenizer, scored, scorer, params, config.n_samples
            )
    finally:
        close_sampler(sampler)
    metrics, rows = grade(config, heldout, completions)
    metrics |= general_figures
    tracker.log_metrics({f"eval/{name}": value for name, value in metrics.items()})
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_path = out_dir / "eval_samples.parquet"
    pq.write_table(pa.Table.from_pylist(rows), samples_path)
    return EvalReport(metrics=metrics, samples_path=samples_path, n_problems=len(heldout))


def grade(
    config: EvalConfig, heldout: Sequence[Problem], completions: Sequence[Sequence[Completion]]
) -> tuple[dict[str, float], list[dict]]:
    """The held-out metrics (overall and per family) and one row per sample."""
    flat_problems = [p for p, samples in zip(heldout, completions, strict=True) for _ in samples]
    texts = [c.text for samples in completions for c in samples]
    strict_grades, lenient_grades = map(iter, grade_readings(flat_problems, texts))
    graded, rows = [], []
    for problem, samples in zip(heldout, completions, strict=True):
        grades = [next(strict_grades) for _ in samples]
        lenient = [next(lenient_grades).correct is True for _ in samples]
        formed = [is_well_formed(c.text) for c in samples]
        consistent = [is_language_consistent(c.text, problem.language) for c in samples]
        graded.append(
            ProblemSamples(
                [g.answer for g in grades],
                [g.correct is True for g in grades],
                formed,
                consistent,
                lenient,
            )
        )
        for i, (c, g, f, lc) in enumerate(zip(samples, grades, formed, consistent, strict=True)):
            rows.append(
                {
                    "problem_id": problem.id,
                    "family": problem.family,
                    "sample": i,
                    "question": problem.question,
                    "gold": problem.answer,
                    "completion": c.text,
                    "extracted": g.answer,
                    "correct": g.correct is True,
                    "correct_lenient": lenient[i],
                    "well_formed": f,
                    "language_consistent": lc,
                    "finish_reason": c.finish_reason,
                    "completion_tokens": len(c.token_ids),
                }
            )
    metrics = summarize(graded, config.k)
    families = sorted({p.family for p in heldout})
    if len(families) > 1:
        for family in families:
            mine = [s for p, s in zip(heldout, graded, strict=True) if p.family == family]
            metrics |= {f"{family}/{k}": v for k, v in summarize(mine, config.k).items()}
    metrics["mean_completion_tokens"] = sum(r["completion_tokens"] for r in rows) / len(rows)
    return metrics, rows

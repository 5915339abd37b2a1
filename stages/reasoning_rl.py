"""Stage 3 (reasoning RL) and the R1-Zero run: GRPO with rule-based rewards on the training
problems, from the cold-start model (stage 3) or straight from the base (R1-Zero)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from pathlib import Path
from statistics import fmean as mean

from cluster.placement import rollout_source, training_nodes
from configs.cluster import ClusterConfig
from configs.reinforcement import GRPOConfig
from contracts.reward_names import PREFERENCE
from evaluation.curves import plot_grpo_curves
from guard.paired import items_key, paid_key
from guard.watch import paired_readings
from models.chat import render_prompt
from models.loading import load_model, load_tokenizer
from models.saved import ModelRef, save_model
from problems.loader import load_problems, write_problems
from problems.types import Problem, ProblemSet
from rewards.registry import RewardFn, RewardSet
from rewards.verifiers import grade_all
from rl.probing import PROBE_VERSION, HeldoutProbe
from rl.scoring import score
from rl.sources import DrawRequest
from rl.trainer import GRPOTrainer
from sampling.factory import context_length
from sampling.interface import Completion, SamplingParams
from stages.evaluate import verifiable
from stages.fingerprint import fingerprint
from stages.guarded import GUARD_RECORD, MetricsWatch, train_guarded
from stages.tracker import Tracker
from training.distributed import WorkerSpec, require_deepspeed, run_workers

GRPO_WORKER = "rl.grpo_worker"


def heldout_probe(config: GRPOConfig, heldout_path: Path, tokenizer) -> HeldoutProbe:
    """The R1-Zero figures over training (the paper's Figures 2 and 3, small): held-out pass@1,
    strict and lenient, per family, and the mean length of the held-out responses; and, for the
    guard's paired readings (guard/paired.py, guard/watch.py `paired_readings`), each problem's
    share of samples found right in the readings the guard reads, and the share that each
    training verifier that is not the grader's own pays for. What it draws is a request, so
    that sampling workers can draw it off the trainer's path (rl/probing.py)."""
    probe = config.probe
    problems = [p for p in load_problems(heldout_path) if verifiable(p)][: probe.problems]
    prompts = [render_prompt(tokenizer, p.question) for p in problems]
    max_new = probe.max_new_tokens or config.max_new_tokens
    params = SamplingParams(probe.temperature, probe.top_p, max_new, config.seed)
    readings, unvetted = paired_readings(config.guard, config.rewards)
    paying_terms = [t for t in config.rewards if t.name in unvetted]
    paying = RewardSet.from_terms(paying_terms) if paying_terms else None

    def grade(groups: list[list[Completion]]) -> dict[str, float]:
        flat = [p for p, group in zip(problems, groups, strict=True) for _ in group]
        texts = [c.text for group in groups for c in group]
        figures = {"mean_tokens": mean(len(c.token_ids) for g in groups for c in g)}
        for reading, strict in (("pass_at_1", True), ("pass_at_1_lenient", False)):
            right = [g.correct is True for g in grade_all(flat, texts, strict=strict)]
            figures[reading] = mean(right)
            for family in sorted({p.family for p in problems}):
                mine = [r for r, p in zip(right, flat, strict=True) if p.family == family]
                figures[f"{family}/{reading}"] = mean(mine)
            figures |= found_items(reading, right, flat, probe.samples, readings)
        if paying is not None:
            scored = score(problems, prompts, groups, paying).per_reward
            for term, values in scored.items():
                paid = [None if v is None else v >= 1.0 for v in values]
                figures |= per_problem(paid_key(term), paid, probe.samples)
        return figures

    request = DrawRequest(prompts, probe.samples, params)
    return HeldoutProbe(request, grade, context_length(tokenizer, prompts, max_new))


def found_items(
    reading: str,
    right: Sequence[bool],
    flat: Sequence[Problem],
    samples: int,
    wanted: Collection[str],
) -> dict[str, float]:
    """Each problem's share of samples the grader found right under `reading`, for each
    held-out reading in `wanted` that is this one: over every problem (`heldout/<reading>` ->
    `items/<reading>/<i>`) or over a family's (`heldout/<family>/<reading>` ->
    `items/<family>/<reading>/<i>`), each problem under its index among all."""
    items = {}
    if f"heldout/{reading}" in wanted:
        items |= per_problem(items_key(f"heldout/{reading}"), right, samples)
    for family in sorted({p.family for p in flat}):
        key = f"heldout/{family}/{reading}"
        if key in wanted:
            mine = [r if p.family == family else None for r, p in zip(right, flat, strict=True)]
            items |= per_problem(items_key(key), mine, samples)
    return items


def per_problem(prefix: str, verdicts: Sequence[bool | None], samples: int) -> dict[str, float]:
    """`prefix<i>`: the share of problem i's `samples` verdicts that are true (verdicts in problem
    order, `samples` each); a problem whose verdicts are all None (not read) is left out."""
    shares = {}
    for i in range(len(verdicts) // samples):
        mine = verdicts[i * samples : (i + 1) * samples]
        if all(v is None for v in mine):
            continue
        shares[f"{prefix}{i}"] = sum(v is True for v in mine) / samples
    return shares


def run(
    config: GRPOConfig,
    policy: ModelRef,
    problems: ProblemSet,
    out_dir: Path,
    tracker: Tracker,
    desc: str = "reasoning_rl",
    general: Sequence[Problem] = (),
    extra_rewards: dict[str, RewardFn] | None = None,
    cluster: ClusterConfig | None = None,
) -> ModelRef:
    """GRPO on the training problems, plus `config.general_prompts` of `general` (stage 6),
    drawn in proportion to their numbers; `extra_rewards` supplies the reward model's score.
    Under DeepSpeed the ranks span `cluster.nodes` machines when a cluster says so; rollouts
    come from sampling workers where `cluster.rollouts` (or `config.max_staleness`) says."""
    train = load_problems(problems.train_path) + list(general[: config.general_prompts])
    ckpt_fingerprint = fingerprint(config, policy.path, problems.train_path)
    if config.engine.kind == "deepspeed":
        return run_deepspeed(
            config, policy, train, out_dir, tracker, desc, extra_rewards, ckpt_fingerprint, cluster
        )
    tokenizer = load_tokenizer(policy.path)
    samples_dir = out_dir / "samples"
    samples_dir.mkdir(parents=True, exist_ok=True)

    def log_samples(step: int, rows: list[dict]) -> None:
        path = samples_dir / f"step_{step:05d}.json"
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
        tracker.log_artifact(path, "samples")

    probe = heldout_probe(config, problems.heldout_path, tokenizer) if config.probe.every else None

    def build(adjusted: GRPOConfig) -> GRPOTrainer:
        """A trainer on the starting policy with its own rollout source (a rollback builds
        another: its reference is the starting policy again, and the checkpoint brings the
        weights); closing the trainer closes the source."""
        source = rollout_source(adjusted, policy.path, out_dir, cluster)
        try:
            return GRPOTrainer(
                load_model(policy.path),
                tokenizer,
                adjusted,
                tracker.log_metrics,
                log_samples,
                extra_rewards=extra_rewards,
                policy_path=policy.path,
                probe=probe,
                source=source,
            )
        except BaseException:
            if source is not None:
                source.close()  # the sampling workers it started
            raise

    ckpt_dir = out_dir / "checkpoints"
    try:
        report, _, model = train_guarded(
            build, config, train, ckpt_dir, ckpt_fingerprint, tracker, desc
        )
    finally:
        log_guard_record(ckpt_dir, tracker)
    for plot in plot_grpo_curves(report.history, out_dir, desc):
        tracker.log_artifact(plot)
    write_probe_summary(report.history, out_dir / PROBE_SUMMARY)
    return save_model(model, tokenizer, out_dir)


def log_guard_record(ckpt_dir: Path, tracker: Tracker) -> None:
    """The guard's record (`guard.json`: rules, trips, rollbacks, outcome) among the run's
    artifacts under `guard/`, when the stage wrote one."""
    path = ckpt_dir / GUARD_RECORD
    if path.exists():
        tracker.log_artifact(path, "guard")


PROBE_SUMMARY = "probe_summary.json"
_PROBED = ("heldout/pass_at_1_lenient", "heldout/mean_tokens")


def write_probe_summary(history: Sequence[dict[str, float]], path: Path) -> Path | None:
    """The first and last probe's held-out pass@1 (lenient) and response length, for the
    stage's line in the report; nothing when the run did not probe."""
    probed = [h for h in history if all(key in h for key in _PROBED)]
    if not probed:
        return None
    first, last = probed[0], probed[-1]
    summary = {key.split("/")[1]: [first[key], last[key]] for key in _PROBED}
    steps = [h.get(PROBE_VERSION, h["step"]) for h in (first, last)]  # the versions measured
    path.write_text(json.dumps(summary | {"steps": steps}))
    return path


def run_deepspeed(
    config: GRPOConfig,
    policy: ModelRef,
    train: list[Problem],
    out_dir: Path,
    tracker: Tracker,
    desc: str,
    extra_rewards: dict[str, RewardFn] | None,
    ckpt_fingerprint: str,
    cluster: ClusterConfig | None = None,
) -> ModelRef:
    """The same GRPO in `config.engine.processes` DeepSpeed worker processes (rl.grpo_worker),
    each sampling and training on its share of every step's prompts; the model lands where `run`
    saves it, and a stopped run resumes from its last committed checkpoint."""
    require_deepspeed()
    out_dir = out_dir.resolve()  # the workers may start in another folder
    run_dir = out_dir / "deepspeed"
    spec = WorkerSpec(
        desc=desc,
        base=str(policy.path.resolve()),
        dataset=str(write_problems(run_dir / "problems.jsonl", train).resolve()),
        config=config.model_dump(mode="json"),
        out_dir=str(out_dir),
        run_dir=str(run_dir),
        fingerprint=ckpt_fingerprint,
        module=GRPO_WORKER,
        extras=worker_rewards(extra_rewards),
    )
    watch = MetricsWatch(config, tracker, desc, run_dir)
    try:
        result = run_workers(spec, config.engine, watch, training_nodes(cluster))
    finally:
        log_guard_record(run_dir, tracker)
    for table in sorted((out_dir / "samples").glob("step_*.json")):
        tracker.log_artifact(table, "samples")
    for plot in plot_grpo_curves(result["history"], out_dir, desc):
        tracker.log_artifact(plot)
    return ModelRef(path=out_dir / "model", parameters=int(result["parameters"]))


def worker_rewards(extra_rewards: dict[str, RewardFn] | None) -> dict[str, str]:
    """What the workers need to rebuild the run-time rewards: the reward model's folder."""
    extras = {}
    for name, fn in (extra_rewards or {}).items():
        folder = getattr(fn, "model_dir", None)
        if name != PREFERENCE or folder is None:
            raise ValueError(
                f"reward {name!r} cannot be rebuilt in DeepSpeed workers; only the preference "
                "reward model (by its folder) can"
            )
        extras["reward_model"] = str(Path(folder).resolve())
    return extras

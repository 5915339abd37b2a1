"""Stage 3 (reasoning RL) and the R1-Zero run: GRPO with rule-based rewards on the training
problems, from the cold-start model (stage 3) or straight from the base (R1-Zero)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from cluster.placement import rollout_source, training_nodes
from configs.cluster import ClusterConfig
from configs.reinforcement import GRPOConfig
from contracts.reward_names import PREFERENCE
from evaluation.curves import plot_grpo_curves
from models.loading import load_model, load_tokenizer, model_device
from models.saved import ModelRef, save_model
from problems.loader import load_problems, write_problems
from problems.types import Problem, ProblemSet
from rewards.registry import RewardFn
from rl.grpo_worker import HELDOUT, probes_here
from rl.heldout import heldout_probe
from rl.probing import PROBE_VERSION
from rl.trainer import GRPOTrainer
from stages.fingerprint import fingerprint
from stages.guarded import GUARD_RECORD, MetricsWatch, train_guarded
from stages.tracker import Tracker
from training.distributed import WorkerSpec, require_deepspeed, run_workers

GRPO_WORKER = "rl.grpo_worker"


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
            config, policy, train, out_dir, tracker, desc, extra_rewards, ckpt_fingerprint, cluster,
            problems.heldout_path,
        )  # fmt: skip
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
                load_model(policy.path).to(model_device()),
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
    heldout: Path | None = None,
) -> ModelRef:
    """The same GRPO in `config.engine.processes` DeepSpeed worker processes (rl.grpo_worker),
    each sampling and training on its share of every step's prompts; the model lands where `run`
    saves it, and a stopped run resumes from its last committed checkpoint. One worker (one GPU)
    runs the held-out probe on `heldout` as a single process does, and the stage's guard reads
    it; several do not probe (rl/grpo_worker.py `probes_here`)."""
    require_deepspeed()
    out_dir = out_dir.resolve()  # the workers may start in another folder
    run_dir = out_dir / "deepspeed"
    extras = worker_rewards(extra_rewards)
    probed = heldout is not None and probes_here(config, config.engine.processes)
    if probed:
        assert heldout is not None
        extras[HELDOUT] = str(heldout.resolve())
    spec = WorkerSpec(
        desc=desc,
        base=str(policy.path.resolve()),
        dataset=str(write_problems(run_dir / "problems.jsonl", train).resolve()),
        config=config.model_dump(mode="json"),
        out_dir=str(out_dir),
        run_dir=str(run_dir),
        fingerprint=ckpt_fingerprint,
        module=GRPO_WORKER,
        extras=extras,
    )
    watch = MetricsWatch(config, tracker, desc, run_dir, probed=probed)
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

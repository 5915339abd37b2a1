"""Stage 3 (reasoning RL) and the R1-Zero run: GRPO with rule-based rewards on the training
problems, from the cold-start model (stage 3) or straight from the base (R1-Zero)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from configs.schema import GRPOConfig  # noqa: E402
from models.loading import load_model, load_tokenizer  # noqa: E402
from problems.loader import load_problems, write_problems  # noqa: E402
from problems.types import Problem  # noqa: E402
from rewards.registry import RewardFn  # noqa: E402
from rl.trainer import GRPOTrainer  # noqa: E402
from stages.fingerprint import fingerprint  # noqa: E402
from stages.refs import ModelRef, ProblemSet, save_model  # noqa: E402
from stages.tracking import Tracker  # noqa: E402
from training.distributed import WorkerSpec, require_deepspeed, run_workers  # noqa: E402

GRPO_WORKER = "rl.deepspeed_worker"


def plot_reward_curve(curve: list[float], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(curve) + 1), curve, lw=1, alpha=0.5, label="per step")
    window = max(1, len(curve) // 10)
    smooth = [
        sum(curve[max(0, i - window + 1) : i + 1]) / len(curve[max(0, i - window + 1) : i + 1])
        for i in range(len(curve))
    ]
    ax.plot(range(1, len(curve) + 1), smooth, lw=2, label=f"mean of last {window}")
    ax.set(xlabel="GRPO step", ylabel="mean total reward", title=title)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(
    config: GRPOConfig,
    policy: ModelRef,
    problems: ProblemSet,
    out_dir: Path,
    tracker: Tracker,
    desc: str = "reasoning_rl",
    general: Sequence[Problem] = (),
    extra_rewards: dict[str, RewardFn] | None = None,
) -> ModelRef:
    """GRPO on the training problems, plus `config.general_prompts` of `general` (stage 6),
    drawn in proportion to their numbers; `extra_rewards` supplies the reward model's score."""
    train = load_problems(problems.train_path) + list(general[: config.general_prompts])
    ckpt_fingerprint = fingerprint(config, policy.path, problems.train_path)
    if config.engine.kind == "deepspeed":
        return run_deepspeed(
            config, policy, train, out_dir, tracker, desc, extra_rewards, ckpt_fingerprint
        )
    tokenizer = load_tokenizer(policy.path)
    model = load_model(policy.path)
    samples_dir = out_dir / "samples"
    samples_dir.mkdir(parents=True, exist_ok=True)

    def log_samples(step: int, rows: list[dict]) -> None:
        path = samples_dir / f"step_{step:05d}.json"
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
        tracker.log_artifact(path, "samples")

    trainer = GRPOTrainer(
        model,
        tokenizer,
        config,
        tracker.log_metrics,
        log_samples,
        extra_rewards=extra_rewards,
        policy_path=policy.path,
    )
    report = trainer.train(train, out_dir / "checkpoints", ckpt_fingerprint)
    curve = plot_reward_curve(report.reward_curve, out_dir / "reward_curve.png", desc)
    tracker.log_artifact(curve)
    return save_model(model, tokenizer, out_dir)


def run_deepspeed(
    config: GRPOConfig,
    policy: ModelRef,
    train: list[Problem],
    out_dir: Path,
    tracker: Tracker,
    desc: str,
    extra_rewards: dict[str, RewardFn] | None,
    ckpt_fingerprint: str,
) -> ModelRef:
    """The same GRPO in `config.engine.processes` DeepSpeed worker processes (rl.deepspeed_worker),
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
    result = run_workers(spec, config.engine, tracker.log_metrics)
    for table in sorted((out_dir / "samples").glob("step_*.json")):
        tracker.log_artifact(table, "samples")
    curve = plot_reward_curve(result["reward_curve"], out_dir / "reward_curve.png", desc)
    tracker.log_artifact(curve)
    return ModelRef(path=out_dir / "model", parameters=int(result["parameters"]))


def worker_rewards(extra_rewards: dict[str, RewardFn] | None) -> dict[str, str]:
    """What the workers need to rebuild the run-time rewards: the reward model's folder."""
    extras = {}
    for name, fn in (extra_rewards or {}).items():
        folder = getattr(fn, "model_dir", None)
        if name != "preference" or folder is None:
            raise ValueError(
                f"reward {name!r} cannot be rebuilt in DeepSpeed workers; only the preference "
                "reward model (by its folder) can"
            )
        extras["reward_model"] = str(Path(folder).resolve())
    return extras

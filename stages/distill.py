"""Stage 7: distillation of the final model into smaller Qwen2- and Llama-architecture students.

As in DeepSeek-R1, a student is fine-tuned on the teacher's filtered traces (plain SFT, no RL).
The comparison the paper draws ("distilling beats RL on a small model") is made with a twin: the
same student base trained by GRPO alone, with rule rewards, for the same wall time.

Beyond the paper, `method: on_policy` follows the SFT with on-policy distillation: the student
samples, the teacher scores those tokens, and the student minimises the reverse KL (this needs
a shared tokenizer, which the tiny world's students have).
"""

from __future__ import annotations

from pathlib import Path

from configs.cluster import ClusterConfig
from configs.reinforcement import GRPOConfig
from configs.schema import StudentTraining
from configs.supervised import SFTConfig
from models.chat import render_prompt
from models.loading import load_model, load_tokenizer, model_device
from models.saved import ModelRef, save_model
from problems.loader import load_problems
from problems.types import ProblemSet
from rewards.registry import RewardFn
from rl.on_policy import OnPolicyDistiller
from stages import reasoning_rl, sft
from stages.fingerprint import fingerprint
from stages.tracker import Tracker


def check_smaller(student: ModelRef, teacher: ModelRef, name: str) -> None:
    if student.parameters >= teacher.parameters:
        raise ValueError(
            f"student {name!r} has {student.parameters:,} parameters, not fewer than the "
            f"teacher's {teacher.parameters:,}: distillation is into a smaller model"
        )


def distill(
    config: StudentTraining,
    student_base: ModelRef,
    teacher: ModelRef,
    traces: Path,
    problems: ProblemSet,
    out_dir: Path,
    tracker: Tracker,
    desc: str,
    cluster: ClusterConfig | None = None,
) -> ModelRef:
    """SFT of the student base on the teacher's traces; then on-policy KL when configured."""
    model = sft.run(
        SFTConfig(train=config.sft, engine=config.engine),
        student_base,
        traces,
        out_dir / "sft",
        tracker,
        desc,
        cluster,
    )
    if config.method == "sft":
        return model
    return on_policy(config, model, teacher, problems, out_dir / "on_policy", tracker)


def on_policy(
    config: StudentTraining,
    student: ModelRef,
    teacher: ModelRef,
    problems: ProblemSet,
    out_dir: Path,
    tracker: Tracker,
) -> ModelRef:
    tokenizer = load_tokenizer(student.path)
    device = model_device()
    model, teacher_model = load_model(student.path).to(device), load_model(teacher.path).to(device)
    prompts = [render_prompt(tokenizer, p.question) for p in load_problems(problems.train_path)]
    distiller = OnPolicyDistiller(
        model,
        teacher_model,
        tokenizer,
        config.on_policy,
        tracker.log_metrics,
        teacher_tokenizer=load_tokenizer(teacher.path),  # vocabularies compared, not widths
    )
    distiller.train(
        prompts,
        out_dir / "checkpoints",
        fingerprint(config.on_policy, student.path, teacher.path, problems.train_path),
    )
    return save_model(model, tokenizer, out_dir)


def rl_twin(
    config: GRPOConfig,
    student_base: ModelRef,
    problems: ProblemSet,
    seconds: float,
    out_dir: Path,
    tracker: Tracker,
    desc: str,
    extra_rewards: dict[str, RewardFn] | None = None,
    cluster: ClusterConfig | None = None,
) -> ModelRef:
    """The student base trained by GRPO alone for `seconds` of training time."""
    budget = config.model_copy(update={"max_seconds": seconds})
    return reasoning_rl.run(
        budget,
        student_base,
        problems,
        out_dir,
        tracker,
        desc=desc,
        extra_rewards=extra_rewards,
        cluster=cluster,
    )

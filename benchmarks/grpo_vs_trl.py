"""Our GRPO trainer against TRL's GRPOTrainer, side by side in one process on this machine.

Same tiny model (one random initialisation, saved once and loaded by both), same prompts, same
reward functions (ours; their signature is TRL's), same group size, prompts per step, completion
length, sampling temperature, loss aggregation (per-sequence mean: TRL's "grpo"), learning rate,
step count, and no KL term. Prints seconds per step, completion tokens per second and the final
mean reward of each, and the ratio.

    python -m benchmarks.grpo_vs_trl --steps 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from configs.data import MathWorld, WorldConfig
from configs.reinforcement import GRPOConfig, RewardTerm
from configs.supervised import CorpusConfig, ModelConfig, TrainConfig
from models.chat import render_completions, render_prompt  # noqa: E402
from models.loading import build_model, load_model, load_tokenizer  # noqa: E402
from models.tokenizer import train_tokenizer  # noqa: E402
from problems.corpus import build_corpus  # noqa: E402
from problems.world import split_world  # noqa: E402
from rewards.registry import get_reward  # noqa: E402
from rl.trainer import GRPOTrainer  # noqa: E402
from training.examples import lm_examples  # noqa: E402
from training.supervised import train as train_lm  # noqa: E402

REWARDS = ("accuracy", "format")


def make_model(folder: Path, seed: int) -> tuple[Path, list]:
    """A small Qwen2 model pretrained for a minute on the tiny world's corpus, so that rewards
    vary within groups and both trainers do real gradient work."""
    train, _ = split_world(WorldConfig(seed=seed, math=MathWorld(n_train=600, n_heldout=10)))
    docs = build_corpus(train, CorpusConfig(), seed=seed)
    tokenizer = train_tokenizer([d.question for d in docs] + [d.response for d in docs], 512)
    spec = ModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=192
    )
    model = build_model(spec, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed)
    completions = render_completions(tokenizer, [d.response for d in docs])
    texts = [
        render_prompt(tokenizer, d.question) + c for d, c in zip(docs, completions, strict=True)
    ]
    pretrain = TrainConfig(
        epochs=2, batch_size=32, learning_rate=3e-3, warmup_steps=5, checkpoint_every=10_000
    )
    with tempfile.TemporaryDirectory() as ckpt:
        train_lm(
            model,
            lm_examples(tokenizer, texts, 256),
            pretrain,
            Path(ckpt),
            "bench",
            lambda metrics, step: None,
            tokenizer.pad_token_id,
            desc="pretrain",
        )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, train


def run_ours(
    path: Path, problems: list, args: argparse.Namespace, dynamic_sampling: bool
) -> dict[str, float]:
    cfg = GRPOConfig(
        steps=args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_new_tokens=args.max_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        aggregation="sequence_mean",
        beta=0.0,
        dynamic_sampling=dynamic_sampling,
        mask_truncated=False,
        rewards=[RewardTerm(name=n) for n in REWARDS],
        checkpoint_every=10_000,
        seed=args.seed,
    )
    rewards, tokens = [], []

    def log(metrics: dict[str, float], step: int) -> None:
        rewards.append(metrics["reward/mean"])
        tokens.append(metrics["completion/mean_tokens"] * args.prompts * args.group)

    trainer = GRPOTrainer(load_model(path), load_tokenizer(path), cfg, log, show_progress=False)
    with tempfile.TemporaryDirectory() as ckpt:
        began = time.perf_counter()
        trainer.train(problems, Path(ckpt), "bench")
        seconds = time.perf_counter() - began
    return summary(seconds, args.steps, sum(tokens), rewards)


def run_trl(path: Path, problems: list, args: argparse.Namespace) -> dict[str, float]:
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    tokenizer = load_tokenizer(path)
    rows = [
        {"prompt": render_prompt(tokenizer, p.question), "answer": p.answer, "language": p.language}
        for p in problems
    ]
    with tempfile.TemporaryDirectory() as out:
        config = TRLConfig(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.prompts * args.group,
            num_generations=args.group,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            max_completion_length=args.max_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            beta=0.0,
            loss_type="grpo",
            scale_rewards="group",
            mask_truncated_completions=False,
            num_iterations=1,
            use_cpu=True,
            bf16=False,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            seed=args.seed,
            disable_tqdm=True,
        )
        trainer = TRLTrainer(
            model=load_model(path),
            reward_funcs=[get_reward(n) for n in REWARDS],
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
        )
        began = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - began
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    tokens = sum(e["completions/mean_length"] * args.prompts * args.group for e in logs)
    return summary(seconds, args.steps, tokens, [e["reward"] for e in logs])


def summary(seconds: float, steps: int, tokens: float, rewards: list[float]) -> dict[str, float]:
    tail = rewards[-max(1, len(rewards) // 4) :]
    return {
        "seconds_per_step": seconds / steps,
        "tokens_per_second": tokens / seconds,
        "final_reward": statistics.fmean(tail),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        path, problems = make_model(Path(folder), args.seed)
        results = {
            "ours": run_ours(path, problems, args, dynamic_sampling=True),
            "ours-all-groups": run_ours(path, problems, args, dynamic_sampling=False),
            "TRL": run_trl(path, problems, args),
        }
    print(
        f"GRPO, {args.steps} steps x {args.prompts} prompts x {args.group} completions, "
        f"<= {args.max_tokens} tokens, {args.threads} threads. 'ours' drops groups with no reward "
        "spread before any gradient work; 'ours-all-groups' trains on every group, as TRL does."
    )
    print(f"{'':20}" + "".join(f"{name:>17}" for name in results))
    for key in ("seconds_per_step", "tokens_per_second", "final_reward"):
        print(f"{key:20}" + "".join(f"{r[key]:17.3f}" for r in results.values()))
    trl_step = results["TRL"]["seconds_per_step"]
    for name in ("ours", "ours-all-groups"):
        ratio = trl_step / results[name]["seconds_per_step"]
        print(f"speed-up, TRL step time / {name} step time: {ratio:.2f}x")


if __name__ == "__main__":
    main()

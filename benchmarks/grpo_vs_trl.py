"""Our GRPO trainer against TRL's GRPOTrainer, side by side in one process on this machine.

Same tiny model (one random initialisation, saved once and loaded by both), same prompts, same
reward functions (ours; their signature is TRL's), same group size, prompts per step, completion
length, sampling temperature, loss aggregation (per-sequence mean: TRL's "grpo"), learning rate,
step count, and no KL term. Like for like, ours trains every group (`dynamic_sampling` off), as
TRL does.

The peer runs at its best on this machine: `PEER_BEST` holds the settings a user of TRL would
change from its defaults here (`--variants` measures each against TRL as shipped). The two sides
run alternately, `--repeats` times, each on a fresh trainer; the script prints each side's median
seconds per step with its spread, and the median and spread of the per-repeat ratio.

    python -m benchmarks.grpo_vs_trl --steps 20 --max-tokens 96 --repeats 3
    python -m benchmarks.grpo_vs_trl --steps 10 --variants    # each peer setting on its own
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from benchmarks.figures import spread  # noqa: E402
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

# The answer read wherever the completion states it (not only from an answer block, which this
# briefly pretrained model rarely writes), so rewards vary within groups and both sides do real
# gradient work.
REWARDS: dict[str, dict[str, Any]] = {"accuracy": {"strict": False}, "format": {}}


def reward_fns() -> list:
    """Our rewards as TRL takes them: functions with a `__name__`."""
    fns = []
    for name, params in REWARDS.items():
        fn = functools.partial(get_reward(name, **params))  # named here, not the shared function
        fn.__name__ = f"{name}_reward"
        fns.append(fn)
    return fns


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
        rewards=[RewardTerm(name=n, params=p) for n, p in REWARDS.items()],
        checkpoint_every=10_000,
        seed=args.seed,
    )
    rewards, lengths = [], []

    def log(metrics: dict[str, float], step: int) -> None:
        rewards.append(metrics["reward/mean"])
        lengths.append(metrics["completion/mean_tokens"])

    trainer = GRPOTrainer(load_model(path), load_tokenizer(path), cfg, log, show_progress=False)
    with tempfile.TemporaryDirectory() as ckpt:
        began = time.perf_counter()
        trainer.train(problems, Path(ckpt), "bench")
        seconds = time.perf_counter() - began
    return summary(seconds, args, lengths, rewards)


# TRL's defaults that cost it time here, and what they are set to. Measured with --variants
# (docs/benchmarks.md): gradient checkpointing (on by default in GRPOConfig) recomputes every
# activation in the backward pass, which a model this small never needs. A static KV cache and
# torch.compile, tried on top of it, did not pay here.
PEER_BEST: dict[str, Any] = {"gradient_checkpointing": False}
# The settings tried with --variants.
PEER_TRIED: dict[str, dict[str, Any]] = {
    "as shipped": {},
    "no gradient checkpointing": PEER_BEST,
    "+ static KV cache": PEER_BEST | {"cache_implementation": "static"},
    "+ torch.compile": PEER_BEST | {"torch_compile": True},
}


def run_trl(
    path: Path, problems: list, args: argparse.Namespace, settings: dict[str, Any] | None = None
) -> dict[str, float]:
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
            **(PEER_BEST if settings is None else settings),
        )
        trainer = TRLTrainer(
            model=load_model(path),
            reward_funcs=reward_fns(),
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
        )
        began = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - began
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    lengths = [e["completions/mean_length"] for e in logs]
    return summary(seconds, args, lengths, [e["reward"] for e in logs])


def summary(
    seconds: float, args: argparse.Namespace, lengths: list[float], rewards: list[float]
) -> dict[str, float]:
    """A run's figures from its seconds and each step's mean completion length and reward."""
    tail = rewards[-max(1, len(rewards) // 4) :]
    return {
        "seconds_per_step": seconds / args.steps,
        "tokens_per_second": sum(lengths) * args.prompts * args.group / seconds,
        "first_length": lengths[0],
        "last_length": lengths[-1],
        "final_reward": statistics.fmean(tail),
    }


Side = tuple[str, Callable[[], dict[str, float]]]


def alternate(sides: list[Side], repeats: int) -> dict[str, list[dict[str, float]]]:
    """Each side `repeats` times, the order turned by one each repeat so that no side always
    runs first (or after the same neighbour)."""
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in sides}
    for repeat in range(repeats):
        turn = repeat % len(sides)
        for name, run in sides[turn:] + sides[:turn]:
            results[name].append(run())
            print(
                f"  repeat {repeat + 1}: {name} {results[name][-1]['seconds_per_step']:.3f} s/step"
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variants", action="store_true", help="run TRL once with each setting in PEER_TRIED"
    )
    parser.add_argument(
        "--dynamic", action="store_true", help="also run ours with dynamic sampling (its default)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"GRPO, {args.steps} steps x {args.prompts} prompts x {args.group} completions, "
        f"<= {args.max_tokens} tokens, {args.threads} threads"
    )
    with tempfile.TemporaryDirectory() as folder:
        path, problems = make_model(Path(folder), args.seed)
        if args.variants:
            show_variants(path, problems, args)
            return
        sides: list[Side] = [
            ("ours", lambda: run_ours(path, problems, args, dynamic_sampling=False)),
            ("TRL", lambda: run_trl(path, problems, args)),
        ]
        if args.dynamic:
            sides.append(
                ("ours, dynamic", lambda: run_ours(path, problems, args, dynamic_sampling=True))
            )
        results = alternate(sides, args.repeats)
    print(f"TRL with {PEER_BEST}; each side {args.repeats} times, alternating; median (range)")
    print(f"{'':12}" + "".join(f"{title:>28}" for title in SUMMARY_KEYS.values()))
    for name, runs in results.items():
        cells = [spread([r[key] for r in runs]) for key in SUMMARY_KEYS]
        print(f"{name:12}" + "".join(f"{cell:>28}" for cell in cells))
    pairs = list(zip(results["TRL"], results["ours"], strict=True))
    steps = [trl["seconds_per_step"] / ours["seconds_per_step"] for trl, ours in pairs]
    tokens = [ours["tokens_per_second"] / trl["tokens_per_second"] for trl, ours in pairs]
    print(f"speed-up, TRL s/step / ours s/step, per repeat: {spread(steps)}x")
    print(f"speed-up, ours tokens/s / TRL tokens/s, per repeat: {spread(tokens)}x")


SUMMARY_KEYS = {
    "seconds_per_step": "s/step",
    "tokens_per_second": "tokens/s",
    "first_length": "tokens, step 1",
    "last_length": "tokens, last step",
    "final_reward": "final reward",
}


def show_variants(path: Path, problems: list, args: argparse.Namespace) -> None:
    """Ours and TRL with each setting tried, alternating, `args.repeats` times each after one
    warm-up run of each (which also finds a setting this install cannot run): the median seconds
    per step (with its range) of each, and each against TRL as shipped."""
    sides: list[Side] = [("ours", lambda: run_ours(path, problems, args, dynamic_sampling=False))]
    for name, settings in PEER_TRIED.items():
        sides.append((f"TRL, {name}", functools.partial(run_trl, path, problems, args, settings)))
    runnable: list[Side] = []
    for name, run in sides:
        try:
            run()
            runnable.append((name, run))
        except Exception as error:  # reported and left out, not fatal
            print(f"{name}: failed: {type(error).__name__}: {error}")
    sides = runnable
    results = alternate(sides, args.repeats)
    medians = {
        name: statistics.median(r["seconds_per_step"] for r in runs)
        for name, runs in results.items()
    }
    base = medians.get("TRL, as shipped")
    print(f"each {args.repeats} times, alternating; s/step median (range)")
    print(f"{'':36}{'s/step':>22}{'tokens/s':>10}{'vs shipped':>12}")
    for name, runs in results.items():
        gain = f"{base / medians[name]:.2f}x" if base else "-"
        cell = spread([r["seconds_per_step"] for r in runs])
        tokens = statistics.median(r["tokens_per_second"] for r in runs)
        print(f"{name:36}{cell:>22}{tokens:10.0f}{gain:>12}")


if __name__ == "__main__":
    main()

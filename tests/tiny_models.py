"""A byte-level tokenizer, a one-layer Qwen2 model small enough to train in a test, the small
GRPO and on-policy distillation settings the trainer tests share, and a saved base with SFT rows."""

from pathlib import Path

from configs.reinforcement import GRPOConfig, RewardTerm
from configs.schema import OnPolicyDistillConfig
from configs.supervised import ModelConfig
from models.loading import build_model
from models.tokenizer import train_tokenizer
from problems.types import Problem

TEXTS = [f"What is {a} + {b}? The answer is {a + b}." for a in range(10) for b in range(10)]


def make_tokenizer():
    return train_tokenizer(TEXTS + ["<think> x </think> <answer> y </answer>"], vocab_size=300)


def _decoder(tokenizer, seed: int, **spec):
    return build_model(
        ModelConfig(**spec), len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed
    )


def tiny_model(tokenizer, seed: int = 0):
    return _decoder(
        tokenizer,
        seed,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
        max_position_embeddings=256,
    )


def gqa_model(tokenizer, architecture: str = "qwen2", seed: int = 0):
    """A two-layer Qwen2 or Llama model with grouped-query attention (4 heads over 2 KV heads)."""
    return _decoder(
        tokenizer,
        seed,
        architecture=architecture,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
    )


PROBLEMS = [Problem(f"p{i}", f"What is {i} + 1?", str(i + 1)) for i in range(12)]


def grpo_config(**overrides) -> GRPOConfig:
    """A few GRPO steps on PROBLEMS with rewards a random model can earn (no accuracy)."""
    base = dict(
        steps=4,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=12,
        learning_rate=1e-2,
        rewards=[RewardTerm(name="repetition", params={"chars": 2}), RewardTerm(name="tag_count")],
        checkpoint_every=2,
        mask_truncated=False,
    )
    return GRPOConfig(**(base | overrides))


def distill_config(**overrides) -> OnPolicyDistillConfig:
    base = dict(
        steps=4,
        prompts_per_step=4,
        samples_per_prompt=2,
        max_new_tokens=10,
        learning_rate=1e-2,
        checkpoint_every=2,
    )
    return OnPolicyDistillConfig(**(base | overrides))


def sft_world(root: Path) -> tuple[Path, Path]:
    """A saved tiny Qwen2 base and 32 SFT rows of different lengths (so padding matters), under
    `root`: the base folder and the saved data set."""
    from datasets import Dataset

    from models.saved import save_model

    tokenizer = make_tokenizer()
    base = save_model(tiny_model(tokenizer), tokenizer, root / "base").path
    questions = [f"What is {a} + {a % 7}?" for a in range(32)]
    completions = [
        "<think> " + " ".join(f"{a} + {i} = {a + i}" for i in range(a % 5 + 1)) + " </think> "
        f"<answer> {a + a % 7} </answer>"
        for a in range(32)
    ]
    data = root / "data"
    Dataset.from_dict({"question": questions, "completion": completions}).save_to_disk(str(data))
    return base, data

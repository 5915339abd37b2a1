"""A byte-level tokenizer and a one-layer Qwen2 model small enough to train in a test."""

from configs.schema import ModelConfig
from models.loading import build_model
from models.tokenizer import train_tokenizer

TEXTS = [f"What is {a} + {b}? The answer is {a + b}." for a in range(10) for b in range(10)]


def make_tokenizer():
    return train_tokenizer(TEXTS + ["<think> x </think> <answer> y </answer>"], vocab_size=300)


def tiny_model(tokenizer, seed: int = 0):
    spec = ModelConfig(
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
        max_position_embeddings=256,
    )
    return build_model(spec, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed)

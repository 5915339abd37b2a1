"""Stand-ins for the GPU profile's downloads, made here without a hub: small Qwen2- and
Llama-architecture checkpoints saved with save_pretrained, with tokenizers in the style of the
real ones, and GSM8K-format JSONL files with worked solutions.

- Qwen style: ChatML turns closed by `<|im_end|>`, a default system prompt, digits split one
  per token, and EOS `<|endoftext|>` (as in the Qwen2.5-Math base: EOS is not the end-of-turn).
- Llama 3 style: `<|begin_of_text|>` put in by the template, header tokens, turns closed by
  `<|eot_id|>` (EOS, as in Llama-3.2-Instruct), no pad token, a post-processor that adds BOS.
Neither has our `<think>` tags as tokens, and the models' embeddings are padded beyond the
tokenizer, as real checkpoints' are.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, processors
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from configs.supervised import TrainConfig
from models.chat import render_completions, render_prompt
from models.tokenizer import train_bpe
from stages.tracker import NullTracker
from training.examples import lm_examples
from training.supervised import train

QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
NAMES = ["Natalia", "Weng", "Betty", "James", "Julie", "Albert", "Ken", "Alexis", "Tina", "Randy"]


def gsm8k_row(rng: random.Random) -> dict[str, str]:
    """One GSM8K-format problem: a question and a worked solution with calculator annotations,
    ending in `#### answer`."""
    name, a, b = rng.choice(NAMES), rng.randint(2, 40), rng.randint(2, 9)
    kind = rng.randrange(3)
    if kind == 0:
        half = 2 * a
        question = (
            f"{name} sold clips to {half} of her friends in April, and then she sold half as "
            f"many clips in May. How many clips did {name} sell altogether in April and May?"
        )
        solution = (
            f"{name} sold {half}/2 = <<{half}/2={a}>>{a} clips in May.\n"
            f"{name} sold {half}+{a} = <<{half}+{a}={half + a}>>{half + a} clips altogether in "
            f"April and May.\n#### {half + a}"
        )
    elif kind == 1:
        question = f"A box holds {a} pencils. How many pencils are there in {b} boxes?"
        solution = (
            f"There are {a}*{b} = <<{a}*{b}={a * b}>>{a * b} pencils in {b} boxes.\n#### {a * b}"
        )
    else:
        question = f"{name} has {a} apples and buys {b} more. How many apples does {name} have?"
        solution = f"{name} has {a}+{b} = <<{a}+{b}={a + b}>>{a + b} apples now.\n#### {a + b}"
    return {"question": question, "answer": solution}


def write_gsm8k(folder: Path, n_train: int = 40, n_test: int = 8, bare: int = 2, seed: int = 0):
    """`train.jsonl` and `test.jsonl` with distinct questions; the last `bare` training rows have
    a bare final answer (`#### 12` without reasoning): no solution to curate from."""
    rng = random.Random(seed)
    rows: dict[str, dict[str, str]] = {}
    while len(rows) < n_train + n_test:
        row = gsm8k_row(rng)
        rows.setdefault(row["question"], row)
    listed = list(rows.values())
    train, test = listed[:n_train], listed[n_train:]
    for row in train[n_train - bare :]:
        row["answer"] = "#### " + row["answer"].rsplit("#### ", 1)[1]
    folder.mkdir(parents=True, exist_ok=True)
    for name, split in (("train.jsonl", train), ("test.jsonl", test)):
        with (folder / name).open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in split)
    return folder / "train.jsonl", folder / "test.jsonl"


def corpus(n: int = 96, seed: int = 1) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [gsm8k_row(rng) for _ in range(n)]


def _bpe(special: list[str], vocab_size: int) -> Tokenizer:
    texts = [r["question"] + " " + r["answer"] for r in corpus()]
    texts.append("<think> reasoning </think> <answer> The answer is 5. </answer>")
    return train_bpe(texts, vocab_size, special)


def qwen_style_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_bpe(QWEN_SPECIAL, vocab_size),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = QWEN_TEMPLATE
    return tokenizer


def llama_style_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    core = _bpe(LLAMA_SPECIAL, vocab_size)
    bos = "<|begin_of_text|>"
    core.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, core.token_to_id(bos))]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=bos, eos_token="<|eot_id|>"
    )
    tokenizer.chat_template = LLAMA_TEMPLATE
    return tokenizer


def padded(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


def decoder(tokenizer, architecture: str, hidden: int, layers: int, seed: int = 0):
    """A fresh decoder whose embedding has more rows than the tokenizer has tokens."""
    config_class = {"qwen2": Qwen2Config, "llama": LlamaConfig}[architecture]
    config = config_class(
        vocab_size=padded(len(tokenizer)),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    import torch

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def teach_to_answer(model, tokenizer, steps_dir: Path, epochs: float = 4.0) -> None:
    """A short chat fine-tune on worked solutions, so the stand-in answers and ends its turn as
    an instruct checkpoint does (a random model would never stop, and nothing downstream could
    be kept)."""
    rows = corpus()
    replies = [r["answer"].replace("\n#### ", "\nThe answer is ") + "." for r in rows]
    texts = [
        render_prompt(tokenizer, r["question"]) + c
        for r, c in zip(rows, render_completions(tokenizer, replies), strict=True)
    ]
    config = TrainConfig(
        epochs=epochs, batch_size=16, learning_rate=1e-2, warmup_steps=2, max_length=160
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    examples = lm_examples(tokenizer, texts, config.max_length)
    train(model, examples, config, steps_dir, "stand-in", NullTracker().log_metrics, pad_id=pad)


def save_checkpoint(folder: Path, model, tokenizer) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_stand_ins(root: Path) -> dict[str, Path]:
    """The profile's five inputs under `root`: policy, two students, train and test files."""
    qwen_tok, llama_tok = qwen_style_tokenizer(), llama_style_tokenizer()
    policy = decoder(qwen_tok, "qwen2", hidden=32, layers=2)
    teach_to_answer(policy, qwen_tok, root / "teach")
    train_path, test_path = write_gsm8k(root / "data" / "gsm8k")
    return {
        "policy": save_checkpoint(root / "checkpoints" / "Qwen-policy", policy, qwen_tok),
        "qwen": save_checkpoint(
            root / "checkpoints" / "Qwen-student", decoder(qwen_tok, "qwen2", 16, 1, 1), qwen_tok
        ),
        "llama": save_checkpoint(
            root / "checkpoints" / "Llama-student",
            decoder(llama_tok, "llama", 16, 1, 2),
            llama_tok,
        ),
        "train": train_path,
        "test": test_path,
    }

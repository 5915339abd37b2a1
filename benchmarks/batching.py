"""Three batch layouts in pretraining: plain random batches padded per row, length-grouped
batches (`train.length_window`) padded per row, and plain batches packed in one row
(`train.packing`), attended one example at a time (training/varlen.py).

The bootstrap's corpus is where they were measured; the tiny profile trains it on plain batches,
packed (grouping there gave a base that had not learnt its arithmetic; docs/benchmarks.md).
Packing keeps each batch's examples and each example's loss (tests/training/test_packing.py) and
drops all padding.

Builds the profile's pretraining corpus and base model as the bootstrap does (a fresh tokenizer
from the tiny world, the profile's model), then times training steps of each layout, alternating
in blocks of `--block` steps for `--repeats` rounds in one process with the profile's torch
threads, so load from elsewhere on the machine falls on all alike. Grouped batches hold the same
examples as plain ones in each stretch of `--window` batches; packed ones hold exactly the plain
batches' examples. Prints, for each layout, the tokens laid out per real token over the whole
run's order, and real tokens per second; then each layout's speed-up over plain (median over
rounds of the ratio of tokens/s).

    python -m benchmarks.batching --profile tiny --block 30 --repeats 3 --window 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from configs.profiles import load_profile  # noqa: E402
from models.loading import build_model  # noqa: E402
from models.tokenizer import train_tokenizer  # noqa: E402
from problems.corpus import build_corpus  # noqa: E402
from problems.world import split_world  # noqa: E402
from stages.bootstrap import corpus_examples, tokenizer_texts  # noqa: E402
from training.batches import batch_order, collate, pack  # noqa: E402
from training.examples import Example  # noqa: E402
from training.varlen import packed_attention  # noqa: E402

Layout = Callable[[list[Example], int], dict[str, torch.Tensor]]


def laid_out_per_real(
    order: list[list[int]], examples: list[Example], lay_out: Layout, pad_id: int
) -> float:
    """Tokens in the laid-out batches of `order` (padding included) per real token."""
    laid = sum(
        lay_out([examples[i] for i in batch], pad_id)["input_ids"].numel() for batch in order
    )
    return laid / sum(len(examples[i].input_ids) for batch in order for i in batch)


def timed_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    examples: list[Example],
    batches: list[list[int]],
    lay_out: Layout,
    pad_id: int,
) -> float:
    """Real (unpadded) tokens per second over `batches`, one optimizer step each."""
    began, tokens = time.perf_counter(), 0
    for indices in batches:
        rows = [examples[i] for i in indices]
        with packed_attention(model):  # as the training loop runs every layout
            loss = model(**lay_out(rows, pad_id), use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += sum(len(e.input_ids) for e in rows)
    return tokens / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--block", type=int, default=20, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of plain, then grouped")
    parser.add_argument("--window", type=int, default=32, help="batches per length-sorted stretch")
    args = parser.parse_args()
    config = load_profile(args.profile)
    torch.set_num_threads(config.torch_threads)
    boot = config.bootstrap
    train, _ = split_world(config.data.world)
    docs = build_corpus(train, boot.corpus, seed=config.data.world.seed)
    tokenizer = train_tokenizer(
        tokenizer_texts(docs, train, config.data.world.seed), boot.vocab_size
    )
    examples = corpus_examples(tokenizer, docs, boot.train.max_length)
    lengths = [len(e.input_ids) for e in examples]
    plain_cfg = boot.train.model_copy(update={"length_window": 0})
    grouped_cfg = boot.train.model_copy(update={"length_window": args.window})
    plain = batch_order(len(examples), plain_cfg)
    layouts: dict[str, tuple[list[list[int]], Layout]] = {
        "plain": (plain, collate),
        f"grouped (window {args.window})": (
            batch_order(len(examples), grouped_cfg, lengths),
            collate,
        ),
        "packed": (plain, pack),
    }
    model = build_model(
        boot.model, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=boot.train.learning_rate)
    pad_id = tokenizer.pad_token_id
    print(
        f"{args.profile}: {len(examples)} documents, {len(plain)} steps of "
        f"{boot.train.batch_size}, {config.torch_threads} threads"
    )
    timed_steps(model, optimizer, examples, plain[:3], collate, pad_id)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in layouts}
    for round_ in range(args.repeats):
        start = round_ * args.block
        for name, (order, lay_out) in layouts.items():
            block = order[start : start + args.block]
            rates[name].append(timed_steps(model, optimizer, examples, block, lay_out, pad_id))
    for name, (order, lay_out) in layouts.items():
        print(
            f"{name:>22}: laid out/real {laid_out_per_real(order, examples, lay_out, pad_id):.3f}, "
            f"{statistics.median(rates[name]):,.0f} real tokens/s (median of {args.repeats})"
        )
    for name in list(layouts)[1:]:
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["plain"], strict=True))
        print(f"speed-up, {name} over plain: {ratio:.2f}x")


if __name__ == "__main__":
    main()

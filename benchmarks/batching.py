"""Length-grouped batches (`train.length_window`) against plain random batches, in pretraining.

The bootstrap's corpus is where grouping was measured, though the tiny profile trains that corpus
on plain batches (grouping there gave a base that had not learnt its arithmetic; README).

Builds the profile's pretraining corpus and base model as the bootstrap does (a fresh tokenizer
from the tiny world, the profile's model), then times training steps of each batch order,
alternating in blocks of `--block` steps for `--repeats` rounds in one process with the profile's
torch threads, so load from elsewhere on the machine falls on both alike. Both orders hold the
same examples in each stretch of `--window` batches. Prints, for each order, the padded tokens
per real token over the whole run's order, and real tokens per second; then the speed-up
(median over rounds of grouped over plain tokens/s).

    python -m benchmarks.batching --profile tiny --block 30 --repeats 3 --window 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from configs.loader import load_profile  # noqa: E402
from models.loading import build_model  # noqa: E402
from models.tokenizer import train_tokenizer  # noqa: E402
from problems.corpus import build_corpus  # noqa: E402
from problems.generators import split_world  # noqa: E402
from stages.bootstrap import corpus_examples, tokenizer_texts  # noqa: E402
from training.examples import Example  # noqa: E402
from training.loop import batch_order, collate  # noqa: E402


def padded_per_real(order: list[list[int]], lengths: list[int]) -> float:
    padded = sum(max(lengths[i] for i in batch) * len(batch) for batch in order)
    return padded / sum(lengths[i] for batch in order for i in batch)


def timed_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    examples: list[Example],
    batches: list[list[int]],
    pad_id: int,
) -> float:
    """Real (unpadded) tokens per second over `batches`, one optimizer step each."""
    began, tokens = time.perf_counter(), 0
    for indices in batches:
        batch = collate([examples[i] for i in indices], pad_id)
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int(batch["attention_mask"].sum())
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
    orders = {
        "plain": batch_order(len(examples), plain_cfg),
        f"grouped (window {args.window})": batch_order(len(examples), grouped_cfg, lengths),
    }
    model = build_model(
        boot.model, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=boot.train.learning_rate)
    pad_id = tokenizer.pad_token_id
    print(
        f"{args.profile}: {len(examples)} documents, {len(orders['plain'])} steps of "
        f"{boot.train.batch_size}, {config.torch_threads} threads"
    )
    timed_steps(model, optimizer, examples, orders["plain"][:3], pad_id)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in orders}
    for round_ in range(args.repeats):
        start = round_ * args.block
        for name, order in orders.items():
            block = order[start : start + args.block]
            rates[name].append(timed_steps(model, optimizer, examples, block, pad_id))
    for name, order in orders.items():
        print(
            f"{name:>22}: padded/real {padded_per_real(order, lengths):.3f}, "
            f"{statistics.median(rates[name]):,.0f} real tokens/s (median of {args.repeats})"
        )
    plain, grouped = rates.values()
    ratio = statistics.median(g / p for g, p in zip(grouped, plain, strict=True))
    print(f"speed-up, grouped over plain: {ratio:.2f}x")


if __name__ == "__main__":
    main()

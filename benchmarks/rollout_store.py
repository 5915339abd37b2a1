"""The stage-4 rollout store at scale: insert, filter and export a million synthetic rollouts.

Synthetic rollouts shaped like rejection sampling's (G samples per prompt, both prompt kinds,
200-400 character completions, some near-duplicates within a prompt, some truncated, rewards
with NULLs where a reward cannot verify) are generated with numpy and pyarrow compute, a chunk at
a time, and inserted into a fresh DuckDB file as a sampler would: one transaction per chunk.
Then the whole funnel runs and the kept set is exported. Prints rows per second for the inserts
and for the funnel, the funnel table and the total seconds (data generation included).

    python -m benchmarks.rollout_store --rows 1000000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from configs.schema import FunnelConfig
from storage.funnel import export_kept, run_funnel
from storage.rollout_store import insert_rollouts

MODEL = "model_2"
VOCABULARY = (
    "so then we add the carry and check each step first second result total sum product "
    "difference remainder divide multiply subtract number digit answer therefore because "
    "wait let me verify again hmm that gives ok now consider the next term value of x is"
)
WORDS = VOCABULARY.split()
SPEC = FunnelConfig(
    min_completion_tokens=16, max_completion_tokens=96, min_general_score=0.0, top_k=2
)


def sentence_pool(rng: np.random.Generator, size: int) -> pa.Array:
    """Distinct sentences of 50-130 characters; completions are drawn from triples of them."""
    lengths = rng.integers(9, 24, size)
    return pa.array([" ".join(rng.choice(WORDS, n)) + "." for n in lengths])


def with_nulls(values: np.ndarray, null: np.ndarray) -> pa.Array:
    return pa.array(values, type=pa.float64(), mask=null)


def completions(rng: np.random.Generator, pool: pa.Array, n: int, samples: int) -> pa.Array:
    """Three pooled sentences and a number per completion, on lines of their own as in real
    chains of thought, so texts are long and distinct;
    about 6% of samples repeat their prompt's first sample, re-cased or re-spaced."""
    number = pc.cast(pa.array(rng.integers(0, 10**6, n)), pa.string())
    parts = [pool.take(pa.array(rng.integers(0, len(pool), n))) for _ in range(3)]
    body = pc.binary_join_element_wise(parts[0], number, parts[1], parts[2], "\n")
    text = pc.binary_join_element_wise(
        "<think>\n", body, "\n</think>\n<answer>", number, "</answer>", ""
    )
    copies = np.flatnonzero((rng.random(n) < 0.06) & (np.arange(n) % samples > 0))
    first = text.take(pa.array(copies // samples * samples))
    variants = pc.if_else(
        pa.array(rng.random(len(copies)) < 0.5),
        pc.utf8_upper(first),
        pc.replace_substring(first, " ", "  "),
    )
    index = np.arange(n)
    index[copies] = n + np.arange(len(copies))
    return pa.concat_arrays([text, variants]).take(pa.array(index))


def synthetic_chunk(
    rng: np.random.Generator, pool: pa.Array, first_prompt: int, n_prompts: int, samples: int
) -> pa.Table:
    n = n_prompts * samples
    prompt_no = np.repeat(np.arange(first_prompt, first_prompt + n_prompts), samples)
    prompt_id = pc.binary_join_element_wise(
        "p", pc.utf8_lpad(pc.cast(pa.array(prompt_no), pa.string()), 7, "0"), ""
    )
    reasoning = np.repeat(rng.random(n_prompts) < 0.7, samples)
    text = completions(rng, pool, n, samples)
    tokens = pc.add(pc.divide(pc.utf8_length(text), 4), pa.array(rng.integers(-8, 9, n)))
    accuracy = (rng.random(n) < 0.55).astype(float)
    fmt = (rng.random(n) < 0.85).astype(float)
    share = np.where(rng.random(n) < 0.7, 1.0, rng.uniform(0.5, 1.0, n))
    preference = rng.normal(0.3, 1.0, n)
    total = np.where(reasoning, accuracy, preference) + fmt + 0.2 * share
    return pa.table(
        {
            "prompt_id": prompt_id,
            "sample_index": pa.array(np.arange(n) % samples, pa.int32()),
            "model_id": pa.array([MODEL] * n),
            "kind": pa.array(np.where(reasoning, "reasoning", "general")),
            "language": pa.array(
                np.where(np.repeat(rng.random(n_prompts) < 0.8, samples), "en", "xx")
            ),
            "prompt": pc.binary_join_element_wise(
                "Question ", prompt_id, ": ", pool.take(pa.array(prompt_no % len(pool))), ""
            ),
            "completion": text,
            "prompt_tokens": pa.array(rng.integers(12, 40, n), pa.int32()),
            "completion_tokens": pc.cast(tokens, pa.int32()),
            "finish_reason": pa.array(np.where(rng.random(n) < 0.04, "length", "stop")),
            "reward_accuracy": with_nulls(accuracy, ~reasoning | (rng.random(n) < 0.03)),
            "reward_format": with_nulls(fmt, rng.random(n) < 0.01),
            "reward_language": with_nulls(share, rng.random(n) < 0.02),
            "reward_preference": with_nulls(preference, reasoning),
            "reward_total": pa.array(total),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (G)")
    parser.add_argument("--chunk-prompts", type=int, default=12_500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from datasets import disable_progress_bars

    disable_progress_bars()
    began = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    pool = sentence_pool(rng, 4096)
    n_prompts = args.rows // args.samples
    generate = insert = 0.0
    stored = 0
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "rollouts.duckdb"
        for first in range(0, n_prompts, args.chunk_prompts):
            t0 = time.perf_counter()
            chunk = synthetic_chunk(
                rng, pool, first, min(args.chunk_prompts, n_prompts - first), args.samples
            )
            t1 = time.perf_counter()
            stored += insert_rollouts(db, chunk)
            generate, insert = generate + t1 - t0, insert + time.perf_counter() - t1
        t0 = time.perf_counter()
        funnel = run_funnel(db, MODEL, SPEC, "bench")
        t1 = time.perf_counter()
        digest = export_kept(db, "bench", Path(folder) / "kept.parquet", Path(folder) / "hf")
        t2 = time.perf_counter()
        size = db.stat().st_size
    total = time.perf_counter() - began

    print(
        f"{stored:,} rollouts ({n_prompts:,} prompts x {args.samples}), chunks of "
        f"{args.chunk_prompts * args.samples:,} rows, DuckDB file {size / 2**20:.0f} MiB"
    )
    print(f"{'generate (numpy/arrow)':24}{generate:8.2f} s")
    print(f"{'insert':24}{insert:8.2f} s {stored / insert:12,.0f} rows/s")
    print(f"{'funnel':24}{t1 - t0:8.2f} s {stored / (t1 - t0):12,.0f} rows/s")
    print(f"{'export (parquet + hf)':24}{t2 - t1:8.2f} s {funnel.kept:12,} rows  {digest[:12]}")
    print(f"\n{'filter':18}{'rows_in':>12}{'rows_out':>12}{'removed':>12}")
    for f in funnel.filters:
        print(f"{f.name:18}{f.rows_in:12,}{f.rows_out:12,}{f.removed:12,}")
    print(f"\ntotal {total:.2f} s")


if __name__ == "__main__":
    main()

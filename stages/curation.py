"""Stage 1: cold-start curation of long chain-of-thought traces.

The teacher writes traces for the training problems (or, with `source: solutions`, the data
set's reference solutions become them: curation.reference_traces); the filters keep the well-formed,
readable, single-language, correct, length-bounded, distinct ones and count what each removed.
The kept set is saved as a Hugging Face dataset; every candidate, with the filter that removed
it, is saved as Parquet for the record.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Dataset

from configs.supervised import CurationConfig
from curation.curated import CuratedSet
from curation.filters import ExampleBound, apply_filters
from curation.reference_traces import solution_traces
from curation.teacher import Trace, write_traces
from models.chat import render_completions, render_prompt
from models.loading import load_tokenizer
from models.saved import ModelRef
from problems.loader import load_problems
from problems.types import Problem, ProblemSet
from stages.tracker import Tracker

COLUMNS = ("problem_id", "question", "answer", "language", "family", "completion")


def run(
    config: CurationConfig,
    problems: ProblemSet,
    base: ModelRef,
    out_dir: Path,
    tracker: Tracker,
    max_example_tokens: int | None = None,
) -> CuratedSet:
    """The filtered cold-start set; with `max_example_tokens` (the cold-start SFT's max_length),
    the length filter also removes a trace whose whole example, prompt and completion as SFT
    renders them, is longer, where SFT would cut it."""
    train = load_problems(problems.train_path, limit=config.max_problems)  # reads no further
    tokenizer = load_tokenizer(base.path)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def example_tokens(trace: Trace) -> int:
        (completion,) = render_completions(tokenizer, [trace.completion])
        return count_tokens(render_prompt(tokenizer, trace.question) + completion)

    bound = None if max_example_tokens is None else ExampleBound(max_example_tokens, example_tokens)
    traces, skipped = candidate_traces(config, train)
    result = apply_filters(traces, config.filters, count_tokens, bound)
    counts = skipped | result.counts
    tracker.log_metrics(
        {f"filter/{name}_removed": float(n) for name, n in counts.items()}
        | {"curation/candidates": float(len(traces)), "curation/kept": float(len(result.kept))}
    )
    if not result.kept:
        raise ValueError(f"curation kept none of {len(traces)} traces; removed: {counts}")

    out_dir.mkdir(parents=True, exist_ok=True)
    dataset_path = out_dir / "curated"
    Dataset.from_list([{c: getattr(t, c) for c in COLUMNS} for t in result.kept]).save_to_disk(
        str(dataset_path)
    )
    candidates = [
        {**{c: getattr(t, c) for c in COLUMNS}, "teacher_fault": t.fault, "removed_by": None}
        for t in result.kept
    ] + [
        {**{c: getattr(t, c) for c in COLUMNS}, "teacher_fault": t.fault, "removed_by": name}
        for t, name in result.removed
    ]
    candidates_path = out_dir / "candidates.parquet"
    pq.write_table(pa.Table.from_pylist(candidates), candidates_path)
    return CuratedSet(
        dataset_path=dataset_path,
        candidates_path=candidates_path,
        n_candidates=len(traces),
        n_kept=len(result.kept),
        filter_counts=counts,
    )


def candidate_traces(
    config: CurationConfig, problems: list[Problem]
) -> tuple[list[Trace], dict[str, int]]:
    """The traces the filters judge, from the configured source, and what was skipped before
    them: with `solutions`, the problems that have none (`no_solution`, counted first)."""
    if config.source == "solutions":
        traces, missing = solution_traces(problems)
        return traces, {"no_solution": missing}
    return write_traces(problems, config.teacher), {}

"""Prepare the problem sets: generate the tiny world, or load real data, into JSONL files.

Both sources end as the same two files read by the same loader, so no later stage can tell (or
needs to know) where the problems came from.
"""

from __future__ import annotations

from pathlib import Path

from configs.schema import DataConfig
from problems.generators import split_world
from problems.loader import load_problems, write_problems
from stages.refs import ProblemSet


def run(config: DataConfig, out_dir: Path) -> ProblemSet:
    if config.source == "tiny":
        train, heldout = split_world(config.world)
    else:
        files = config.files
        assert files is not None  # the schema refuses source "files" without them
        train = load_problems(files.train_path, files.question_field, files.answer_field)
        heldout = load_problems(files.heldout_path, files.question_field, files.answer_field)
        overlap = {p.question for p in train} & {p.question for p in heldout}
        if overlap:
            raise ValueError(
                f"{len(overlap)} held-out question(s) also appear in the training file, "
                f"e.g. {next(iter(overlap))!r}: the evaluation would be contaminated"
            )
    return ProblemSet(
        train_path=write_problems(out_dir / "train.jsonl", train),
        heldout_path=write_problems(out_dir / "heldout.jsonl", heldout),
        n_train=len(train),
        n_heldout=len(heldout),
    )

"""Prepare the problem sets: generate the tiny world, or load real data, into JSONL files.

Both sources end as the same two files read by the same loader, so no later stage can tell (or
needs to know) where the problems came from. Malformed rows of real data are skipped and counted
by reason, or refused, as `data.files.bad_rows` says.
"""

from __future__ import annotations

from pathlib import Path

from configs.data import DataConfig, FilesConfig
from problems.loader import LoadReport, read_problems, write_problems
from problems.types import Problem, ProblemSet
from problems.world import split_world


def run(config: DataConfig, out_dir: Path) -> ProblemSet:
    skipped: dict[str, int] = {}
    if config.source == "tiny":
        train, heldout = split_world(config.world)
    else:
        files = config.files
        assert files is not None  # the schema refuses source "files" without them
        train, train_report = read_files(files, files.train_path)
        heldout, heldout_report = read_files(files, files.heldout_path)
        skipped = skipped_counts(train_report, heldout_report)
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
        skipped_rows=skipped,
    )


def read_files(files: FilesConfig, path: Path) -> tuple[list[Problem], LoadReport]:
    """One real-data file, read with the configured columns and bad-row policy."""
    return read_problems(
        path,
        files.question_field,
        files.answer_field,
        bad_rows=files.bad_rows,
        max_row_chars=files.max_row_chars,
        tests_field=files.tests_field,
    )


def skipped_counts(train: LoadReport, heldout: LoadReport) -> dict[str, int]:
    """Rows skipped per split and reason, as `train/<reason>` -> rows."""
    return {
        f"{split}/{reason}": n
        for split, report in (("train", train), ("heldout", heldout))
        for reason, n in report.skipped.items()
    }


def skipped_row_metrics(problems: ProblemSet) -> dict[str, float]:
    """The skipped-row counts as metrics (`data/skipped_rows/train/missing_answer`), with
    per-split totals that are 0 when nothing was skipped."""
    metrics = {f"data/skipped_rows/{split}": 0.0 for split in ("train", "heldout")}
    for name, n in problems.skipped_rows.items():
        metrics[f"data/skipped_rows/{name}"] = float(n)
        split = name.split("/", 1)[0]
        metrics[f"data/skipped_rows/{split}"] += n
    return metrics

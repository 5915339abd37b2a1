"""Paired differences between two stages' held-out pass@1, overall and per family.

Both stages were evaluated on the same held-out problems; each problem's pass@1 is the mean
correctness of its samples, and the difference of two stages is the mean over problems of the
per-problem difference, with its standard error over problems. A difference smaller than about
twice its standard error is noise. It reads the evaluation samples the pipeline keeps
(`runs/<stage>/<key>/eval/eval_samples.parquet`, the newest of each stage); nothing is sampled
again.

    python -m benchmarks.compare_stages --state-dir state \\
        --pairs reasoning_rl:cold_start_sft all_scenarios_rl:bootstrap [--strict]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.failure_kinds import latest


def per_problem(samples: Path, strict: bool) -> dict[str, tuple[str, float]]:
    """problem id -> (family, mean correctness of its samples)."""
    column = "correct" if strict else "correct_lenient"
    rows = pq.read_table(samples, columns=["problem_id", "family", column]).to_pylist()
    grouped: dict[str, list[bool]] = defaultdict(list)
    family = {}
    for row in rows:
        grouped[row["problem_id"]].append(bool(row[column]))
        family[row["problem_id"]] = row["family"]
    return {pid: (family[pid], sum(v) / len(v)) for pid, v in grouped.items()}


def paired(after: dict, before: dict, family: str | None = None) -> tuple[float, float, int]:
    """(mean difference, its standard error, problems) over the problems both evaluated."""
    common = [p for p in after if p in before and (family is None or after[p][0] == family)]
    diffs = [after[p][1] - before[p][1] for p in common]
    if len(diffs) < 2:
        raise ValueError(f"fewer than two problems in common{f' of {family}' if family else ''}")
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)), len(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=Path("state"))
    parser.add_argument("--pairs", nargs="+", required=True, help="AFTER:BEFORE stage names")
    parser.add_argument("--strict", action="store_true", help="the strict reading (answer block)")
    args = parser.parse_args()
    runs = args.state_dir / "runs"
    for pair in args.pairs:
        after_stage, before_stage = pair.split(":")
        after = per_problem(latest(f"{after_stage}/*/eval/eval_samples.parquet", runs), args.strict)
        before = per_problem(
            latest(f"{before_stage}/*/eval/eval_samples.parquet", runs), args.strict
        )
        parts = []
        for family in [None, *sorted({f for f, _ in after.values()})]:
            diff, sem, n = paired(after, before, family)
            parts.append(f"{family or 'all'} {diff:+.3f} ± {sem:.3f} (n={n})")
        print(f"{after_stage} - {before_stage}: " + "; ".join(parts))


if __name__ == "__main__":
    main()

"""Where a stage's wrong answers go wrong in the tiny world, whose problems know their worked steps.

Each wrong held-out sample of the stage's last evaluation gets the first kind that fits:
"step count" (the reasoning writes more or fewer equations than the problem has steps),
"arithmetic" (an equation that does not hold), "operands" (an operand or operator other than the
problem's), or "summary" (every step right, the answer still wrong: the answer restates a result
wrongly). It reads the evaluation samples the pipeline keeps; nothing is sampled again.

    python -m benchmarks.failure_kinds --state-dir state --stages cold_start_sft reasoning_rl
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

from problems.generators import apply
from problems.loader import load_problems

FAILURE_KINDS = ("step count", "arithmetic", "operands", "summary")
# the worked steps' own form (problems.generators.worked_steps); rewards.steps.check_steps also
# reads "a op b gives c", which is the traces' self-check, not a step
_EQUATION = re.compile(r"(\d+) ([-+*]) (\d+) = (\d+)")


def failure_kind(completion: str, steps: Sequence[str]) -> str:
    """Why a wrong completion of a problem with worked `steps` ("7 + 5 = 12") is wrong."""
    written = _EQUATION.findall(completion.split("</think>")[0])
    if len(written) != len(steps):
        return "step count"
    if any(apply(int(a), (op, int(b))) != int(c) for a, op, b, c in written):
        return "arithmetic"
    if [f"{a} {op} {b} = {c}" for a, op, b, c in written] != list(steps):
        return "operands"
    return "summary"


def failure_counts(samples: Path, heldout: Path) -> Counter[str]:
    """Failure kinds of the wrong samples of the math family in an evaluation's
    `eval_samples.parquet` (the other families' steps are not equations)."""
    problems = load_problems(heldout)
    families = {p.id: p.family for p in problems}
    rows = pq.read_table(samples, columns=["problem_id", "completion", "correct"]).to_pylist()
    wrong = [r for r in rows if not r["correct"]]
    missing = {r["problem_id"] for r in wrong} - families.keys()
    if missing:
        raise ValueError(
            f"{heldout} lacks {len(missing)} problems of {samples}, e.g. {min(missing)}"
        )
    steps = {p.id: p.steps for p in problems if p.family == "math"}
    wrong = [r for r in wrong if r["problem_id"] in steps]
    if not all(steps[r["problem_id"]] for r in wrong):
        raise ValueError(f"{heldout}: problems without worked steps (only the tiny world has them)")
    return Counter(failure_kind(r["completion"], steps[r["problem_id"]]) for r in wrong)


def latest(pattern: str, root: Path) -> Path:
    found = sorted(root.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"nothing matches {root / pattern}; has the pipeline run there?")
    return found[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=Path("state"))
    parser.add_argument("--stages", nargs="+", default=["cold_start_sft", "reasoning_rl"])
    args = parser.parse_args()
    runs = args.state_dir / "runs"
    try:
        heldout = latest("problems/*/heldout.jsonl", runs)
        for stage in args.stages:
            counts = failure_counts(latest(f"{stage}/*/eval/eval_samples.parquet", runs), heldout)
            shown = ", ".join(f"{kind} {counts[kind]}" for kind in FAILURE_KINDS)
            print(f"{stage}: {sum(counts.values())} wrong samples: {shown}")
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"failure_kinds: {err}\n")


if __name__ == "__main__":
    main()

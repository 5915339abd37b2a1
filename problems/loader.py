"""One loader for every problem file: the tiny world's own and real data sets.

Real data: JSONL or Parquet with a question and an answer column (names configurable). Answers
may be GSM8K solutions ending in `#### 42` or MATH solutions with `\\boxed{42}`; the final answer
is extracted at load so every stage sees a clean gold string.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from problems.answers import final_answer_text
from problems.scripts import dominant_script
from problems.types import Problem

SUFFIXES = (".jsonl", ".json", ".parquet")


class ProblemFileError(ValueError):
    """A problem file is missing, of an unknown kind, or lacks the expected columns."""


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        raise ProblemFileError(f"{path}: no such file")
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        rows = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ProblemFileError(f"{path}:{lineno}: not JSON ({err.msg})") from err
        return rows
    raise ProblemFileError(f"{path}: unknown file kind; expected one of {SUFFIXES}")


def load_problems(
    path: str | Path,
    question_field: str = "question",
    answer_field: str = "answer",
    limit: int | None = None,
) -> list[Problem]:
    """Read problems from `path`, extracting each final answer from its solution text."""
    path = Path(path)
    rows = _read_rows(path)[:limit]
    problems = []
    for i, row in enumerate(rows):
        missing = [f for f in (question_field, answer_field) if f not in row]
        if missing:
            raise ProblemFileError(f"{path}: row {i} lacks column(s) {missing}; has {sorted(row)}")
        question = str(row[question_field])
        problems.append(
            Problem(
                id=str(row.get("id", f"{path.stem}-{i:06d}")),
                question=question,
                answer=final_answer_text(str(row[answer_field])),
                language=str(row.get("language") or dominant_script(question)),
                source=str(row.get("source") or path.name),
                key=str(row.get("key") or row.get("id") or f"{path.stem}-{i:06d}"),
                steps=tuple(row.get("steps") or ()),
                kind=str(row.get("kind") or "reasoning"),
            )
        )
    return problems


def write_problems(path: str | Path, problems: list[Problem]) -> Path:
    """Write problems as JSONL, the form `load_problems` reads back unchanged."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p.to_dict(), ensure_ascii=False) + "\n")
    return path

"""The problem record every stage passes around."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FAMILIES = ("math", "code", "logic")  # which verifier judges a reasoning problem
# The reward (by registry name) that pays each family's correctness: its verifier.
FAMILY_REWARDS = {"math": "accuracy", "code": "code", "logic": "countdown"}


@dataclass(frozen=True)
class Problem:
    """A question with a gold answer.

    `kind` routes rewards: "reasoning" problems are graded by rules against `answer`, "general"
    prompts by a trained reward model. `key` identifies the underlying problem independently of
    its wording and language, so that the train/held-out split can keep a problem and its
    rephrasings on the same side. `steps` are worked intermediate results ("7 + 5 = 12") when the
    source knows them; the programmatic teacher needs them, real data usually lacks them.
    `solution` is a data set's own worked solution (GSM8K's reasoning before `#### 42`, MATH's
    text ending in `\\boxed{}`), kept for cold-start curation from reference solutions; "" when
    the source has none (the tiny world, bare answers).

    `family` says which verifier judges a reasoning problem: "math" (the answer, by math-verify),
    "code" (a program, by its hidden `tests` in the sandbox: assert statements, or stdin/stdout
    cases as JSON; `answer` is a reference program, or "") or "logic" (an expression reaching
    the target `answer` from `numbers`, each used once). For code tasks `steps` are the chain's
    operations ("+ 3").
    """

    id: str
    question: str
    answer: str
    language: str = "latin"
    source: str = "files"
    key: str = ""
    steps: tuple[str, ...] = field(default_factory=tuple)
    kind: str = "reasoning"  # or "general": no checkable answer, a reward model judges it
    solution: str = ""
    family: str = "math"  # "math", "code" or "logic"; general prompts keep the default
    tests: tuple[str, ...] = field(default_factory=tuple)
    numbers: tuple[int, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready row; `solution` only when there is one, so files of problems without
        one (the tiny world's) stay as they were."""
        row = asdict(self)
        row["steps"] = list(self.steps)
        row["tests"] = list(self.tests)
        row["numbers"] = list(self.numbers)
        for name in ("solution", "tests", "numbers"):
            if not row[name]:
                del row[name]
        return row

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Problem:
        return cls(
            id=str(row["id"]),
            question=str(row["question"]),
            answer=str(row["answer"]),
            language=str(row.get("language") or "latin"),
            source=str(row.get("source") or "files"),
            key=str(row.get("key") or row["id"]),
            steps=tuple(row.get("steps") or ()),
            kind=str(row.get("kind") or "reasoning"),
            solution=str(row.get("solution") or ""),
            family=str(row.get("family") or ("code" if row.get("tests") else "math")),
            tests=tuple(str(t) for t in row.get("tests") or ()),
            numbers=tuple(int(n) for n in row.get("numbers") or ()),
        )


@dataclass(frozen=True)
class ProblemSet:
    """The problems stage's result: the train and held-out JSONL files."""

    train_path: Path
    heldout_path: Path
    n_train: int
    n_heldout: int
    skipped_rows: dict[str, int] = field(default_factory=dict)  # "train/<reason>" -> rows

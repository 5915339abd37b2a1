"""A grader file as a reward: `(prompts, completions, **columns) -> list[float | None]`.

Each completion becomes a `sample` (see graders.base.make_sample) and each row of the columns
the stage passes becomes an `item`, with the prompt under `item.prompt` unless a column already
has that name. In GRPO the columns are `contracts.reward_names.REWARD_COLUMNS` (answer, language,
kind, family, ...), so a grader reads the gold answer as `{{item.answer}}`; a file that reads a
column no stage passes (OpenAI's `item.reference_answer`) is refused when it loads. The reward
is the grader's score (pass_threshold does not binarise it); a sample the grader cannot score
gets None, and grading never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contracts.reward_names import LIST_COLUMNS, REWARD_COLUMNS
from graders.base import Grader, Item, make_sample
from graders.build import build_grader
from graders.python_grader import DEFAULT_SECONDS_PER_SAMPLE
from graders.score_model import Judge
from graders.spec import GraderFileError, MultiSpec, load_spec, template_fields
from graders.templates import references

log = logging.getLogger(__name__)

# The fields an `item` has: the columns a GRPO stage passes its rewards, and the prompt.
ITEM_FIELDS = (*REWARD_COLUMNS, "prompt")

REPO_ROOT = Path(__file__).resolve().parents[1]
# Rewards are held as float32 (rl/scoring.py): a score past its range becomes inf there and turns
# the group's advantages into NaN. Scores are clipped to this, keeping their order and sign.
MAX_ABS_SCORE = 1e30


def make_items(prompts: Sequence[str], columns: Mapping[str, Sequence[Any]], n: int) -> list[Item]:
    """One `item` per sample from the reward's columns, plus the prompt."""
    items: list[Item] = []
    for i in range(n):
        row = {name: values[i] for name, values in columns.items()}
        if "prompt" not in row and i < len(prompts):
            row["prompt"] = prompts[i]
        items.append(row)
    return items


class GraderReward:
    """A loaded grader behind the reward contract; never raises while grading."""

    def __init__(self, grader: Grader, path: str | Path):
        self.grader = grader
        self.path = str(path)
        self.__name__ = "grader"  # read by code that names rewards after their function
        self._warned = False

    def __call__(
        self, prompts: list[str], completions: list[str], **columns: Any
    ) -> list[float | None]:
        try:
            samples = [make_sample(c) for c in completions]
            outcomes = self.grader.evaluate(samples, make_items(prompts, columns, len(samples)))
        except Exception as exc:  # e.g. columns shorter than the completions
            log.warning("grader %s failed on a batch: %s", self.path, exc)
            return [None] * len(completions)
        errors = [o.error for o in outcomes if o.error]
        if errors and not self._warned:
            log.warning(
                "grader %s could not score %d of %d samples, e.g.: %s",
                self.path,
                len(errors),
                len(outcomes),
                errors[0],
            )
            self._warned = True
        return [
            None if o.score is None else max(-MAX_ABS_SCORE, min(MAX_ABS_SCORE, o.score))
            for o in outcomes
        ]


def resolve_grader_path(path: str | Path) -> Path:
    """A grader file path: as given (relative to the working directory), else under the repo."""
    given = Path(path).expanduser()
    if given.exists() or given.is_absolute():
        return given
    in_repo = REPO_ROOT / given
    return in_repo if in_repo.exists() else given


def grader_reward(
    path: str | None = None,
    python_seconds: float = DEFAULT_SECONDS_PER_SAMPLE,
    judge: Judge | None = None,
    **unknown: Any,
) -> GraderReward:
    """The reward for the grader file at `path` (the registry's `grader` entry).

    Config: `rewards: [{name: grader, params: {path: graders/examples/exact_answer.yaml}}]`.
    The file is loaded and checked here, so a bad one fails when the rewards are built, naming
    the file and the key.
    """
    if unknown:
        raise GraderFileError(
            f"reward 'grader': unknown params {sorted(unknown)}; known: path, python_seconds"
        )
    if not path:
        raise GraderFileError("reward 'grader' needs params.path: the grader file to load")
    resolved = resolve_grader_path(path)
    spec = load_spec(resolved)
    check_item_fields(spec, str(resolved))
    grader = build_grader(spec, str(resolved), judge=judge, python_seconds=float(python_seconds))
    return GraderReward(grader, resolved)


def check_item_fields(spec: Any, where: str, key: str = "") -> None:
    """Every `{{ item.<field> }}` names a column the stage passes; else GraderFileError naming
    the field and the columns (OpenAI's `item.reference_answer` is our `item.answer`)."""
    at = f"{key}." if key else ""
    if isinstance(spec, MultiSpec):
        for name, sub in spec.graders.items():
            check_item_fields(sub, where, f"{at}graders.{name}")
        return
    for field, template in template_fields(spec):
        for ref in references(template):
            problem = item_path_problem(ref.path) if ref.namespace == "item" else None
            if problem is not None:
                raise GraderFileError(f"{where}: {at}{field}: {problem}")


def item_path_problem(path: tuple[str, ...]) -> str | None:
    """Why `{{ item.<path> }}` can find nothing in any item the RL stages pass, else None: a
    column they do not pass, a step inside a column of one value, or a list column read by a
    step that is not an index (each would score every sample None while grading)."""
    head, rest, text = path[0], path[1:], "{{item." + ".".join(path) + "}}"
    if head not in ITEM_FIELDS:
        return (
            f"{{{{item.{head}}}}} is not a column the RL stages pass; an item has "
            f"{list(ITEM_FIELDS)} (the gold answer is item.answer)"
        )
    if head in LIST_COLUMNS:
        if rest and not rest[0].isdigit():
            return f"{text}: item.{head} is a list, read by index (item.{head}.0)"
        if len(rest) > 1:
            return f"{text}: each of item.{head} is one value, with nothing inside it to read"
    elif rest:
        return f"{text}: item.{head} is one value (text or a number), with nothing inside it"
    return None

"""Grader files to runnable graders."""

from __future__ import annotations

from pathlib import Path

from graders.base import Grader
from graders.formula import compile_formula
from graders.multi import MultiGrader
from graders.python_grader import DEFAULT_SECONDS_PER_SAMPLE, PythonGrader
from graders.score_model import Judge, ScoreModelGrader, local_judge, resolve_model_path
from graders.spec import (
    GraderFileError,
    GraderSpec,
    MultiSpec,
    PythonSpec,
    ScoreModelSpec,
    StringCheckSpec,
    TextSimilaritySpec,
    load_spec,
)
from graders.string_check import StringCheckGrader
from graders.text_similarity import TextSimilarityGrader


def build_grader(
    spec: GraderSpec,
    where: str = "<grader>",
    *,
    judge: Judge | None = None,
    python_seconds: float = DEFAULT_SECONDS_PER_SAMPLE,
    key: str = "",
) -> Grader:
    """The grader a validated spec describes.

    `judge` replaces the local model of every score_model grader (a stage's own model, or a
    stand-in in tests); without one, each score_model's `model` folder must hold a saved model,
    which is loaded when it first grades. `python_seconds` is each python grader's time per sample.
    """
    at = f"{key}." if key else ""
    if isinstance(spec, StringCheckSpec):
        return StringCheckGrader(spec)
    if isinstance(spec, TextSimilaritySpec):
        return TextSimilarityGrader(spec)
    if isinstance(spec, PythonSpec):
        grader = PythonGrader(spec, seconds_per_sample=python_seconds)
        problem = grader.load_problem()
        if problem is not None:
            raise GraderFileError(
                f"{where}: {at}source: cannot run in the sandbox (standard library only, "
                f"{python_seconds:g} s): {problem}"
            )
        return grader
    if isinstance(spec, ScoreModelSpec):
        return ScoreModelGrader(spec, judge or _lazy_local_judge(spec.model, where, at))
    if isinstance(spec, MultiSpec):
        children = {
            name: build_grader(
                sub, where, judge=judge, python_seconds=python_seconds, key=f"{at}graders.{name}"
            )
            for name, sub in spec.graders.items()
        }
        return MultiGrader(spec.name, children, compile_formula(spec.calculate_output, children))
    raise TypeError(f"not a grader spec: {type(spec).__name__}")


def _lazy_local_judge(model: str, where: str, at: str) -> Judge:
    """A judge that loads the model folder on first use; the folder is checked now."""
    path = resolve_model_path(model)
    if not (path / "config.json").is_file():
        raise GraderFileError(
            f"{where}: {at}model: {model!r} is not a local model folder (no config.json at "
            f"{path.resolve()}); a score_model grader runs a model saved with save_pretrained"
        )
    return lambda conversations, params: local_judge(str(path.resolve()))(conversations, params)


def load_grader(
    path: str | Path,
    *,
    judge: Judge | None = None,
    python_seconds: float = DEFAULT_SECONDS_PER_SAMPLE,
) -> Grader:
    """Load, check and build the grader in a YAML or JSON file.

    GraderFileError names the file and the key of the first problem found.
    """
    spec = load_spec(path)
    return build_grader(spec, str(path), judge=judge, python_seconds=python_seconds)

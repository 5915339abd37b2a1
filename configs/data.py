"""Where the problems come from: the tiny world's families, general prompts, or files."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from configs.strict import Strict


class MathWorld(Strict):
    """Arithmetic chains: a start value and `min_steps` to `max_steps` operations."""

    n_train: int = Field(2000, ge=0)
    n_heldout: int = Field(200, ge=0)
    min_steps: int = Field(1, ge=1)
    max_steps: int = Field(3, ge=1)
    max_operand: int = Field(9, ge=2)

    @model_validator(mode="after")
    def _steps_ordered(self) -> MathWorld:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) exceeds max_steps ({self.max_steps})")
        return self


class CodeWorld(Strict):
    """Functions to write from a description: a chain of `min_ops` to `max_ops` operations on
    the argument, judged by `tests` hidden assert-style tests."""

    n_train: int = Field(600, ge=0)
    n_heldout: int = Field(300, ge=0)
    min_ops: int = Field(1, ge=1)
    max_ops: int = Field(3, ge=1)
    max_constant: int = Field(9, ge=1)
    tests: int = Field(3, ge=1, le=10)

    @model_validator(mode="after")
    def _ops_ordered(self) -> CodeWorld:
        if self.min_ops > self.max_ops:
            raise ValueError(f"min_ops ({self.min_ops}) exceeds max_ops ({self.max_ops})")
        return self


class LogicWorld(Strict):
    """Puzzles: reach a target from three numbers with + - * /, each number used once."""

    n_train: int = Field(600, ge=0)
    n_heldout: int = Field(300, ge=0)
    min_number: int = Field(1, ge=1)
    max_number: int = Field(9, ge=2)
    max_target: int = Field(100, ge=1)

    @model_validator(mode="after")
    def _numbers_ordered(self) -> LogicWorld:
        if self.min_number > self.max_number:
            raise ValueError(
                f"min_number ({self.min_number}) exceeds max_number ({self.max_number})"
            )
        return self


class WorldConfig(Strict):
    """The tiny world's generated problems, one section per family (null: no such problems)."""

    seed: int = 0
    second_script_share: float = Field(0.3, ge=0.0, le=1.0)
    math: MathWorld | None = MathWorld()
    code: CodeWorld | None = None
    logic: LogicWorld | None = None

    @model_validator(mode="after")
    def _some_problems(self) -> WorldConfig:
        families = [f for f in (self.math, self.code, self.logic) if f is not None]
        if not any(f.n_train for f in families) or not any(f.n_heldout for f in families):
            raise ValueError("the world needs training and held-out problems of some family")
        return self


GENERAL_KINDS = (
    "capitals",
    "reverse",
    "colour",
    "category",
    "repeat",
    "sort",
    "greeting",
    "one_word",
)
GENERAL_REJECTIONS = ("wrong", "verbose", "script", "no_tags", "repetition")


class GeneralConfig(Strict):
    """The general task sets: mixed-SFT rows, preference pairs, RL and evaluation prompts."""

    seed: int = 0
    n_sft: int = Field(600, ge=0)
    n_pairs_train: int = Field(2000, ge=1)
    n_pairs_heldout: int = Field(400, ge=1)
    n_eval_prompts: int = Field(100, ge=1)
    n_rl_prompts: int = Field(200, ge=0)
    second_script_share: float = Field(0.3, ge=0.0, le=1.0)
    heldout_share: float = Field(0.2, gt=0.0, lt=1.0, description="share of task keys held out")
    kinds: tuple[str, ...] = GENERAL_KINDS
    rejections: tuple[str, ...] = GENERAL_REJECTIONS

    @field_validator("kinds", "rejections")
    @classmethod
    def _known(cls, values: tuple[str, ...], info) -> tuple[str, ...]:
        known = GENERAL_KINDS if info.field_name == "kinds" else GENERAL_REJECTIONS
        unknown = sorted(set(values) - set(known))
        if unknown or not values:
            raise ValueError(f"unknown or no {info.field_name}: {unknown}; known: {list(known)}")
        return values


class FilesConfig(Strict):
    """Real problems: JSONL, a JSON array or Parquet with question and answer columns."""

    train_path: Path
    heldout_path: Path
    question_field: str = "question"
    answer_field: str = "answer"
    tests_field: str = Field(
        "tests",
        description="a code problem's tests: assert statements (MBPP's test_list) or stdin/stdout "
        "cases (a list of {input, output}, or APPS's input_output); a row with tests is a code "
        "problem, and needs no answer",
    )
    bad_rows: Literal["skip", "refuse"] = Field(
        "skip",
        description="malformed rows (missing or empty question or answer, wrong types, invalid "
        "UTF-8, over max_row_chars): skip and count them, or refuse the file naming the line",
    )
    max_row_chars: int = Field(
        20_000,
        ge=1,
        description="a row whose text read (question, answer, solution, tests) is longer is "
        "malformed; a data set's other columns do not count",
    )


class DataConfig(Strict):
    source: Literal["tiny", "files"] = "tiny"
    world: WorldConfig = WorldConfig()
    files: FilesConfig | None = None
    general: GeneralConfig | None = Field(
        GeneralConfig(), description="non-reasoning tasks and preference pairs; None: none"
    )

    @model_validator(mode="after")
    def _files_given(self) -> DataConfig:
        if self.source == "files" and self.files is None:
            raise ValueError(
                "source 'files' needs a 'files' section with train_path and heldout_path"
            )
        return self

"""The grader file schema: OpenAI's grader JSON keys, written as YAML (or JSON).

A file holds one grader object. Its `type` picks the schema:
- string_check: name, input, reference, operation (eq | ne | like | ilike)
- text_similarity: name, input, reference, evaluation_metric, pass_threshold?
- python: name, source (defines `grade(sample, item) -> float`), image_tag?, pass_threshold?
- score_model: name, model (a local folder), input (messages with role and content), range?,
  sampling_params?, pass_threshold?
- multi: name, graders (name -> grader), calculate_output (formula over those names)
Unknown keys are refused. Every error names the file and the key path (`graders.exact.operation`).
Templates are checked here; a python grader's source must parse and define `grade`; a multi
grader's formula must be allowed arithmetic over its graders' names.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from configs.profiles import ConfigError, read_yaml
from graders.formula import FUNCTIONS, FormulaError, compile_formula
from graders.similarity import METRICS, UNSUPPORTED_METRICS
from graders.templates import TemplateError, references

SUPPORTED_TYPES = ("string_check", "text_similarity", "python", "score_model", "multi")
UNSUPPORTED_TYPES = {
    "label_model": "a label_model grader needs structured output from a hosted model; "
    "use a score_model grader with a range instead",
    "endpoint": "an endpoint grader calls an external service, and this pipeline runs offline",
}


MAX_SOURCE_BYTES = 256 * 1024  # a python grader's source, as OpenAI caps it


class GraderFileError(ValueError):
    """A grader file that cannot be loaded; the message names the file and the key."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StringCheckSpec(_Spec):
    type: Literal["string_check"]
    name: str
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"]


class TextSimilaritySpec(_Spec):
    type: Literal["text_similarity"]
    name: str
    input: str
    reference: str
    evaluation_metric: str
    pass_threshold: float | None = None

    @field_validator("evaluation_metric")
    @classmethod
    def _supported(cls, metric: str, info) -> str:
        name = info.data.get("name", "?")
        if metric in UNSUPPORTED_METRICS:
            raise ValueError(
                f"grader {name!r}: evaluation_metric {metric!r} is not supported here: "
                f"{UNSUPPORTED_METRICS[metric]}"
            )
        if metric not in METRICS:
            raise ValueError(
                f"grader {name!r}: unknown evaluation_metric {metric!r}; known: {sorted(METRICS)}"
            )
        return metric


class PythonSpec(_Spec):
    type: Literal["python"]
    name: str
    source: str
    image_tag: str | None = Field(None, description="accepted for compatibility; not used")
    pass_threshold: float | None = None

    @field_validator("source")
    @classmethod
    def _defines_grade(cls, source: str) -> str:
        if len(source.encode()) > MAX_SOURCE_BYTES:
            raise ValueError(f"is over {MAX_SOURCE_BYTES // 1024} kB (OpenAI's limit too)")
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise ValueError(f"does not parse: {exc.msg} (line {exc.lineno})") from None
        grade = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "grade"]
        if not grade:
            raise ValueError("defines no top-level function grade(sample, item)")
        args = grade[-1].args
        required = len(args.posonlyargs) + len(args.args) - len(args.defaults)
        takes = len(args.posonlyargs) + len(args.args)
        if (
            (takes < 2 and args.vararg is None)
            or required > 2
            or any(d is None for d in args.kw_defaults)
        ):
            raise ValueError("grade() must take two arguments: sample and item (exactly two)")
        return source


class MessageSpec(_Spec):
    role: Literal["system", "developer", "user", "assistant"]
    content: str
    type: Literal["message"] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_part(cls, content: Any) -> Any:
        """OpenAI's text parts ({"type": "input_text" | "output_text", "text": ...}, alone or in
        a list) are text: take their text. Image and audio parts are refused by name."""
        parts = content if isinstance(content, list) else [content]
        if not all(isinstance(p, dict) for p in parts):
            return content
        texts = []
        for part in parts:
            if part.get("type") not in ("input_text", "output_text") or set(part) != {
                "type",
                "text",
            }:
                raise ValueError(
                    f"content part of type {part.get('type')!r} is not supported here: "
                    "only text (a string, or input_text / output_text parts)"
                )
            texts.append(part["text"])
        return "\n".join(texts) if all(isinstance(t, str) for t in texts) else content


class SamplingParamsSpec(_Spec):
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    max_completions_tokens: int | None = Field(None, ge=1)
    reasoning_effort: str | None = Field(None, description="accepted for compatibility; not used")


class ScoreModelSpec(_Spec):
    type: Literal["score_model"]
    name: str
    model: str = Field(description="a local model folder (absolute, or relative to the cwd)")
    input: list[MessageSpec] = Field(min_length=1)
    range: tuple[float, float] = (0.0, 1.0)
    sampling_params: SamplingParamsSpec | None = None
    pass_threshold: float | None = None

    @field_validator("range")
    @classmethod
    def _ordered(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        if bounds[0] >= bounds[1]:
            raise ValueError(f"range {list(bounds)} is empty: the low end must be below the high")
        return bounds


class MultiSpec(_Spec):
    type: Literal["multi"]
    name: str
    graders: dict[str, GraderSpec] = Field(min_length=1)
    calculate_output: str


GraderSpec = Annotated[
    StringCheckSpec | TextSimilaritySpec | PythonSpec | ScoreModelSpec | MultiSpec,
    Field(discriminator="type"),
]
MultiSpec.model_rebuild()
_MODELS: dict[str, type[_Spec]] = {
    "string_check": StringCheckSpec,
    "text_similarity": TextSimilaritySpec,
    "python": PythonSpec,
    "score_model": ScoreModelSpec,
    "multi": MultiSpec,
}


MAX_FILE_BYTES = 1 << 20  # a grader file is a few KB


def read_file(path: Path) -> Any:
    """The raw object in a grader file (JSON for `.json`, else YAML)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise GraderFileError(
                f"{path}: the grader file is {size} bytes; at most {MAX_FILE_BYTES}"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GraderFileError(f"{path}: cannot read the grader file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise GraderFileError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the file as UTF-8"
        ) from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:  # a key given twice is refused, as in a profile: which one was meant is unknown
        if path.suffix == ".json":
            return json.loads(text, object_pairs_hook=_unique_keys)
        return read_yaml(text, str(path))
    except ConfigError as exc:
        raise GraderFileError(str(exc)) from None
    except ValueError as exc:
        raise GraderFileError(f"{path}: not valid {kind}: {exc}") from None
    except RecursionError:
        raise GraderFileError(f"{path}: not valid {kind}: nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"key {twice[0]!r} given twice in one object")
    return dict(pairs)


def parse_spec(raw: Any, where: str, key: str = "") -> GraderSpec:
    """Validate one grader object; errors read `<where>: <key>: <message>`."""
    at = f"{key}." if key else ""
    if not isinstance(raw, dict):
        raise GraderFileError(f"{where}: {key or 'top level'}: a grader is a mapping of keys")
    kind = raw.get("type")
    if not isinstance(kind, str):
        found = "missing" if kind is None else f"a {type(kind).__name__}, not a name"
        raise GraderFileError(f"{where}: {at}type: {found}; known: {list(SUPPORTED_TYPES)}")
    if "name" not in raw:  # OpenAI's guide shows python and multi graders without one
        raw = {**raw, "name": key.rsplit(".", 1)[-1] if key else Path(where).stem}
    if kind in UNSUPPORTED_TYPES:
        raise GraderFileError(
            f"{where}: {at}type: {kind!r} is not supported: {UNSUPPORTED_TYPES[kind]}"
        )
    if kind not in _MODELS:
        raise GraderFileError(
            f"{where}: {at}type: {kind!r} is not a grader type; known: {list(SUPPORTED_TYPES)}"
        )
    if kind == "multi":
        return _parse_multi(raw, where, at)
    try:
        spec = _MODELS[kind].model_validate(raw)
    except ValidationError as exc:
        raise GraderFileError(_first_error(exc, where, at)) from None
    _check_templates(spec, where, at)
    return spec


def _parse_multi(raw: dict, where: str, at: str) -> MultiSpec:
    subs = raw.get("graders")
    if not isinstance(subs, dict) or not subs:
        raise GraderFileError(f"{where}: {at}graders: a mapping of name -> grader is needed")
    for name in subs:
        if not isinstance(name, str) or not name.isidentifier() or name in FUNCTIONS:
            raise GraderFileError(
                f"{where}: {at}graders.{name}: a grader's key must be a plain name usable in "
                f"calculate_output (letters, digits, _; not one of {list(FUNCTIONS)})"
            )
    parsed = {name: parse_spec(sub, where, f"{at}graders.{name}") for name, sub in subs.items()}
    try:
        spec = MultiSpec.model_validate({**raw, "graders": parsed})
    except ValidationError as exc:
        raise GraderFileError(_first_error(exc, where, at)) from None
    try:
        compile_formula(spec.calculate_output, spec.graders)
    except FormulaError as exc:
        raise GraderFileError(f"{where}: {at}calculate_output: {exc}") from None
    return spec


def _first_error(exc: ValidationError, where: str, at: str) -> str:
    error = exc.errors()[0]
    key = ".".join(str(p) for p in error["loc"]) or "top level"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key (not in the grader schema)"
    return f"{where}: {at}{key}: {message}"


def template_fields(spec: _Spec) -> list[tuple[str, str]]:
    """A grader's templates by key (`input`, `reference`, `input.0.content`); none for a multi
    grader's own keys or a python grader."""
    if isinstance(spec, StringCheckSpec | TextSimilaritySpec):
        return [("input", spec.input), ("reference", spec.reference)]
    if isinstance(spec, ScoreModelSpec):
        return [(f"input.{i}.content", m.content) for i, m in enumerate(spec.input)]
    return []


def judge_models(spec: GraderSpec) -> list[str]:
    """The `model` of every score_model grader in `spec`, a multi grader's included."""
    if isinstance(spec, ScoreModelSpec):
        return [spec.model]
    if isinstance(spec, MultiSpec):
        return [model for sub in spec.graders.values() for model in judge_models(sub)]
    return []


def _check_templates(spec: _Spec, where: str, at: str) -> None:
    for key, template in template_fields(spec):
        try:
            references(template)
        except TemplateError as exc:
            raise GraderFileError(f"{where}: {at}{key}: {exc}") from None


def load_spec(path: str | Path) -> GraderSpec:
    """The validated grader in a file; GraderFileError names the file and the bad key."""
    path = Path(path)
    return parse_spec(read_file(path), str(path))

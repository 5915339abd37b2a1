"""`{{item.*}}` and `{{sample.*}}` references in grader strings: checked at load, filled per sample.

A reference is a namespace (`item` or `sample`) followed by a path of `.name`, `.0` or `[0]`
steps, so `{{ item.meta.tags[0] }}` reads `item["meta"]["tags"][0]`. The `sample` namespace
holds `output_text` (the whole completion), `output_json` (the completion parsed as JSON, when it
is JSON) and `answer_text` (this project's addition: the text of the one `<answer>` block, or ""
when there is none). The fields of `item` depend on the dataset, so a missing one can
only be found when grading.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NAMESPACES = ("item", "sample")
# sample fields and whether a path may continue below them
SAMPLE_FIELDS: dict[str, bool] = {"output_text": False, "answer_text": False, "output_json": True}

_REFERENCE = re.compile(r"\{\{\s*(.*?)\s*\}\}", re.DOTALL)
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_\-]*)|\.(\d+)|\[(\d+)\]")


class TemplateError(ValueError):
    """A reference that is malformed, names something unknown, or finds nothing to fill in."""


class SampleTemplateError(TemplateError):
    """A `sample` reference the completion does not fill (not JSON, a missing key, null): the
    completion's fault, so it fails the sample (scores 0, as OpenAI's parse errors do) rather
    than leaving it unscored."""


@dataclass(frozen=True)
class Reference:
    """One `{{ namespace.path }}` reference."""

    text: str
    namespace: str
    path: tuple[str, ...]


def parse_reference(text: str) -> Reference:
    """The reference inside `{{ }}`; TemplateError when it is not `item.x` or a known `sample.x`."""
    head, _, rest = text.partition(".")
    head = head.split("[", 1)[0]
    if head not in NAMESPACES:
        raise TemplateError(
            f"template reference {{{{{text}}}}}: namespace {head!r} is unknown; use item or sample"
        )
    tail = text[len(head) :]
    path: list[str] = []
    pos = 0
    while pos < len(tail):
        match = _STEP.match(tail, pos)
        if match is None:
            raise TemplateError(
                f"template reference {{{{{text}}}}}: cannot read the path at {tail[pos:]!r}"
            )
        path.append(next(g for g in match.groups() if g is not None))
        pos = match.end()
    if not path:
        raise TemplateError(
            f"template reference {{{{{text}}}}}: name a field, e.g. {{{{{head}.answer}}}}"
        )
    if head == "sample":
        _check_sample_path(text, path)
    return Reference(text=text, namespace=head, path=tuple(path))


def _check_sample_path(text: str, path: list[str]) -> None:
    field = path[0]
    if field not in SAMPLE_FIELDS:
        raise TemplateError(
            f"template reference {{{{{text}}}}}: sample.{field} is not supported; "
            f"known: {['sample.' + f for f in SAMPLE_FIELDS]}"
        )
    if len(path) > 1 and not SAMPLE_FIELDS[field]:
        raise TemplateError(f"template reference {{{{{text}}}}}: sample.{field} is text")


def references(template: str) -> list[Reference]:
    """Every reference in `template`, each checked (TemplateError on the first bad one)."""
    return [parse_reference(m.group(1)) for m in _REFERENCE.finditer(template)]


def lookup(reference: Reference, sample: Mapping[str, Any], item: Mapping[str, Any]) -> Any:
    """The value a reference points at; TemplateError when the path finds nothing."""
    value: Any = item if reference.namespace == "item" else sample
    walked = reference.namespace
    try:
        for step in reference.path:
            value = _step_into(value, step, walked, reference)
            walked += f".{step}"
        if value is None:
            raise TemplateError(f"{{{{{reference.text}}}}}: {walked} is empty (null)")
        if value == "" and reference.namespace == "item":  # no gold to grade against
            raise TemplateError(f"{{{{{reference.text}}}}}: {walked} is empty text")
    except TemplateError as exc:
        if reference.namespace == "sample":
            raise SampleTemplateError(str(exc)) from None
        raise
    return value


def _step_into(value: Any, step: str, walked: str, reference: Reference) -> Any:
    if isinstance(value, Mapping):
        if step in value:
            return value[step]
        keys = sorted(map(str, value))[:20]
        raise TemplateError(f"{{{{{reference.text}}}}}: {walked} has no {step!r}; it has {keys}")
    if isinstance(value, list | tuple) and step.isdigit():
        if int(step) < len(value):
            return value[int(step)]
        raise TemplateError(f"{{{{{reference.text}}}}}: {walked} has {len(value)} elements")
    raise TemplateError(
        f"{{{{{reference.text}}}}}: {walked} is a {type(value).__name__}, cannot read {step!r}"
    )


def as_text(value: Any) -> str:
    """How a value is written into a template: text as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def render(template: str, sample: Mapping[str, Any], item: Mapping[str, Any]) -> str:
    """`template` with every reference filled in; TemplateError when one cannot be."""

    def fill(match: re.Match[str]) -> str:
        return as_text(lookup(parse_reference(match.group(1)), sample, item))

    return _REFERENCE.sub(fill, template)

"""Cold-start filters, applied in order; each counts the traces it removed.

DeepSeek-R1 keeps cold-start traces that are well formatted, readable (a summary at the end, no
degenerate repetition), in one language, correct, of bounded length, and not duplicated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from configs.supervised import FilterConfig
from contracts.answer_format import answer_block, is_well_formed
from curation.teacher import Trace
from rewards.language import language_consistency
from rewards.verifiers import grade_all

_WORD = re.compile(r"\S+")


def distinct_trigram_share(text: str) -> float:
    """Distinct word trigrams over all trigrams: 1.0 for varied text, low for repetition loops."""
    words = _WORD.findall(text)
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) / len(grams) if grams else 1.0


def is_readable(completion: str, spec: FilterConfig) -> bool:
    summary = answer_block(completion) or ""
    return (
        len(_WORD.findall(summary)) >= spec.min_summary_words
        and distinct_trigram_share(completion) >= spec.min_distinct_trigrams
    )


def normalized(completion: str) -> str:
    return " ".join(completion.split()).lower()


@dataclass(frozen=True)
class FilterResult:
    kept: list[Trace]
    removed: list[tuple[Trace, str]]  # (trace, name of the filter that removed it)
    counts: dict[str, int]  # filter name -> traces it removed, in filter order


TraceCheck = Callable[[Trace], bool]


@dataclass(frozen=True)
class ExampleBound:
    """The SFT stage's `max_length` and how many tokens a trace takes there, prompt included:
    a trace longer than that would be cut, so the length filter removes it."""

    max_tokens: int
    tokens: Callable[[Trace], int]


def build_checks(
    spec: FilterConfig,
    count_tokens: Callable[[str], int],
    correct: Callable[[Trace], bool],
    example: ExampleBound | None = None,
) -> list[tuple[str, TraceCheck]]:
    """The per-trace filters in the order they apply; deduplication runs after them."""

    def length(t: Trace) -> bool:
        if not spec.min_tokens <= count_tokens(t.completion) <= spec.max_tokens:
            return False
        return example is None or example.tokens(t) <= example.max_tokens

    return [
        ("format", lambda t: is_well_formed(t.completion)),
        (
            "language",
            lambda t: language_consistency(t.completion, t.language) >= spec.min_language_share,
        ),
        ("length", length),
        ("readability", lambda t: is_readable(t.completion, spec)),
        ("correctness", correct),
    ]


def apply_filters(
    traces: Sequence[Trace],
    spec: FilterConfig,
    count_tokens: Callable[[str], int],
    example: ExampleBound | None = None,
) -> FilterResult:
    grades = grade_all(traces, [t.completion for t in traces])  # code: one sandbox session
    verdicts = {id(t): g.correct is True for t, g in zip(traces, grades, strict=True)}
    checks = build_checks(spec, count_tokens, lambda t: verdicts[id(t)], example)
    counts = {name: 0 for name, _ in checks} | {"duplicates": 0}
    kept: list[Trace] = []
    removed: list[tuple[Trace, str]] = []
    seen: set[tuple[str, str]] = set()
    for trace in traces:
        failed = next((name for name, check in checks if not check(trace)), None)
        if failed is None:
            identity = (trace.problem_id, normalized(trace.completion))
            failed = "duplicates" if identity in seen else None
            seen.add(identity)
        if failed is None:
            kept.append(trace)
        else:
            counts[failed] += 1
            removed.append((trace, failed))
    return FilterResult(kept, removed, counts)

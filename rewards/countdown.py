"""The logic family's verifier: does the stated expression reach the target from the numbers?

The expression is the last arithmetic expression (numbers, + - * / and brackets, at least one
operation) of the completion's one answer block (strict) or, leniently, of the whole completion
when it has no answer block. It is parsed as arithmetic only (no names, calls or powers) and
evaluated exactly, with fractions; it counts when it uses exactly the given numbers, each once,
and equals the target. A division by zero, an unparsable or over-long expression, or numbers used
twice or not at all are wrong, never unscorable.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from contracts.answer_format import answer_block

MAX_EXPRESSION_CHARS = 200
_SPAN = re.compile(r"[0-9(][0-9+\-*/×÷() \t]*")
_OPERATION = re.compile(r"[+\-*/×÷]")
_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def last_expression(text: str) -> str | None:
    """The last stretch of `text` that is arithmetic with at least one operation, trimmed of
    unbalanced brackets and a trailing operator."""
    spans = [m.group(0).strip() for m in _SPAN.finditer(text)]
    for span in reversed(spans):
        span = span.rstrip("+-*/×÷ \t")
        while span.count("(") > span.count(")") and span.startswith("("):
            span = span[1:].lstrip()
        while span.count(")") > span.count("(") and span.endswith(")"):
            span = span[:-1].rstrip()
        if _OPERATION.search(span) and any(ch.isdigit() for ch in span):
            return span
    return None


def evaluate(expression: str) -> tuple[Fraction, list[int]] | None:
    """(exact value, the numbers it uses) of an arithmetic expression, None when it is not one
    (or divides by zero)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return None
    source = expression.replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(source, mode="eval")
        used: list[int] = []
        return _value(tree.body, used), used
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _value(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, used), _value(node.right, used)
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"not arithmetic: {type(node).__name__}")


def reaches(expression: str | None, numbers: Sequence[int], target: str) -> bool:
    """Whether `expression` uses exactly `numbers` (each once) and equals `target`."""
    if expression is None:
        return False
    result = evaluate(expression)
    if result is None:
        return False
    value, used = result
    try:
        goal = Fraction(target.strip())
    except (ValueError, ZeroDivisionError):
        return False
    return Counter(used) == Counter(numbers) and value == goal


def stated_expression(completion: str, strict: bool = True) -> str | None:
    """The expression a completion states: from its answer block, or (lenient) from the whole
    completion when it has none."""
    block = answer_block(completion)
    if block is None and strict:
        return None
    return last_expression(block if block is not None else completion)


def countdown_reward(
    prompts: list[str],
    completions: list[str],
    numbers: list[Sequence[int]],
    answer: list[str],
    strict: bool = True,
    **_: object,
) -> list[float | None]:
    """1 when the stated expression reaches the target from the numbers, else 0."""
    return [
        float(reaches(stated_expression(c, strict), nums, target))
        for c, nums, target in zip(completions, numbers, answer, strict=True)
    ]

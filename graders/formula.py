"""The multi grader's `calculate_output`: a safe arithmetic formula over sub-grader names.

The formula is parsed with Python's `ast` and checked node by node before it is ever evaluated:
numbers, names of the multi grader's sub-graders, `+ - * /`, `^` or `**` for powers, unary
signs, parentheses, and calls to min, max, abs, sqrt, log, exp, floor and ceil. Anything else
(attribute access, subscripts, lambdas, comprehensions, strings, keyword arguments, calls to
other names) is refused with a message saying what was found. Evaluation is over floats;
a domain error (log of 0, division by 0) or an overflow is a FormulaError, never a crash.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

MAX_LENGTH = 1000
MAX_DEPTH = 50  # nesting of the formula's tree; evaluation recurses once per level

FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "sqrt": math.sqrt,
    "log": math.log,
    "exp": math.exp,
    "floor": math.floor,
    "ceil": math.ceil,
}
_VARIADIC = {"min", "max"}

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: math.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_ALLOWED = "numbers, grader names, + - * / ^ (or **), parentheses and " + ", ".join(FUNCTIONS)


class FormulaError(ValueError):
    """A formula that is not allowed, names an unknown grader, or cannot be evaluated."""


@dataclass(frozen=True)
class Formula:
    """A checked formula and the grader names it reads."""

    text: str
    tree: ast.Expression
    names: frozenset[str]


def compile_formula(text: str, known: Iterable[str]) -> Formula:
    """Parse and check `text`; FormulaError says what is not allowed and where."""
    known = set(known)
    if len(text) > MAX_LENGTH:
        raise FormulaError(f"formula is {len(text)} characters long; at most {MAX_LENGTH}")
    try:
        tree = ast.parse(text.replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise FormulaError(f"formula {text!r} is not valid arithmetic: {exc.msg}") from None
    except RecursionError:
        raise FormulaError(f"formula is nested too deeply; at most {MAX_DEPTH} levels") from None
    if _depth(tree.body) > MAX_DEPTH:
        raise FormulaError(f"formula {text!r} is nested too deeply; at most {MAX_DEPTH} levels")
    names: set[str] = set()
    for node in ast.walk(tree):
        _check_node(node, text, known, names)
    return Formula(text=text, tree=tree, names=frozenset(names))


def _depth(root: ast.AST) -> int:
    deepest, todo = 0, [(root, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        todo += [(child, depth + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def _check_node(node: ast.AST, text: str, known: set[str], names: set[str]) -> None:
    if isinstance(node, ast.Expression | ast.Load):
        return
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        table = _BINARY if isinstance(node, ast.BinOp) else _UNARY
        if type(node.op) not in table:
            raise FormulaError(
                f"formula {text!r}: operator {type(node.op).__name__} is not allowed"
            )
        return
    if isinstance(node, ast.operator | ast.unaryop):
        return  # checked with its BinOp / UnaryOp
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise FormulaError(f"formula {text!r}: constant {node.value!r} is not a number")
        try:
            finite = math.isfinite(float(node.value))
        except OverflowError:
            finite = False
        if not finite:
            raise FormulaError(f"formula {text!r}: a constant is too large for a float")
        return
    if isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            return  # a call's function, checked with the call
        if node.id not in known:
            raise FormulaError(
                f"formula {text!r}: unknown name {node.id!r}; the graders are {sorted(known)}"
            )
        names.add(node.id)
        return
    if isinstance(node, ast.Call):
        _check_call(node, text)
        return
    raise FormulaError(f"formula {text!r}: {_describe(node)} is not allowed; only {_ALLOWED}")


def _check_call(node: ast.Call, text: str) -> None:
    if not isinstance(node.func, ast.Name):
        raise FormulaError(f"formula {text!r}: {_describe(node.func)} is not allowed")
    if node.func.id not in FUNCTIONS:
        raise FormulaError(
            f"formula {text!r}: calling {node.func.id!r} is not allowed; "
            f"functions: {list(FUNCTIONS)}"
        )
    name = node.func.id
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        raise FormulaError(f"formula {text!r}: {name}() takes plain positional arguments")
    if name in _VARIADIC and not node.args:
        raise FormulaError(f"formula {text!r}: {name}() needs at least one argument")
    if name not in _VARIADIC and len(node.args) != 1:
        raise FormulaError(f"formula {text!r}: {name}() takes one argument")


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"attribute access '.{node.attr}'"
    if isinstance(node, ast.Lambda):
        return "a lambda"
    return f"a {type(node).__name__} expression"


def evaluate(formula: Formula, values: Mapping[str, float]) -> float:
    """The formula's value with each grader name bound to its score."""
    try:
        result = float(_eval(formula.tree.body, values))
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise FormulaError(f"formula {formula.text!r} failed: {exc}") from None
    if not math.isfinite(result):
        raise FormulaError(f"formula {formula.text!r} gave {result}")
    return result


def _eval(node: ast.expr, values: Mapping[str, float]) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return float(values[node.id])
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, values))
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, values), _eval(node.right, values))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = [_eval(a, values) for a in node.args]
        if node.func.id in _VARIADIC:  # min(a) is a: Python's min wants an iterable
            return float(FUNCTIONS[node.func.id](args))
        return float(FUNCTIONS[node.func.id](*args))
    raise FormulaError(f"{_describe(node)} is not allowed")  # unreachable after compile_formula

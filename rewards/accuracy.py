"""Answer checking with math-verify, shared by evaluation, curation and the RL rewards.

Strict (the default, what training rewards use): the answer is read only from the completion's
one `<answer>` block, where the format says it stands; a completion without exactly one such
block has no answer, whatever numbers it holds. Lenient (`strict=False`, reported beside the
strict figure by evaluation, for bases that never learned the format): the answer block when
there is one, else the whole completion's last answer-like expression. GSM8K `#### 42` and MATH
`\\boxed{42}` endings are honoured on both sides.

An answer whose value would take math-verify unbounded time or memory to compare (a power tower,
the factorial of a huge number) is wrong, not a hang: outside the main thread math-verify has no
timeout.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import sympy
from math_verify import parse, verify

from contracts.answer_format import answer_block
from problems.answers import boxed_contents, final_answer_text
from problems.types import Problem

# math-verify enforces its timeouts with SIGALRM, which only the main thread may use; elsewhere
# (Prefect runs tasks in worker threads) the timeouts are off and it says so on every call.
logging.getLogger("math_verify").setLevel(logging.ERROR)
log = logging.getLogger(__name__)

_TIMEOUT_S = 5
MAX_ANSWER_CHARS = 4000  # the tail of a longer answer text is parsed
MAX_DIGITS = 10_000  # a number (or a power's value) with more digits is too costly to compare
MAX_FACTORIAL = 10_000


def _timeout() -> int | None:
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


# What tells a bare answer's LaTeX from prose: math-verify reads LaTeX only between delimiters
# (`$...$`, `\\(...\\)`, `\\boxed{}`) and otherwise searches the text for a plain expression,
# which takes `5\\sqrt{3}` for 5, `(5, -1)` for -1 and `\\dfrac{3}{4}` for nothing.
_DELIMITED = ("$", "\\(", "\\[", "\\boxed", "\\fbox")
_LATEX_WORDS = re.compile(
    r"\\(?:text\w*|mathrm|mbox|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+"
)  # a command's name, and what `\\text{...}` holds, are not prose
_PROSE = re.compile(r"[A-Za-z]{2,}")
_MARKUP = re.compile(r"[\\{}^_()\[\]]|(?<![A-Za-z])[A-Za-z](?![A-Za-z])")
_FULL_WIDTH = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)} | {0x3000: " "}
_CJK_BESIDE_ASCII = re.compile(
    r"(?<=[\u3000-\u9fff\uff00-\uffef])(?=[\x21-\x7e])|(?<=[\x21-\x7e])(?=[\u3000-\u9fff])"
)


def readable(text: str) -> str:
    """`text` as math-verify reads it best: a bare answer in LaTeX (no delimiters, no prose, some
    markup: `5\\sqrt{3}`, `(3, -1)`, `x = 72`, `\\text{(C)}`) between `$` signs; a currency
    sign's escaped dollar (`\\$1,600`) dropped; full-width characters as their ASCII forms, and
    a CJK character apart from an ASCII one beside it (`答案是8`). Plain numbers and arithmetic
    (`1 600`, `12,5`, `42+1`) and prose are left to math-verify's own search."""
    text = text.replace("\\$", " ").translate(_FULL_WIDTH)
    text = _CJK_BESIDE_ASCII.sub(" ", text).strip()
    if any(mark in text for mark in _DELIMITED):
        return text
    if _PROSE.search(_LATEX_WORDS.sub(" ", text)) or not _MARKUP.search(text):
        return text
    return f"${text.rstrip(' .')}$"


@lru_cache(maxsize=65536)
def _parse(text: str) -> tuple:
    return tuple(parse(readable(text[-MAX_ANSWER_CHARS:]), parsing_timeout=_timeout()))


@dataclass(frozen=True)
class Grade:
    """What a completion answered (`answer`, None when nothing parsed) and whether it is right.

    `correct` is None when the gold answer itself cannot be parsed: the sample cannot be verified.
    """

    answer: str | None
    correct: bool | None


def gold_is_verifiable(gold: str) -> bool:
    return bool(_parse(final_answer_text(gold)))


def answer_text(completion: str, strict: bool = True) -> str | None:
    """The text the answer is read from: the answer block, or (lenient) the whole completion."""
    block = answer_block(completion)
    if block is not None or strict:
        return block
    return completion


def grade(completion: str, gold: str, strict: bool = True) -> Grade:
    gold_parsed = _parse(final_answer_text(gold))
    if not gold_parsed:
        return Grade(None, None)
    text = answer_text(completion, strict)
    if strict and text is not None and len(set(boxed_contents(text))) > 1:
        return Grade(None, False)  # boxes that differ are a hedge, as two answer blocks are
    try:  # whatever a completion makes the checker do, it is not paid for it, nor made unscorable
        pred_parsed = _parse(final_answer_text(text)) if text is not None else ()
        answer = str(pred_parsed[-1]) if pred_parsed else None
        if not pred_parsed or any(too_costly(p) for p in pred_parsed):
            return Grade(answer, False)
        right = verify(list(gold_parsed), list(pred_parsed), timeout_seconds=_timeout())
    except Exception:  # noqa: BLE001 - e.g. math-verify's timeout in the main thread
        return Grade(None, False)
    return Grade(answer, bool(right))


def too_costly(parsed: object) -> bool:
    """Whether comparing this parsed answer could run away: a power, factorial or binomial whose
    value has more than MAX_DIGITS digits."""
    if not isinstance(parsed, sympy.Basic):
        return False
    for node in sympy.preorder_traversal(parsed):
        if node.is_Pow and node.base.is_number and node.exp.is_number:
            if _digits(node.base, node.exp) > MAX_DIGITS:
                return True
        elif isinstance(
            node, sympy.factorial | sympy.binomial | sympy.gamma | sympy.RisingFactorial
        ):
            if any(a.is_number and not _small(a) for a in node.args):
                return True
        elif node.is_Integer and len(str(abs(int(node)))) > MAX_DIGITS:
            return True
    return False


def _digits(base: sympy.Expr, exp: sympy.Expr) -> float:
    try:
        size = abs(complex(base))
        power = abs(complex(exp))
    except (TypeError, ValueError, OverflowError):
        return math.inf
    if size <= 1 or power == 0:
        return 0.0
    return power * math.log10(size)


def _small(value: sympy.Expr) -> bool:
    try:
        return abs(complex(value)) <= MAX_FACTORIAL
    except (TypeError, ValueError, OverflowError):
        return False


def accuracy_reward(
    prompts: list[str], completions: list[str], answer: list[str], strict: bool = True, **_: object
) -> list[float | None]:
    """1 for a correct answer where the format puts it (strict), 0 for a wrong or missing one,
    None if the gold answer is unparseable."""
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        correct = grade(completion, gold, strict).correct
        rewards.append(None if correct is None else float(correct))
    return rewards


def verifiable(problem: Problem) -> bool:
    """Whether the problem's verifier can judge an answer to it (a math gold answer parses)."""
    return problem.family != "math" or gold_is_verifiable(problem.answer)


def verifiable_problems(problems: Iterable[Problem], where: str) -> list[Problem]:
    """The problems a verifier can judge; any it cannot are left out, and said so with how many
    and the first, so that a figure over the rest is not read as over all."""
    kept, left_out = [], []
    for problem in problems:
        (kept if verifiable(problem) else left_out).append(problem)
    if left_out:
        first = left_out[0]
        log.warning(
            "%s: %d of %d problems left out, their gold answers unreadable by the verifier "
            "(first: %s, answer %r)",
            where, len(left_out), len(kept) + len(left_out), first.id, first.answer[:80],
        )  # fmt: skip
    return kept

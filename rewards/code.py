"""Code-execution reward: the completion's Python runs against test cases in the sandbox.

The code is the last ```python fenced block (else the last fenced block) of the `<answer>` block,
or of the whole completion when the answer block has none. Each sample's `tests` is a list of
test cases, or that list as JSON text; a test case is either

- `{"input": "...", "output": "..."}`: the program reads `input` on stdin and passes when it exits
  0 and its stdout equals `output` (trailing whitespace on each line and trailing blank lines
  ignored), or
- `{"code": "assert f(2) == 4"}`: the test code is appended to the program, which passes when it
  exits 0.

A str that is not JSON is taken as one `{"code": ...}` test. Every test case runs in its own
sandbox run (sandbox.run_python). The reward is the fraction of test cases passed; 0.0 when no code
could be extracted; None when a sample has no test cases or the sandbox itself failed (the sample
cannot be verified).
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rewards.format import answer_block
from sandbox import Limits, SandboxResult, run_python

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str | None:
    """The Python program in a completion, or None when it has no fenced code block."""
    block = answer_block(completion)
    for text in (block, completion):
        if not text:
            continue
        fences = _FENCE.findall(text)
        if not fences:
            continue
        python = [body for lang, body in fences if lang.lower() in ("python", "py", "python3")]
        code = (python or [body for _, body in fences])[-1]
        if code.strip():
            return code
    return None


def parse_tests(tests: Any) -> list[dict[str, str]]:
    """One sample's test cases from a list of dicts, its JSON text, or a bare assert-style str."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except ValueError:
            return [{"code": tests}] if tests.strip() else []
    if isinstance(tests, dict):
        tests = [tests]
    if not isinstance(tests, list):
        raise ValueError(f"test cases must be a list, got {type(tests).__name__}")
    cases = []
    for case in tests:
        if isinstance(case, dict) and ("code" in case or "input" in case or "output" in case):
            cases.append({k: str(v) for k, v in case.items()})
        else:
            raise ValueError(f"not a test case: {case!r}")
    return cases


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


def run_case(code: str, case: dict[str, str], limits: Limits) -> bool | None:
    """Whether the program passes one test case; None when the sandbox failed."""
    if "code" in case:
        result = run_python(code + "\n\n" + case["code"] + "\n", limits=limits)
    else:
        result = run_python(code, stdin=case.get("input", ""), limits=limits)
    return _passed(result, case)


def _passed(result: SandboxResult, case: dict[str, str]) -> bool | None:
    if result.status == "sandbox_failed":
        return None
    if result.status != "ok":
        return False
    return "code" in case or _normalise(result.stdout) == _normalise(case.get("output", ""))


def _cases_or_none(tests: Any) -> list[dict[str, str]] | None:
    try:
        return parse_tests(tests) or None
    except ValueError:
        return None


def code_reward(
    prompts: list[str],
    completions: list[str],
    tests: list[list[dict]] | list[str],
    *,
    cpu_seconds: float = 2.0,
    wall_seconds: float = 5.0,
    memory_mb: int = 256,
    workers: int | None = None,
    **_: object,
) -> list[float | None]:
    """Fraction of each sample's test cases its code passes; None when it cannot be verified."""
    limits = Limits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb)
    samples = [
        (extract_code(completion), _cases_or_none(sample_tests))
        for completion, sample_tests in zip(completions, tests, strict=True)
    ]
    jobs = [
        (i, code, case)
        for i, (code, cases) in enumerate(samples)
        if code is not None and cases is not None
        for case in cases
    ]
    outcomes: dict[int, list[bool | None]] = {i: [] for i, _, _ in jobs}
    # Every (sample, test case) run side by side, `workers` at a time (default: one per core).
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        results = pool.map(lambda job: run_case(job[1], job[2], limits), jobs)
        for (i, _, _), passed in zip(jobs, results, strict=True):
            outcomes[i].append(passed)
    rewards: list[float | None] = []
    for i, (code, cases) in enumerate(samples):
        if cases is None:
            rewards.append(None)
        elif code is None:
            rewards.append(0.0)
        elif any(o is None for o in outcomes[i]):
            rewards.append(None)
        else:
            rewards.append(sum(bool(o) for o in outcomes[i]) / len(cases))
    return rewards

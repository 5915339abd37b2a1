"""Code-execution reward: the completion's Python against hidden test cases, in the sandbox.

The program is the last ```python fenced block (else the last fenced block) of the completion's
one `<answer>` block (`strict`, the default) or, with `strict=False`, of the whole completion
when it has no answer block. Each sample's `tests` is a list of test cases, or that list as JSON
text; a test case is either

- `{"input": "...", "output": "..."}`: the program reads `input` on stdin and passes when it
  exits 0 and its stdout equals `output` (trailing whitespace on each line and trailing blank
  lines ignored), or
- `{"code": "assert f(2) == 4"}`: an assert-style test. It runs in the sandbox's judge, never in
  the program's process: the program is loaded as a module, and each call the test makes crosses
  to its process and comes back as plain data; `==` compares type and value (sandbox/README.md).

A str that is not JSON is one `{"code": ...}` test. All of a sample's stdin cases run in one
confined process (a fresh `__main__` each), and all its assert tests in another.

The reward is the fraction of test cases passed. Every abnormal end (a signal, a limit, an early
exit, an exception) fails its case, with its reason counted (`pop_metrics`). 0.0 when there is
no code; None only when the sample cannot be judged: it has no test cases, or the sandbox could
not run one of them (counted, and logged).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from contracts.answer_format import answer_block
from sandbox import Job, Limits, SandboxResult, Verdict, run_jobs

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
UNJUDGEABLE = ("sandbox_failed", "unsupported", "bad_test")


def extract_code(completion: str, strict: bool = True) -> str | None:
    """The Python program in a completion, or None when it has none where it must stand."""
    block = answer_block(completion)
    texts = [block] if block is not None or strict else [completion]
    if not strict and block is not None:
        texts.append(completion)
    for text in texts:
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
        if isinstance(case, str):  # an assert-style test (MBPP's test_list), or a case's JSON
            cases.append(_case_json(case) or {"code": case})
        elif isinstance(case, dict) and ("code" in case or "input" in case or "output" in case):
            cases.append({k: str(v) for k, v in case.items()})
        else:
            raise ValueError(f"not a test case: {case!r}")
    return cases


def _case_json(text: str) -> dict[str, str] | None:
    """A stdin/stdout case kept as its JSON (`{"input": ..., "output": ...}`, as the problem
    loader keeps one), or None: an assert-style test is never a JSON object."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        case = json.loads(text)
    except ValueError:
        return None
    if isinstance(case, dict) and ("input" in case or "output" in case):
        return {k: str(v) for k, v in case.items()}
    return None


def is_python(source: str) -> bool:
    """Whether an assert-style test compiles (a test that does not is unjudgeable, not failed)."""
    try:
        compile(source, "<test>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def normalise_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


def stdio_verdict(result: SandboxResult, expected: str) -> Verdict:
    """A stdin/stdout case's verdict from its run."""
    if result.status == "sandbox_failed":
        return Verdict(None, "sandbox_failed", result.detail)
    if result.status != "ok":
        return Verdict(False, result.reason or result.status, result.detail)
    if normalise_output(result.stdout) != normalise_output(expected):
        return Verdict(False, "wrong_output")
    return Verdict(True, "passed")


@dataclass(frozen=True)
class _Sample:
    code: str | None
    stdio: list[dict[str, str]]
    asserts: list[str]
    bad_tests: bool = False  # a test that is not Python: the sample cannot be judged

    @property
    def cases(self) -> int:
        return len(self.stdio) + len(self.asserts)

    @property
    def judgeable(self) -> bool:
        return self.code is not None and not self.bad_tests


class CodeReward:
    """The code reward (`(prompts, completions, tests) -> list[float | None]`), counting the
    verdicts' reasons until `pop_metrics()` hands them over."""

    __name__ = "code"

    def __init__(
        self,
        cpu_seconds: float = 2.0,
        wall_seconds: float = 5.0,
        memory_mb: int = 256,
        workers: int | None = None,
        strict: bool = True,
    ):
        self.limits = Limits(
            cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_mb=memory_mb
        )
        self.workers = workers
        self.strict = strict
        self.counts: Counter[str] = Counter()

    def __call__(
        self, prompts: list[str], completions: list[str], tests: list[Any], **_: object
    ) -> list[float | None]:
        samples = [
            self._sample(completion, sample_tests)
            for completion, sample_tests in zip(completions, tests, strict=True)
        ]
        verdicts = self._judge(samples)
        rewards = [self._reward(s, v) for s, v in zip(samples, verdicts, strict=True)]
        self._log(verdicts, rewards)
        return rewards

    def _sample(self, completion: str, tests: Any) -> _Sample:
        try:
            cases = parse_tests(tests)
        except ValueError:
            cases = []
        stdio = [c for c in cases if "code" not in c]
        asserts = [c["code"] for c in cases if "code" in c]
        bad = not all(is_python(test) for test in asserts)
        return _Sample(extract_code(completion, self.strict), stdio, asserts, bad)

    def _judge(self, samples: list[_Sample]) -> list[list[Verdict]]:
        """Every judgeable sample's verdicts, from one sandbox session."""
        jobs: list[Job] = []
        for s in samples:
            if s.judgeable and s.stdio:
                inputs = tuple(c.get("input", "") for c in s.stdio)
                jobs.append(Job(s.code or "", inputs, limits=self.limits))
            if s.judgeable and s.asserts:
                jobs.append(Job(s.code or "", tests=tuple(s.asserts), limits=self.limits))
        outcomes = iter(run_jobs(jobs, self.workers))
        verdicts: list[list[Verdict]] = []
        for s in samples:
            mine: list[Verdict] = []
            if s.judgeable and s.stdio:
                runs = zip(next(outcomes), s.stdio, strict=True)
                mine += [stdio_verdict(run, case.get("output", "")) for run, case in runs]
            if s.judgeable and s.asserts:
                mine += next(outcomes)
            verdicts.append(mine)
        return verdicts

    def _reward(self, sample: _Sample, verdicts: list[Verdict]) -> float | None:
        if not sample.cases:
            self.counts["no_tests"] += 1
            return None
        if sample.bad_tests:
            self.counts["bad_test"] += 1
            return None
        if sample.code is None:
            self.counts["no_code"] += 1
            return 0.0
        self.counts.update(v.reason for v in verdicts)
        if any(v.passed is None for v in verdicts):
            self.counts["unscorable"] += 1
            return None
        return sum(v.passed is True for v in verdicts) / sample.cases

    def _log(self, verdicts: list[list[Verdict]], rewards: list[float | None]) -> None:
        failed = [v for vs in verdicts for v in vs if v.passed is None]
        if failed:
            log.warning(
                "code reward: %d of %d samples could not be judged (%d test cases), e.g. %s: %s",
                sum(r is None for r in rewards),
                len(rewards),
                len(failed),
                failed[0].reason,
                failed[0].detail[:300],
            )
        reasons = Counter(v.reason for vs in verdicts for v in vs)
        log.debug("code reward: %s", dict(reasons))

    def pop_metrics(self) -> dict[str, float]:
        """Counts by reason since the last call (e.g. `passed`, `wrong_output`, `cpu_time`,
        `memory`, `unscorable`), then reset."""
        counts, self.counts = self.counts, Counter()
        return {reason: float(n) for reason, n in sorted(counts.items())}


def code_reward(
    prompts: list[str], completions: list[str], tests: list[Any], **params: Any
) -> list[float | None]:
    """The code reward as a plain function (params as CodeReward's), for one-off use."""
    names = ("cpu_seconds", "wall_seconds", "memory_mb", "workers", "strict")
    limits = {k: params[k] for k in names if k in params}
    return CodeReward(**limits)(prompts, completions, tests)

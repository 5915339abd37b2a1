"""python: the file's `grade(sample, item) -> float` run in the sandbox, one process per batch.

The grader's source is followed by a small harness and run once for a whole batch with
`sandbox.run_python`: the samples and items go in on stdin as JSON, and the harness calls
`grade` on each under its own time limit (SIGALRM), writing one result line per sample as it
goes. `print` inside `grade` goes to stderr, so it cannot be mistaken for a result. A sample
whose `grade` raises, runs past its time, or returns something that is not a finite number
scores None; when the whole run is cut off (top-level code that hangs, a memory or CPU limit),
every sample without a result line scores None. The program runs with the standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graders.base import Item, Outcome, Sample
from graders.spec import PythonSpec

MARK = "@@r1-grade@@"
STARTUP_SECONDS = 5.0
DEFAULT_SECONDS_PER_SAMPLE = 2.0
CHUNK = 256  # samples per sandbox run, so the result lines stay well inside its output cap

_HARNESS = f"""

def _r1_grade_all():
    import contextlib as _contextlib
    import json as _json
    import math as _math
    import signal as _signal
    import sys as _sys

    class _R1GradeTimeout(BaseException):
        pass

    def _r1_alarm(signum, frame):
        raise _R1GradeTimeout()

    payload = _json.loads(_sys.stdin.read())
    seconds = payload["seconds"]
    _signal.signal(_signal.SIGALRM, _r1_alarm)
    out = _sys.stdout
    for index, (sample, item) in enumerate(payload["cases"]):
        score, error = None, None
        try:
            _signal.setitimer(_signal.ITIMER_REAL, seconds)
            try:
                with _contextlib.redirect_stdout(_sys.stderr):
                    value = grade(sample, item)
            finally:
                _signal.setitimer(_signal.ITIMER_REAL, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                error = "grade() returned " + type(value).__name__ + ", not a number"
            elif not _math.isfinite(value):
                error = "grade() returned " + repr(value)
            else:
                score = float(value)
        except _R1GradeTimeout:
            error = "grade() ran past " + repr(seconds) + "s"
        except BaseException as exc:
            error = type(exc).__name__ + ": " + str(exc)[:300]
        out.write("\\n{MARK}" + _json.dumps([index, score, error]) + "\\n")
        out.flush()


_r1_grade_all()
"""


def program(source: str) -> str:
    """The code the sandbox runs: the grader's source, then the harness."""
    return source.rstrip() + "\n" + _HARNESS


def parse_results(stdout: str, n: int) -> dict[int, tuple[float | None, str | None]]:
    """The result lines the harness wrote, by sample index (missing ones were never reached)."""
    results: dict[int, tuple[float | None, str | None]] = {}
    for line in stdout.splitlines():
        if not line.startswith(MARK):
            continue
        try:
            index, score, error = json.loads(line[len(MARK) :])
        except (ValueError, TypeError):
            continue
        if isinstance(index, int) and 0 <= index < n:
            finite = isinstance(score, int | float) and math.isfinite(score)
            results[index] = (float(score) if finite else None, error)
    return results


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


@dataclass(frozen=True)
class PythonGrader:
    spec: PythonSpec
    seconds_per_sample: float = DEFAULT_SECONDS_PER_SAMPLE

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pass_threshold(self) -> float | None:
        return self.spec.pass_threshold

    def evaluate(self, samples: Sequence[Sample], items: Sequence[Item]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for start in range(0, len(samples), CHUNK):
            chunk = slice(start, start + CHUNK)
            outcomes += self._run(samples[chunk], items[chunk])
        return outcomes

    def _run(self, samples: Sequence[Sample], items: Sequence[Item]) -> list[Outcome]:
        from sandbox import Limits, run_python  # the sandbox starts processes; load it when used

        cases = [[_jsonable(s), _jsonable(dict(i))] for s, i in zip(samples, items, strict=True)]
        budget = self.seconds_per_sample * len(cases)
        limits = Limits(cpu_seconds=budget + 1.0, wall_seconds=budget + STARTUP_SECONDS)
        payload = json.dumps({"seconds": self.seconds_per_sample, "cases": cases})
        run = run_python(program(self.spec.source), stdin=payload, limits=limits)
        results = parse_results(run.stdout, len(cases))
        cut_off = f"the grader's run ended ({run.status}: {run.detail or run.stderr[-300:]})"
        return [
            Outcome(*results[i]) if i in results else Outcome(None, cut_off)
            for i in range(len(cases))
        ]

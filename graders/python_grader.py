"""python: the file's `grade(sample, item) -> float`, run in the sandbox once per sample.

The grader's source, followed by a small harness, is one sandbox program job whose inputs are
the samples: each sample is graded by a fresh run of the source in a confined process (a fresh
`__main__`; a process that ended abnormally is replaced before the next sample), so no sample's
grading shares memory with another's (files are another matter: below). `print` inside `grade`
goes to stderr. The harness writes its result as one line marked with a random nonce that came
with the sample, so no text the grader echoes (a sample's own words included) can pass for a
result.

Fail closed: a sample whose grading raises, runs past its time, ends its process, or returns
something that is not a finite number scores 0.0, with the reason. Only a grader that cannot run
at all scores None: one that fails on a first run with no sample (its source fails at import, or
the sandbox fails); such a source is refused when the file loads (`load_problem`), so that only
a sandbox failing mid-run leaves samples unscored. The program runs with the standard library
only. Samples are graded in separate processes that share the job's scratch folder (`/tmp`):
a grader that writes files there can see an earlier sample's.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graders.base import Item, Outcome, Sample
from graders.spec import PythonSpec

MARK = "@@r1-grade@@"
STARTUP_SECONDS = 1.0  # time on top of each sample's for running the source itself
DEFAULT_SECONDS_PER_SAMPLE = 2.0

_HARNESS = f"""

def _r1_grade_one():
    import contextlib as _contextlib
    import json as _json
    import math as _math
    import sys as _sys

    request = _json.loads(_sys.stdin.read())
    score, error = None, None
    if "sample" in request:
        with _contextlib.redirect_stdout(_sys.stderr):
            value = grade(request["sample"], request["item"])
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            error = "grade() returned " + type(value).__name__ + ", not a number"
        elif not _math.isfinite(value):
            error = "grade() returned " + repr(value)
        else:
            score = float(value)
    _sys.stdout.write("\\n{MARK} " + request["nonce"] + " " + _json.dumps([score, error]) + "\\n")


_r1_grade_one()
"""


def program(source: str) -> str:
    """The code the sandbox runs: the grader's source, then the harness."""
    return source.rstrip() + "\n" + _HARNESS


def parse_result(stdout: str, nonce: str) -> tuple[float | None, str | None] | None:
    """The harness's result line for `nonce`, or None when there is none."""
    prefix = f"{MARK} {nonce} "
    for line in reversed(stdout.splitlines()):
        if not line.startswith(prefix):
            continue
        try:
            score, error = json.loads(line[len(prefix) :])
        except (ValueError, TypeError):
            return None
        finite = (
            isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score)
        )
        return (float(score) if finite else None), (str(error) if error else None)
    return None


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

    def _job(self, inputs: Sequence[str]) -> Any:
        from sandbox import Job, Limits  # the sandbox starts processes: load it when used

        limits = Limits(
            cpu_seconds=self.seconds_per_sample,
            wall_seconds=self.seconds_per_sample + STARTUP_SECONDS,
        )
        return Job(program(self.spec.source), tuple(inputs), limits=limits)

    def load_problem(self) -> str | None:
        """Why the source cannot run at all (a module outside the standard library, top-level
        code that raises or hangs), from one run with no sample, as `evaluate` starts with;
        None when it runs, or when the sandbox cannot run here (nothing is known then)."""
        from sandbox import run_jobs

        nonce = secrets.token_hex(16)
        (probe,) = run_jobs([self._job([json.dumps({"nonce": nonce})])])[0]
        if probe.status == "sandbox_failed" or parse_result(probe.stdout, nonce) is not None:
            return None
        return f"{probe.status}: {probe.detail or probe.stderr[-300:]}"

    def evaluate(self, samples: Sequence[Sample], items: Sequence[Item]) -> list[Outcome]:
        from sandbox import run_jobs

        nonces = [secrets.token_hex(16) for _ in range(len(samples) + 1)]
        inputs = [json.dumps({"nonce": nonces[0]})] + [
            json.dumps({"nonce": n, "sample": _jsonable(s), "item": _jsonable(dict(i))})
            for n, s, i in zip(nonces[1:], samples, items, strict=True)
        ]
        probe, *runs = run_jobs([self._job(inputs)])[0]
        if probe.status != "ok" or parse_result(probe.stdout, nonces[0]) is None:
            why = f"the grader cannot run ({probe.status}: {probe.detail or probe.stderr[-300:]})"
            return [Outcome(None, why) for _ in samples]
        return [_outcome(run, nonce) for run, nonce in zip(runs, nonces[1:], strict=True)]


def _outcome(run: Any, nonce: str) -> Outcome:
    """A sample's score; every way its grading can fail scores 0.0 with the reason."""
    result = parse_result(run.stdout, nonce) if run.status == "ok" else None
    if run.status == "sandbox_failed":
        return Outcome(None, f"the sandbox failed: {run.detail}")
    if result is None:
        return Outcome(0.0, f"grading this sample failed ({run.status}: {run.detail})")
    score, error = result
    if score is None:
        return Outcome(0.0, error or "grade() gave no score")
    return Outcome(score)

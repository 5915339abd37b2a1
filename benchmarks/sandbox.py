"""Candidate programs verified per second: the sandbox against plain `subprocess.run`.

The workload is one GRPO step on code prompts: `--prompts` x `--samples` candidate programs,
each with `--tests` hidden tests, in two kinds:
- stdio: the program reads a number on stdin and prints a result (stdin/stdout tests);
- calls: the program defines a function, checked by assert-style tests.
A fifth of the candidates are wrong and a few crash, as a policy's samples are.

Ours verifies a step through the code reward (rewards/code.py): one sandbox session, a confined
process per candidate, assert tests run in the judge. The peer runs the same programs with a bare
`subprocess.run([python, "-I", "-S", "-c", program], input=...)` per test (for assert tests, the
test appended to the program: the old, gameable way), with no isolation and no limits, on the same
number of threads. The two alternate over `--repeats` rounds; the median and the range of each
side and of the ratio are printed, with the guards that were in force.

    python -m benchmarks.sandbox --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from benchmarks.figures import spread
from rewards.code import CodeReward, normalise_output
from sandbox import capabilities
from sandbox.runner import default_workers

STDIO = "import sys\nn = int(sys.stdin.readline())\nprint(sum(int(d) for d in str(n * {k})))\n"
CALLS = "def digit_sum(n):\n    return sum(int(d) for d in str(n * {k}))\n"
WRONG = {"stdio": "n = int(input())\nprint(n)\n", "calls": "def digit_sum(n):\n    return n\n"}
CRASH = {"stdio": "raise ValueError('no')\n", "calls": "def digit_sum(n):\n    return 1 / 0\n"}


def expected(n: int, k: int) -> int:
    return sum(int(d) for d in str(n * k))


def step(kind: str, candidates: int, tests: int) -> tuple[list[str], list[list[dict]]]:
    """Completions and their tests for one step (candidate i multiplies by k = i % 7 + 2)."""
    completions, cases = [], []
    for i in range(candidates):
        k = i % 7 + 2
        program = (STDIO if kind == "stdio" else CALLS).format(k=k)
        if i % 5 == 4:
            program = WRONG[kind]
        elif i % 17 == 16:
            program = CRASH[kind]
        fenced = f"<answer>\n```python\n{program}```\n</answer>"
        completions.append(f"<think>multiply, then add the digits</think>\n{fenced}")
        numbers = [1000 + 37 * i + j for j in range(tests)]
        if kind == "stdio":
            cases.append([{"input": f"{n}\n", "output": f"{expected(n, k)}\n"} for n in numbers])
        else:
            cases.append([{"code": f"assert digit_sum({n}) == {expected(n, k)}"} for n in numbers])
    return completions, cases


def ours(completions: list[str], cases: list[list[dict]], workers: int) -> list[float | None]:
    reward = CodeReward(workers=workers)
    return reward(["p"] * len(completions), completions, cases)


def peer(completions: list[str], cases: list[list[dict]], workers: int) -> list[float | None]:
    """The same verdicts from one bare subprocess per test."""
    from rewards.code import extract_code

    jobs = [
        (i, extract_code(c) or "", case)
        for i, (c, sample) in enumerate(zip(completions, cases, strict=True))
        for case in sample
    ]

    def run(job: tuple[int, str, dict]) -> tuple[int, bool]:
        i, code, case = job
        program = code + "\n" + case["code"] if "code" in case else code
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", program],
            input=case.get("input", ""),
            capture_output=True,
            text=True,
            timeout=10,
        )
        if "code" in case:
            return i, done.returncode == 0
        return i, done.returncode == 0 and normalise_output(done.stdout) == normalise_output(
            case["output"]
        )

    passed = [0] * len(completions)
    with ThreadPoolExecutor(workers) as pool:
        for i, ok in pool.map(run, jobs):
            passed[i] += ok
    return [p / len(sample) for p, sample in zip(passed, cases, strict=True)]


def timed(fn: Callable[..., list[float | None]], *args: object) -> tuple[float, list[float | None]]:
    start = time.perf_counter()
    rewards = fn(*args)
    return time.perf_counter() - start, rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tests", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args()

    caps = capabilities()
    print(
        f"guards: namespaces={caps.namespaces} uid_drop={caps.uid_drop} "
        f"cgroup={caps.cgroup or 'none'} seccomp={caps.seccomp}"
    )
    for gap in caps.uncontained:
        print(f"  not contained: {gap}")
    n = args.prompts * args.samples
    print(
        f"one step: {args.prompts} prompts x {args.samples} samples = {n} candidates, "
        f"{args.tests} tests each, {args.workers} workers"
    )
    for kind in ("stdio", "calls"):
        completions, cases = step(kind, n, args.tests)
        ours(completions[:4], cases[:4], args.workers)  # warm up: the first call probes the guards
        rates: dict[str, list[float]] = {"ours": [], "peer": []}
        for _ in range(args.repeats):  # alternate, so that drift in the machine hits both
            seconds, mine = timed(ours, completions, cases, args.workers)
            rates["ours"].append(n / seconds)
            seconds, theirs = timed(peer, completions, cases, args.workers)
            rates["peer"].append(n / seconds)
            wrong = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
            if wrong:
                raise SystemExit(f"{kind}: the verdicts differ for candidates {wrong[:5]}")
        ratios = [a / b for a, b in zip(rates["ours"], rates["peer"], strict=True)]
        print(
            f"{kind:5s}: sandbox {spread(rates['ours'], 1)} candidates/s | plain subprocess.run "
            f"{spread(rates['peer'], 1)} candidates/s | ratio {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}), median (range) of {args.repeats}"
        )


if __name__ == "__main__":
    main()

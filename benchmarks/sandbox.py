"""Executions per second of the code-execution sandbox against a plain subprocess peer.

Runs the same trivial program (read a number on stdin, print its square) `--runs` times through
`sandbox.run_python` and through a bare `subprocess.run([sys.executable, "-I", "-S", "-c", ...])`
with no limits or isolation, sequentially and with `--workers` threads, in the same process on the
same machine. Prints executions per second for both, the ratio, and the isolation that was active.
It also times the code reward over a batch of completions with three stdin/stdout tests each.

    python -m benchmarks.sandbox --runs 200 --workers 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rewards.code import code_reward
from sandbox import capabilities, run_python

PROGRAM = "n = int(input())\nprint(n * n)\n"


def sandboxed(i: int) -> str:
    result = run_python(PROGRAM, stdin=f"{i}\n")
    if result.status != "ok":
        raise RuntimeError(f"sandbox run failed: {result}")
    return result.stdout


def plain(i: int) -> str:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROGRAM],
        input=f"{i}\n",
        capture_output=True,
        text=True,
        timeout=5,
        check=True,
    )
    return done.stdout


def per_second(fn: Callable[[int], str], runs: int, workers: int) -> float:
    """Executions per second of `fn` over `runs` calls, `workers` at a time; checks each output."""
    start = time.perf_counter()
    if workers == 1:
        outputs = [fn(i) for i in range(runs)]
    else:
        with ThreadPoolExecutor(workers) as pool:
            outputs = list(pool.map(fn, range(runs)))
    seconds = time.perf_counter() - start
    assert outputs == [f"{i * i}\n" for i in range(runs)]
    return runs / seconds


def reward_batch(samples: int) -> float:
    """Seconds to score `samples` completions, three test cases each, with the code reward."""
    completion = "<think>square it</think>\n<answer>\n```python\n" + PROGRAM + "```\n</answer>"
    tests = [{"input": f"{i}", "output": f"{i * i}"} for i in (2, 3, 4)]
    start = time.perf_counter()
    scores = code_reward(["p"] * samples, [completion] * samples, [tests] * samples)
    seconds = time.perf_counter() - start
    assert scores == [1.0] * samples
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reward-samples", type=int, default=32)
    args = parser.parse_args()

    print(f"isolation: {capabilities()}")
    sandboxed(0)  # warm up: the first call probes the namespaces
    for workers in sorted({1, args.workers}):
        ours = per_second(sandboxed, args.runs, workers)
        peer = per_second(plain, args.runs, workers)
        print(
            f"workers={workers}: sandbox {ours:6.1f} exec/s | plain subprocess {peer:6.1f} exec/s"
            f" | sandbox/plain {ours / peer:.2f}"
        )
    seconds = reward_batch(args.reward_samples)
    runs = 3 * args.reward_samples
    print(
        f"code reward: {args.reward_samples} completions x 3 tests in {seconds:.2f}s"
        f" ({runs / seconds:.1f} exec/s)"
    )


if __name__ == "__main__":
    main()

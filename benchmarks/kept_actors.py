"""A whole run on a Ray cluster with its sampling actors kept from stage to stage, against one
set of actors per stage: `r1 run --profile micro` on a local two-node cluster (loopback, one CPU
per node) with the cluster test's settings (two actors for every evaluation, the rejection
sampling, the distillation traces and every GRPO stage's rollouts; mixed SFT under DeepSpeed on
two Ray nodes), `cluster.keep_actors` true and false alternated, each run in a new state folder.

Prints each run's wall time and how many sets of actors it started and took from the stage
before (its log's "sampling actors (started)" and "(kept from the stage before)" lines), then
the paired difference of the wall times with its standard error.

    python -m benchmarks.kept_actors --rounds 2

Timings vary with load: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.cluster import loopback_cluster

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ["mixed_sft.engine.kind=deepspeed", "mixed_sft.engine.processes=2"]
STARTED = re.compile(r"sampling actors \(started\) ready")
KEPT = re.compile(r"sampling actors \(kept from the stage before\) ready")


@dataclass(frozen=True)
class Run:
    keep: bool
    wall: float
    started: int
    kept: int


def cluster_settings(address: str, keep: bool) -> list[str]:
    return [
        f"cluster.address={address}",
        "cluster.workers=2",
        "cluster.chunk_prompts=2",
        "cluster.nodes=2",
        "cluster.rollouts=workers",
        f"cluster.keep_actors={str(keep).lower()}",
    ]


def one_run(address: str, keep: bool, folder: Path) -> Run:
    """`r1 run --profile micro` on the cluster in a new state folder; its log kept in `folder`."""
    state = Path(tempfile.mkdtemp(prefix="state-", dir=folder))
    command = [sys.executable, "-m", "cli.main", "run", "--profile", "micro"]
    for setting in PROFILE + cluster_settings(address, keep):
        command += ["--set", setting]
    env = dict(os.environ, R1_STATE_DIR=str(state))
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    log = done.stdout + done.stderr
    (folder / f"run-{'kept' if keep else 'per-stage'}-{state.name}.log").write_text(log)
    if done.returncode:
        raise SystemExit(f"r1 run failed (exit {done.returncode}):\n{log[-3000:]}")
    return Run(keep, wall, len(STARTED.findall(log)), len(KEPT.findall(log)))


def report(runs: list[Run]) -> None:
    print(f"\n{'actors':<12}{'wall s':>8}{'sets started':>14}{'sets kept':>11}")
    for run in runs:
        name = "kept" if run.keep else "per stage"
        print(f"{name:<12}{run.wall:>8.1f}{run.started:>14}{run.kept:>11}")
    kept = [r.wall for r in runs if r.keep]
    per_stage = [r.wall for r in runs if not r.keep]
    diffs = [k - p for k, p in zip(kept, per_stage, strict=True)]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    ratio = statistics.fmean(kept) / statistics.fmean(per_stage)
    print(
        f"\nkept - per stage: {mean:+.1f} s (standard error {se:.1f} s, {len(diffs)} pairs); "
        f"kept / per stage: {ratio:.3f}; load {os.getloadavg()[0]:.2f} (1-min average) at the end"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs, order alternated")
    args = parser.parse_args()
    runs: list[Run] = []
    with loopback_cluster() as (address, folder):
        for round_ in range(args.rounds):
            for keep in (True, False) if round_ % 2 else (False, True):
                run = one_run(address, keep, folder)
                print(
                    f"round {round_ + 1}: {'kept' if run.keep else 'per stage'} {run.wall:.1f} s",
                    flush=True,
                )
                runs.append(run)
    report(sorted(runs, key=lambda r: r.keep))


if __name__ == "__main__":
    main()

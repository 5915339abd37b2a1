"""What `r1 run` costs before and after its stages: the micro pipeline from a new state folder
and again on a finished one, with the temporary Prefect server started early on a seeded
database (cli/prefect_server.py) against Prefect starting it itself at the flow's first call
(`R1_PREFECT_EARLY_START=0`).

The two ways alternate, `--repeats` times each, each run a fresh `r1 run --profile micro`
process. Prints each run's wall seconds, the median and range of each way, and the median ratio
of the pairs. Also prints the parts of the fixed cost measured on their own: importing the
flow, and Prefect's server start on a new and on a migrated database.

    python -m benchmarks.startup --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.figures import spread
from cli.prefect_server import DB_NAME, EARLY_START_ENV, build_template

WAYS = {"early start, seeded database": "1", "Prefect's own start": "0"}


def timed_run(state: Path, early: str) -> float:
    """Wall seconds of one `r1 run --profile micro` process on `state`."""
    env = dict(os.environ, **{EARLY_START_ENV: early})
    env.pop("PREFECT_API_URL", None)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "cli.main", "run", "--profile", "micro", "--state-dir", str(state)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - began


def import_seconds() -> float:
    """Wall seconds of a process that imports the pipeline flow and its stages' code (what `r1
    run` imports while the server starts) and exits."""
    began = time.perf_counter()
    code = "import flows.r1_pipeline\nfrom flows import load_stage_code\nload_stage_code()"
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - began


def server_seconds(seeded: bool) -> float:
    """Wall seconds until Prefect's temporary server, started by Prefect's class in a new
    process, answers on a new (or a seeded) database."""
    with tempfile.TemporaryDirectory() as home:
        if seeded:
            shutil.copyfile(build_template(), Path(home) / DB_NAME)
        code = (
            "import time; began = time.perf_counter()\n"
            "from prefect.server.api.server import SubprocessASGIServer\n"
            "server = SubprocessASGIServer(); server.start()\n"
            "print(time.perf_counter() - began); server.stop()\n"
        )
        env = dict(os.environ, PREFECT_HOME=home)
        env.pop("PREFECT_API_URL", None)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        )
        return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    build_template()
    print(f"importing the flow and its stages' code: {import_seconds():.1f} s")
    print(f"Prefect's server start, new database: {server_seconds(seeded=False):.1f} s")
    print(f"Prefect's server start, seeded database: {server_seconds(seeded=True):.1f} s")
    fresh: dict[str, list[float]] = {way: [] for way in WAYS}
    again: dict[str, list[float]] = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        order = list(WAYS) if repeat % 2 == 0 else list(reversed(WAYS))
        for way in order:
            with tempfile.TemporaryDirectory() as state:
                fresh[way].append(timed_run(Path(state), WAYS[way]))
                again[way].append(timed_run(Path(state), WAYS[way]))
            print(
                f"  repeat {repeat + 1} {way:>30}: new state {fresh[way][-1]:.1f} s, "
                f"finished state {again[way][-1]:.1f} s",
                flush=True,
            )
    print(f"micro pipeline, {args.repeats} runs each, median (range):")
    print(f"{'':32}{'new state folder':>24}{'finished (all cached)':>26}")
    for way in WAYS:
        print(f"{way:32}{spread(fresh[way], 1) + ' s':>24}{spread(again[way], 1) + ' s':>26}")
    early, prefect_own = WAYS
    for name, runs in (("new", fresh), ("finished", again)):
        ratios = [p / e for p, e in zip(runs[prefect_own], runs[early], strict=True)]
        print(f"speed-up on a {name} state folder: {statistics.median(ratios):.2f}x (median pair)")


if __name__ == "__main__":
    main()

"""The tiny profile's heavy stages alone, two at once, and beside the test suite, with the old
and the new thread settings, in one run on this machine.

A job is one stage of the tiny profile, cut short, in a fresh process: `pretrain` (the base's
pretraining, the bootstrap stage at `--pretrain-epochs`), `grpo` (R1-Zero's GRPO for
`--grpo-steps` steps on a base prepared once: sampling, scoring and update), or `sandbox`
(`--sandbox-rounds` GRPO steps of code candidates verified in the sandbox: 128 programs with
stdin tests and 128 with call tests a round, benchmarks/sandbox.py's workload). Each runs in
four scenes: alone; two of the same job at once (both timed, their mean reported); beside the
default test suite's fast part (`-m "not heavy ..."`, in a loop from a few seconds before the
job until it ends); and beside a trainer (the pretrain job in a loop, likewise). The settings:

- old: the code and settings before host/threads.py: the project at `--old-rev` (default: the
  revision before host/threads.py was added, exported to `--out`), whose processes wait with
  libgomp's default spin and run the profile's 2 threads, its decode loop included;
- new: this checkout with its defaults: each job's process keeps libgomp's spin and governs it
  (host/waiting.py: the short spin while other work keeps its CPUs busy), the CPUs the process
  may use (at most the profile's 2), calls of 512 rows or more decoded in lanes of one thread.

`--old-rev REV` sets any revision against this checkout (its processes settle as that
revision did: f2c5eb0, for one, waits passively after a short spin, fixed).

The neighbours (the second job, the test suite, the trainer) run the same code and settings as
the job timed. Each job prints its wall seconds; the table gives each scene's time and its ratio
to the same job alone with the same settings, and the new setting's time over the old one's.

    python -m benchmarks.sharing --out /tmp/sharing               # every job, scene and setting
    python -m benchmarks.sharing --out /tmp/sharing --jobs grpo --scenes alone pair
    python -m benchmarks.sharing --out /tmp/sharing --jobs sandbox --scenes alone trainer

Timings depend on what else runs: start it on an otherwise idle machine. One run each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOBS = ("pretrain", "grpo", "sandbox")
SCENES = ("alone", "pair", "tests", "trainer")
SANDBOX_STEP = (16 * 8, 3)  # the sandbox job: a GRPO step's code candidates, tests each
SETTINGS = ("old", "new")
PROFILE_THREADS = 2  # the tiny profile's torch_threads
TEST_SUITE = "not slow and not gpu and not cluster and not heavy"
TESTS_HEAD_START_S = 8.0  # the suite is under way (collected, importing) before the job starts


def setting_env(setting: str, tree: Path) -> dict[str, str]:
    """The environment of every process of a scene under `setting`, the project's code from
    `tree`."""
    from host.threads import FALLBACK_ENV, SPIN_ENV, THREADS_ENV, WAIT_POLICY_ENV, process_threads

    env = dict(os.environ) | {"TQDM_DISABLE": "1", "PYTHONPATH": str(tree)}
    for key in (WAIT_POLICY_ENV, SPIN_ENV, THREADS_ENV, FALLBACK_ENV):
        env.pop(key, None)  # as a user's shell: each revision's processes settle their own
    if setting == "new":
        env[THREADS_ENV] = str(process_threads(PROFILE_THREADS))
    return env


def old_tree(out: Path, rev: str | None) -> Path:
    """The project at `rev` (default: the revision before host/threads.py), exported once."""
    if rev is None:
        added = git("log", "--diff-filter=A", "--format=%H", "--", "host/threads.py").split()
        rev = f"{added[-1]}^" if added else "HEAD"
    commit = git("rev-parse", "--short", rev).strip()
    tree = out / f"tree-{commit}"
    if not (tree / "configs" / "tiny.yaml").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout


# ---- one job, in its own process -----------------------------------------------------------


def profile() -> Any:
    from configs import load_profile

    return load_profile("tiny", [])


def prepare(out: Path, epochs: float) -> None:
    """The tiny world's problems and a base for the GRPO job (pretrained `epochs`), once."""
    from stages import bootstrap
    from stages import problems as problems_stage
    from stages.tracker import NullTracker

    config = profile()
    problems = problems_stage.run(config.data, out / "problems")
    if not (out / "base" / "model" / "config.json").exists():
        cut = cut_bootstrap(config.bootstrap, epochs)
        bootstrap.run(cut, problems, out / "base", NullTracker())


def cut_bootstrap(config: Any, epochs: float) -> Any:
    train = config.train.model_copy(update={"epochs": epochs})
    return config.model_copy(update={"train": train})


def run_job(
    kind: str, out: Path, work: Path, pretrain_epochs: float, grpo_steps: int, sandbox_rounds: int
) -> float:
    """Run job `kind` in `work`; its wall seconds (the stage alone, imports excluded)."""
    import shutil

    import torch

    from models.saved import ModelRef
    from stages import bootstrap, reasoning_rl
    from stages import problems as problems_stage
    from stages.tracker import NullTracker

    config = profile()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", config.torch_threads)))
    shutil.rmtree(work, ignore_errors=True)
    problems = problems_stage.run(config.data, work / "problems")  # each job its own files
    began = time.perf_counter()
    if kind == "pretrain":
        cut = cut_bootstrap(config.bootstrap, pretrain_epochs)
        bootstrap.run(cut, problems, work / "stage", NullTracker())
    elif kind == "grpo":
        grpo = config.r1_zero.model_copy(update={"steps": grpo_steps})
        base = ModelRef(out / "base" / "model")
        reasoning_rl.run(grpo, base, problems, work / "stage", NullTracker(), desc="grpo")
    else:
        return verify_programs(sandbox_rounds)
    return time.perf_counter() - began


def verify_programs(rounds: int) -> float:
    """The sandbox job: `rounds` GRPO steps of code candidates verified through the code reward
    (benchmarks/sandbox.py's workload, stdio and call tests alike), after one warm-up call; its
    wall seconds."""
    from benchmarks.sandbox import ours, step
    from sandbox.runner import default_workers

    workers = default_workers()
    batches = [step(kind, *SANDBOX_STEP) for kind in ("stdio", "calls")]
    ours(batches[0][0][:4], batches[0][1][:4], workers)  # the first call probes the guards
    began = time.perf_counter()
    for _ in range(rounds):
        for completions, cases in batches:
            ours(completions, cases, workers)
    return time.perf_counter() - began


# ---- the scenes ----------------------------------------------------------------------------


def settle_revision() -> None:
    """A job's process settles how its threads wait as its revision's entry points do (none
    did before host/threads.py)."""
    try:
        from host.threads import settle_process
    except ImportError:
        return
    settle_process()


def start_job(args: argparse.Namespace, kind: str, setting: str, tag: str) -> subprocess.Popen:
    work = args.out / "work" / f"{kind}-{setting}-{tag}"
    tree = args.trees[setting]
    # run as a file (-P: its folder not on the path), so the project comes from `tree` alone
    command = [sys.executable, "-P", str(Path(__file__).resolve()), "--out", str(args.out)]
    command += ["--pretrain-epochs", str(args.pretrain_epochs)]
    command += ["--grpo-steps", str(args.grpo_steps), "--sandbox-rounds", str(args.sandbox_rounds)]
    command += ["job", kind, "--work", str(work)]
    work.parent.mkdir(parents=True, exist_ok=True)
    with open(work.parent / f"{work.name}.log", "w") as log:  # its progress and warnings
        return subprocess.Popen(
            command,
            cwd=tree,
            env=setting_env(setting, tree),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )


def job_seconds(process: subprocess.Popen, limit: float) -> float:
    """The job's wall seconds; `inf` for one stopped at `limit` seconds."""
    try:
        stdout, _ = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return math.inf
    if process.returncode != 0:
        raise RuntimeError(f"a job failed (exit {process.returncode}); its output:\n{stdout}")
    return float(json.loads(stdout.strip().splitlines()[-1])["seconds"])


@contextmanager
def background(loop: str, tree: Path, setting: str):
    """`loop` (a shell loop) running beside the block, from `tree` with `setting`'s environment,
    in a session of its own, stopped whole after it; it gets a head start to be under way."""
    process = subprocess.Popen(
        ["bash", "-c", loop],
        cwd=tree,
        env=setting_env(setting, tree),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time.sleep(TESTS_HEAD_START_S)
        yield
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_suite_loop() -> str:
    """The default suite's fast part in a loop."""
    pytest = f"{sys.executable} -m pytest -q -p no:cacheprovider -m '{TEST_SUITE}'"
    return f"while true; do {pytest}; done"


def trainer_loop(args: argparse.Namespace, setting: str) -> str:
    """The pretrain job in a loop: a trainer on the same machine."""
    work = args.out / "work" / f"neighbour-{setting}"
    command = [sys.executable, "-P", str(Path(__file__).resolve()), "--out", str(args.out)]
    command += ["--pretrain-epochs", str(args.pretrain_epochs), "job", "pretrain"]
    return f"while true; do {' '.join(command)} --work {work}; done"


def scene(args: argparse.Namespace, kind: str, scene: str, setting: str) -> float:
    """The job's wall seconds in `scene` (a pair: the mean of the two)."""
    if scene == "alone":
        return job_seconds(start_job(args, kind, setting, "alone"), args.limit)
    if scene == "pair":
        both = [start_job(args, kind, setting, f"pair{i}") for i in (0, 1)]
        try:
            return sum(job_seconds(p, args.limit) for p in both) / 2
        finally:  # one failed: its partner is not left running
            for process in both:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    loop = trainer_loop(args, setting) if scene == "trainer" else test_suite_loop()
    with background(loop, args.trees[setting], setting):
        return job_seconds(start_job(args, kind, setting, scene), args.limit)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for kind in args.jobs:
        for name in args.scenes:
            for setting in args.settings:
                seconds = scene(args, kind, name, setting)
                rows.append({"job": kind, "scene": name, "setting": setting, "seconds": seconds})
                print(f"{kind:9} {name:6} {setting}: {seconds:7.1f} s", flush=True)
    (args.out / "sharing.json").write_text(json.dumps(rows, indent=1))
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """Per job and scene: each setting's seconds and ratio to its job alone, new over old."""
    seconds = {(r["job"], r["scene"], r["setting"]): r["seconds"] for r in rows}
    print("\n| job | scene | old s | old / alone | new s | new / alone | new / old |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for job, name in dict.fromkeys((r["job"], r["scene"]) for r in rows):
        cells = []
        for setting in SETTINGS:
            took, alone = seconds.get((job, name, setting)), seconds.get((job, "alone", setting))
            cells += [fmt(took), f"{took / alone:.2f}x" if took and alone else "-"]
        old, new = seconds.get((job, name, "old")), seconds.get((job, name, "new"))
        cells.append(f"{new / old:.2f}" if old and new else "-")
        print(f"| {job} | {name} | " + " | ".join(cells) + " |")


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if math.isfinite(value) else "stopped"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="problems, the base, results")
    parser.add_argument("--jobs", nargs="+", choices=JOBS, default=list(JOBS))
    parser.add_argument("--scenes", nargs="+", choices=SCENES, default=list(SCENES))
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--pretrain-epochs", type=float, default=0.1, help="the pretrain job's")
    parser.add_argument("--grpo-steps", type=int, default=3, help="the grpo job's steps")
    parser.add_argument("--base-epochs", type=float, default=1.0, help="the grpo job's base")
    parser.add_argument("--sandbox-rounds", type=int, default=5, help="the sandbox job's steps")
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a job may take")
    parser.add_argument("--old-rev", help="the old setting's revision (default: before host/)")
    sub = parser.add_subparsers(dest="command")
    job = sub.add_parser("job", help="run one job in this process (what each scene starts)")
    job.add_argument("kind", choices=JOBS)
    job.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    args.out = args.out.resolve()
    if args.command == "job":
        settle_revision()
        seconds = run_job(
            args.kind,
            args.out,
            args.work,
            args.pretrain_epochs,
            args.grpo_steps,
            args.sandbox_rounds,
        )
        print(json.dumps({"seconds": seconds}))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    args.trees = {"new": ROOT, "old": old_tree(args.out, args.old_rev)}
    print(f"old: the project at {args.trees['old']}", flush=True)
    print(f"preparing the problems and the grpo job's base in {args.out}", flush=True)
    prepare(args.out, args.base_epochs)
    print_table(measure(args))


if __name__ == "__main__":
    main()

"""Asynchronous GRPO against synchronous on one GRPO stage of the tiny world, at equal steps.

The stage is R1-Zero as the tiny profile runs it (`r1_zero`: 40 steps of 8 prompts x 8 samples
on the bootstrap model, held-out probes every 5 steps; `--profile gpu-tiny`: that profile's, on
its GPU, the trainer on one process's engine), run five ways for each seed:
synchronous (today's colocated sampler), and with `max_staleness` 1 and 2 on one sampler process
beside the trainer and on the two sampling actors of a two-node loopback Ray cluster (one CPU
per node). `--modes sync-t1 process-k1-t1` runs the synchronous and the process run with the
trainer at one torch thread (one thread per core with the sampler process's). Each run is timed
whole (the workers' start included) and its CPU time is split between the trainer's process,
the sampling workers and the rest of the machine (Ray's daemons, anything else). Then every
final model is evaluated on the tiny profile's held-out problems and compared with the
synchronous run of its seed, problem by problem (benchmarks/compare_stages.py).

    python -m benchmarks.async_grpo prepare --out DIR     # problems and the base model, once
    python -m benchmarks.async_grpo time --out DIR --seeds 0 1   # the timed runs
    python -m benchmarks.async_grpo report --out DIR      # evaluates the models, prints tables

Per run: wall seconds and its ratio to the synchronous run, completion tokens sampled per
second, the mean seconds per step the samplers spent drawing a step (generate and version loads,
summed over workers) and the trainer spent on it besides waiting (scoring, update, handing the
version over), the trainer's idle share (its time waiting for rollouts, over the wall time; for the
synchronous run that is its sampling), the trainer's seconds on the held-out probe (drawing
it where it draws it, waiting for the workers' draw where they do, and grading it;
the worker modes have the workers draw it, `--modes process-k1-probe-on-trainer` the trainer,
beside a sampler process, as `probe.on_workers` does by default), the samplers' idle share (1 -
their generate and load time, probes included, over workers x wall), CPU seconds of each side,
and held-out pass@1 with the paired difference to the synchronous run and its standard error
over problems.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every address on loopback

import psutil  # noqa: E402
import torch  # noqa: E402

from benchmarks.cluster import loopback_cluster  # noqa: E402
from benchmarks.compare_stages import paired, per_problem  # noqa: E402
from configs import load_profile  # noqa: E402
from configs.cluster import ClusterConfig  # noqa: E402
from configs.schema import PipelineConfig  # noqa: E402
from models.loading import use_device  # noqa: E402
from models.saved import ModelRef  # noqa: E402
from problems.types import ProblemSet  # noqa: E402
from stages import bootstrap, evaluate, reasoning_rl  # noqa: E402
from stages import problems as problems_stage  # noqa: E402
from stages.tracker import NullTracker  # noqa: E402

MODES = ("sync", "process-k1", "process-k2", "ray-k1", "ray-k2")
# the trainer at one torch thread instead of the profile's: with a one-thread sampler process
# beside it, exactly one thread per core (a measurement of why, not the profile's setting)
ONE_THREAD = ("sync-t1", "process-k1-t1")
# the held-out probe drawn by the trainer's own sampler beside a sampler process (probe.on_workers
# false, the default); the other worker modes have the workers draw it: what that changes
PROBE_ON_TRAINER = ("process-k1-probe-on-trainer",)
EXTRA = ONE_THREAD + PROBE_ON_TRAINER
CAP = 3.0  # importance_sampling_cap of the asynchronous runs (TRL's default)
POLL_S = 0.2


PROFILE = {"name": "tiny"}  # --profile


def profile() -> PipelineConfig:
    """The profile the runs take their stage, problems and base from (`--profile`). Its R1-Zero
    trains on one process's engine (fp32, as GRPO in one process trains) whatever the profile
    says: sampling workers draw only for such a trainer (DeepSpeed ranks sample colocated), and
    the synchronous run it is compared with trains on the same engine."""
    config = load_profile(PROFILE["name"], [])
    if config.r1_zero.engine.kind == "single":
        return config
    engine = config.r1_zero.engine.model_copy(update={"kind": "single", "precision": "fp32"})
    r1_zero = config.r1_zero.model_copy(update={"engine": engine})
    return config.model_copy(update={"r1_zero": r1_zero})


def prepare(out: Path) -> tuple[ProblemSet, ModelRef]:
    """The tiny world's problems and its bootstrap model (trained once, kept in `out`)."""
    config = profile()
    problems = problems_stage.run(config.data, out / "problems")
    model_dir = out / "bootstrap"
    if (model_dir / "model" / "config.json").exists():
        return problems, ModelRef(model_dir / "model")
    return problems, bootstrap.run(config.bootstrap, problems, model_dir, NullTracker())


class Recorder:
    """The stage's metrics by step."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.history.append({"step": step, **metrics})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        return None


def worker_pids() -> set[int]:
    """This run's sampling workers: among this process's descendants (its sampler processes,
    and the rollout actors of the loopback cluster it started, whose raylets are its children),
    those that sample. Another run's samplers on the same machine are not counted."""
    mine = set()
    for child in psutil.Process().children(recursive=True):
        try:
            line = child.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if line and (line[0].startswith("ray::RolloutActor") or "sampling.workers.process" in line):
            mine.add(child.pid)
    return mine


@contextmanager
def cpu_watch() -> Iterator[dict[str, float]]:
    """CPU seconds over the block: this process (the trainer), the sampling workers (polled, the
    last reading of each), and the whole machine."""
    me = psutil.Process()
    seen: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(POLL_S):
            for pid in worker_pids():
                try:
                    times = psutil.Process(pid).cpu_times()
                except psutil.NoSuchProcess:
                    continue
                seen[pid] = times.user + times.system

    mine, machine = me.cpu_times(), psutil.cpu_times()
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    figures: dict[str, float] = {}
    try:
        yield figures
    finally:
        stop.set()
        thread.join()
        now, total = me.cpu_times(), psutil.cpu_times()
        figures["trainer"] = now.user + now.system - mine.user - mine.system
        figures["workers"] = sum(seen.values())
        figures["machine"] = busy(total) - busy(machine)


def busy(times: Any) -> float:
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def run_one(
    out: Path, inputs: tuple[ProblemSet, ModelRef], mode: str, seed: int, ray_address: str | None
) -> dict[str, Any]:
    """One timed stage; its figures are written to out/runs/SEED/MODE/result.json."""
    config = profile()
    problems, policy = inputs
    k = int(mode.split("-k")[1][0]) if "-k" in mode else 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if mode.endswith("-t1") else config.torch_threads or 2)
    probe = config.r1_zero.probe.model_copy(
        update={"on_workers": mode.startswith(("process", "ray")) and mode not in PROBE_ON_TRAINER}
    )
    grpo = config.r1_zero.model_copy(
        update={
            "seed": seed,
            "max_staleness": k,
            "importance_sampling_cap": CAP if k else None,
            "probe": probe,
        }
    )
    grpo = type(grpo).model_validate(grpo.model_dump())  # checked as a profile's would be
    cluster = None
    if mode.startswith("process"):
        cluster = ClusterConfig(rollouts="process")
    elif mode.startswith("ray"):
        cluster = ClusterConfig(address=ray_address, workers=2)
    stage_dir = out / "runs" / str(seed) / mode
    shutil.rmtree(stage_dir, ignore_errors=True)
    tracker = Recorder()
    began = time.perf_counter()
    try:
        with cpu_watch() as cpu:
            reasoning_rl.run(grpo, policy, problems, stage_dir, tracker, desc=mode, cluster=cluster)
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - began
    result = {"mode": mode, "seed": seed, "wall": wall, "cpu": cpu, "history": tracker.history}
    result |= {"workers": 2 if mode.startswith("ray") else 1, "load": os.getloadavg()[0]}
    (stage_dir / "result.json").write_text(json.dumps(result))
    print(f"{mode} seed {seed}: {wall:.1f} s", flush=True)
    return result


def time_runs(out: Path, seeds: list[int], modes: list[str]) -> None:
    inputs = prepare(out)
    needs_ray = any(m.startswith("ray") for m in modes)
    with loopback_cluster() if needs_ray else _no_cluster() as (address, _):
        for seed in seeds:
            for mode in modes:
                run_one(out, inputs, mode, seed, address)


@contextmanager
def _no_cluster() -> Iterator[tuple[None, None]]:
    yield None, None


# ---- the report ---------------------------------------------------------------------------------


def evaluated(out: Path, stage_dir: Path) -> Path:
    """The final model's held-out samples (the tiny profile's evaluation, reasoning problems)."""
    samples = stage_dir / "eval" / "eval_samples.parquet"
    if not samples.exists():
        config = profile()
        problems = problems_stage.run(config.data, out / "problems")
        evaluation = config.evaluation.model_copy(update={"general_prompts": 0})
        evaluate.run(
            evaluation, ModelRef(stage_dir / "model"), problems, stage_dir / "eval", NullTracker()
        )
    return samples


def figures(result: dict[str, Any]) -> dict[str, float]:
    steps = [h for h in result["history"] if "time/sample_seconds" in h]
    wall, workers = result["wall"], result["workers"]
    g = profile().r1_zero
    tokens = sum(h["completion/mean_tokens"] * g.prompts_per_step * g.group_size for h in steps)
    waited = sum(h["time/sample_seconds"] for h in steps)
    probes = sum(h.get("time/probe_sampler_seconds", 0.0) for h in result["history"])
    sampled = sum(h["time/sampler_seconds"] for h in steps) + probes  # the workers' probes too
    cpu = result["cpu"]
    return {
        "wall": wall,
        "steps": len(steps),
        "tokens_per_s": tokens / wall,
        "sampler_step": sampled / len(steps),
        "trainer_step": sum(h["time/step_seconds"] - h["time/sample_seconds"] for h in steps)
        / len(steps),
        "trainer_idle": waited / wall,
        "probe_trainer": sum(h.get("time/probe_seconds", 0.0) for h in result["history"]),
        "sampler_idle": 1.0 - sampled / (workers * wall),
        "cpu_trainer": cpu["trainer"],
        "cpu_workers": cpu["workers"],
        "cpu_other": cpu["machine"] - cpu["trainer"] - cpu["workers"],
        "load": result["load"],
    }


def report(out: Path) -> None:
    rows = []
    for seed_dir in sorted((out / "runs").iterdir()):
        results = {p.parent.name: json.loads(p.read_text()) for p in seed_dir.glob("*/result.json")}
        if "sync" not in results:
            continue
        base = per_problem(evaluated(out, seed_dir / "sync"), strict=False)
        base_wall = results["sync"]["wall"]
        for mode in [m for m in MODES + EXTRA if m in results]:
            mine = per_problem(evaluated(out, seed_dir / mode), strict=False)
            diff, se, _ = paired(mine, base) if mode != "sync" else (0.0, 0.0, 0)
            row = figures(results[mode]) | {"seed": seed_dir.name, "mode": mode}
            row |= {"ratio": row["wall"] / base_wall, "diff": diff, "se": se}
            row["pass1"] = statistics.fmean(v for _, v in mine.values())
            rows.append(row)
    print_table(rows)


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| seed | run | wall s | vs sync | tok/s | sampler s/step | trainer s/step | trainer idle "
        "| probe s on trainer | sampler idle | CPU s trainer | CPU s samplers | CPU s other "
        "| pass@1 | vs sync (± SE) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        versus = "-" if r["mode"] == "sync" else f"{r['diff']:+.3f} ± {r['se']:.3f}"
        print(
            f"| {r['seed']} | {r['mode']} | {r['wall']:.1f} | {r['ratio']:.3f} "
            f"| {r['tokens_per_s']:.0f} | {r['sampler_step']:.2f} | {r['trainer_step']:.2f} "
            f"| {r['trainer_idle']:.2f} | {r['probe_trainer']:.1f} | {r['sampler_idle']:.2f} "
            f"| {r['cpu_trainer']:.0f} | {r['cpu_workers']:.0f} | {r['cpu_other']:.0f} "
            f"| {r['pass1']:.3f} | {versus} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "time", "report"])
    parser.add_argument("--out", type=Path, required=True, help="problems, models, results")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--modes", nargs="+", choices=MODES + EXTRA, default=list(MODES))
    parser.add_argument(
        "--profile",
        default="tiny",
        help="whose R1-Zero, problems and base (gpu-tiny: on its GPU, the sampler process too)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads of this process (default: the tiny profile's); 1 suits preparing "
        "or evaluating on a shared machine, the timed runs keep the profile's",
    )
    args = parser.parse_args()
    PROFILE["name"] = args.profile
    config = profile()
    use_device(config.device)  # the trainer's models, and so its sampler processes'
    torch.set_num_threads(args.threads or config.torch_threads or 2)
    if args.command == "prepare":
        prepare(args.out)
    elif args.command == "time":
        time_runs(args.out, args.seeds, args.modes)
    else:
        report(args.out)


if __name__ == "__main__":
    main()

"""Run one long stage on tiny models into a folder, in a process of its own, so that a test can
SIGKILL it at any moment, start it again, and compare the end with an uninterrupted run.

`python -m tests.reliability.stage_driver` imports torch, transformers and the stages once, says
`ready`, then serves one command per line on stdin, answering one line on stdout:

    run STAGE FOLDER [MODEL_DIR]  ->  pid PID      a forked child runs STAGE into FOLDER
                                                   (asynchronous GRPO, grpo-kN: its sampler
                                                   process opens MODEL_DIR)
    wait PID SECONDS              ->  exit PID CODE  (CODE < 0: killed by signal -CODE)
                                  or  running PID    (still running after SECONDS)

Forking from a process that has imported everything but never trained makes each run start in
milliseconds instead of the seconds a fresh interpreter needs. A child writes its output to
FOLDER/output-PID.txt, its metrics to FOLDER/metrics-PID.jsonl (one line per call, flushed), a
GRPO stage its sample rows to FOLDER/samples/step_N.json and, when it finishes,
FOLDER/result.pt (or result.json for rejection sampling). Closing stdin ends
the server; it kills and reaps any child still running.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa
import torch

from configs.reinforcement import RewardTerm
from configs.schema import FunnelConfig, RejectionConfig
from configs.supervised import TrainConfig
from models.chat import render_prompt
from models.saved import ModelRef
from problems.types import Problem
from rl.on_policy import OnPolicyDistiller
from rl.sources.pipelined import PipelinedSource
from rl.trainer import GRPOTrainer
from sampling.workers.process import ProcessWorkers
from stages import rejection
from stages.tracker import NullTracker
from storage import rollout_store
from storage.funnel import run_funnel
from tests.tiny_models import (
    PROBLEMS,
    TEXTS,
    distill_config,
    grpo_config,
    make_tokenizer,
    tiny_model,
)
from training.examples import lm_examples
from training.supervised import train

FINGERPRINT = "kill-test"
MODEL_ID = "m"

SFT = TrainConfig(
    epochs=10, batch_size=10, learning_rate=5e-3, warmup_steps=5, log_every=1, checkpoint_every=3
)
GRPO = grpo_config(steps=30, checkpoint_every=3)
ASYNC_GRPO = {  # max_staleness -> settings; rollouts from a sampler process
    k: grpo_config(
        steps=30,
        checkpoint_every=3,
        samples_every=1,
        max_staleness=k,
        importance_sampling_cap=3.0 if k else None,
    )
    for k in (0, 1, 2)
}
DISTILL = distill_config(steps=30, checkpoint_every=3)
REJECTION = RejectionConfig(
    samples_per_prompt=3,
    max_new_tokens=12,
    chunk_prompts=2,
    general_prompts=4,
    rewards=[
        RewardTerm(name="accuracy", kinds=["reasoning"]),
        RewardTerm(name="format"),
        RewardTerm(name="tag_count"),
    ],
    funnel=FunnelConfig(require_correct=False, require_well_formed=False, min_language_share=None),
)
REASONING = [Problem(f"r{i:02d}", f"What is {i} + {i}?", str(2 * i)) for i in range(16)]
GENERAL = [Problem(f"g{i}", f"Say hello {i} times.", "", kind="general") for i in range(4)]


class MetricsLog:
    """The stage's metrics, one JSON line per call, in a file of this process's own."""

    def __init__(self, folder: Path):
        self.file = (folder / f"metrics-{os.getpid()}.jsonl").open("a", encoding="utf-8")

    def __call__(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.file.write(json.dumps({"step": step, "metrics": metrics}) + "\n")
        self.file.flush()


def save_result(folder: Path, result: dict[str, Any]) -> None:
    """Write the end result in one step: it exists whole or not at all."""
    tmp = folder / "result.tmp"
    torch.save(result, tmp)
    os.replace(tmp, folder / "result.pt")


def run_sft(folder: Path, model_dir: Path | None) -> None:
    tokenizer = make_tokenizer()
    model = tiny_model(tokenizer)
    examples = lm_examples(tokenizer, TEXTS, max_length=64)
    log, pad = MetricsLog(folder), tokenizer.pad_token_id
    report = train(model, examples, SFT, folder / "ckpt", FINGERPRINT, log, pad, "sft")
    save_result(folder, {"weights": model.state_dict(), "resumed_from": report.resumed_from})


def run_grpo(folder: Path, model_dir: Path | None) -> None:
    tokenizer = make_tokenizer()
    model = tiny_model(tokenizer)
    trainer = GRPOTrainer(model, tokenizer, GRPO, MetricsLog(folder), show_progress=False)
    report = trainer.train(PROBLEMS, folder / "ckpt", FINGERPRINT)
    save_result(
        folder,
        {
            "weights": model.state_dict(),
            "resumed_from": report.resumed_from,
            "curve": report.reward_curve,
        },
    )


def write_rows(folder: Path, step: int, rows: list[dict]) -> None:
    path = folder / "samples" / f"step_{step:05d}.json"
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, path)


def run_async_grpo(k: int, folder: Path, model_dir: Path | None) -> None:
    assert model_dir is not None, "asynchronous GRPO needs MODEL_DIR for its sampler process"
    config = ASYNC_GRPO[k]
    tokenizer = make_tokenizer()
    model = tiny_model(tokenizer)
    workers = ProcessWorkers(config.sampler, model_dir, config.prompts_per_step * config.group_size)
    source = PipelinedSource(workers, folder / "versions", k, config.steps)
    rows = lambda step, table: write_rows(folder, step, table)  # noqa: E731
    trainer = GRPOTrainer(
        model, tokenizer, config, MetricsLog(folder), rows, show_progress=False, source=source
    )
    try:
        report = trainer.train(PROBLEMS, folder / "ckpt", FINGERPRINT)
    finally:
        trainer.close()
    save_result(
        folder,
        {
            "weights": model.state_dict(),
            "resumed_from": report.resumed_from,
            "curve": report.reward_curve,
        },
    )


def run_distill(folder: Path, model_dir: Path | None) -> None:
    tokenizer = make_tokenizer()
    student, teacher = tiny_model(tokenizer, seed=0), tiny_model(tokenizer, seed=1)
    distiller = OnPolicyDistiller(student, teacher, tokenizer, DISTILL, MetricsLog(folder), False)
    prompts = [render_prompt(tokenizer, f"What is {i} + {i}?") for i in range(16)]
    report = distiller.train(prompts, folder / "ckpt", FINGERPRINT)
    save_result(
        folder,
        {
            "weights": student.state_dict(),
            "resumed_from": report.resumed_from,
            "curve": report.kl_curve,
        },
    )


class MarkedSink:
    """The DuckDB rollout store, plus a line in FOLDER/chunks-PID.txt after each committed chunk
    so a test knows rows have landed."""

    def __init__(self, db: Path, marker: Path):
        self.db, self.marker = db, marker

    def stored(self) -> dict[str, set[int]]:
        return rollout_store.existing_samples(self.db, MODEL_ID)

    def insert(self, rows: pa.Table) -> int:
        new = rollout_store.insert_rollouts(self.db, rows)
        with self.marker.open("a") as f:
            f.write(f"{new}\n")
        return new


def run_rejection(folder: Path, model_dir: Path | None) -> None:
    assert model_dir is not None, "rejection sampling needs MODEL_DIR"
    db = folder / "rollouts.duckdb"
    sink = MarkedSink(db, folder / f"chunks-{os.getpid()}.txt")
    prompts = rejection.select_prompts(REJECTION, REASONING, GENERAL)
    report = rejection.run(REJECTION, ModelRef(model_dir), MODEL_ID, prompts, sink, NullTracker())
    funnel = run_funnel(db, MODEL_ID, REJECTION.funnel, run_id="kill-test")
    result = {
        "chunks": report.chunks,
        "chunks_skipped": report.chunks_skipped,
        "sampled": report.sampled,
        "inserted": report.inserted,
        "kept": funnel.kept,
    }
    tmp = folder / "result.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, folder / "result.json")


STAGES: dict[str, Callable[[Path, Path | None], None]] = {
    "sft": run_sft,
    "grpo": run_grpo,
    "distill": run_distill,
    "rejection": run_rejection,
    **{f"grpo-k{k}": partial(run_async_grpo, k) for k in ASYNC_GRPO},
}


def run_child(stage: str, folder: Path, model_dir: Path | None) -> NoReturn:
    """In the forked child: output to a file (never into the command channel), run, exit; the
    child never returns into the command loop, whatever happens."""
    code = 1
    try:
        folder.mkdir(parents=True, exist_ok=True)
        out = os.open(
            folder / f"output-{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        torch.set_num_threads(1)
        STAGES[stage](folder, model_dir)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def wait_for(pid: int, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return f"exit {pid} {os.waitstatus_to_exitcode(status)}"
        if time.monotonic() >= deadline:
            return f"running {pid}"
        time.sleep(0.005)


def serve() -> None:
    children: set[int] = set()
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "run":
            pid = os.fork()
            if pid == 0:
                run_child(args[0], Path(args[1]), Path(args[2]) if len(args) > 2 else None)
            children.add(pid)
            print(f"pid {pid}", flush=True)
        elif command == "wait":
            answer = wait_for(int(args[0]), float(args[1]))
            if answer.startswith("exit"):
                children.discard(int(args[0]))
            print(answer, flush=True)
        else:
            print(f"error unknown command {command!r}", flush=True)
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    serve()

"""One rank of an SFT stage under DeepSpeed ZeRO (`engine.kind: deepspeed`); the stage launches
it (training.distributed) as `python -m torch.distributed.run ... -m training.sft_worker
SPEC`.

Every rank builds the same examples and batch order as the single-process stage and runs the
same stepper (training.supervised) through the same loop (training.loop), over a DeepSpeed
engine: each rank takes its share of each global batch, its loss the sum over its target tokens
divided by the target tokens of the whole batch (the engine scales it by the world size, as
DeepSpeed averages the ranks' gradients), so each update is the single-process one. Gradient
clipping is ZeRO's (`gradient_clipping`), the learning-rate schedule the stage's LambdaLR,
stepped by the engine. Checkpoints are DeepSpeed's own, so a stopped run resumes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from configs.supervised import SFTConfig
from training.batches import lr_lambda, step_count
from training.collective import TorchCollective
from training.distributed import WorkerSpec
from training.engines import DeepSpeedEngine
from training.finite import NonFiniteLossError
from training.loop import run_loop
from training.supervised import SFTStepper, sft_plan

log = logging.getLogger("training.sft_worker")


def quiet_libraries() -> None:
    """Silence what every rank would print: DeepSpeed's info lines, torch.distributed's
    deprecation warnings at each ZeRO step, transformers' load and save progress bars."""
    from transformers.utils import logging as transformers_logging

    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated")
    for name in ("DeepSpeed", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    transformers_logging.disable_progress_bar()


def init_distributed() -> tuple[int, int]:
    """Join the process group (gloo on CPU); returns (rank, world size)."""
    import deepspeed
    import deepspeed.ops
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    backend = None
    if get_accelerator().device_name() == "cpu":
        # the CPU accelerator otherwise compiles a shared-memory all-reduce op (1-2 minutes of
        # gcc) at init; gloo carries every collective that training needs
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        backend = "gloo"
    deepspeed.init_distributed(dist_backend=backend)
    return dist.get_rank(), dist.get_world_size()


class MetricsFile:
    """Rank 0's logged steps, one JSON line each, for the stage to forward to its tracker."""

    def __init__(self, path: Path):
        self.path = path

    def log(self, metrics: dict[str, float], step: int) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"step": step, "metrics": metrics}) + "\n")


def rank_metrics(spec: WorkerSpec, rank: int) -> Callable[[dict[str, float], int], None]:
    """Where this rank logs: rank 0 to the metrics file the stage reads, the others nowhere."""
    return MetricsFile(spec.metrics_path).log if rank == 0 else lambda metrics, step: None


def save_full_model(state: dict[str, torch.Tensor], spec: WorkerSpec, tokenizer: Any) -> int:
    """Save the trained weights where the single-process stage saves its model; returns the
    parameter count."""
    from models.loading import load_model
    from models.saved import save_model

    model = load_model(spec.base)
    model.load_state_dict(state)
    return save_model(model, tokenizer, Path(spec.out_dir)).parameters


def write_result(spec: WorkerSpec, result: dict[str, Any]) -> None:
    partial = spec.result_path.with_suffix(".partial")
    partial.write_text(json.dumps({"fingerprint": spec.fingerprint, **result}))
    partial.replace(spec.result_path)


def run(spec: WorkerSpec) -> None:
    """This rank's part of the SFT run that `spec` describes."""
    import torch.distributed as dist

    from models.loading import load_model, load_tokenizer
    from training.examples import dataset_examples

    rank, world = init_distributed()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    quiet_libraries()
    config = SFTConfig.model_validate(spec.config)
    cfg = config.train
    tokenizer = load_tokenizer(spec.base)
    examples = dataset_examples(tokenizer, Path(spec.dataset), cfg.max_length)
    if not examples:
        raise ValueError(f"{spec.desc}: no training examples")
    steps = step_count(len(examples), cfg)
    engine = DeepSpeedEngine(
        load_model(spec.base),
        cfg.learning_rate,
        cfg.max_grad_norm,
        config.engine,
        world,
        cfg.weight_decay,
        lr_lambda(cfg, steps),
        sizes=(cfg.batch_size, cfg.batch_size // world),  # the global batch split evenly
    )
    pad_id = tokenizer.pad_token_id
    stepper = SFTStepper(
        engine, examples, cfg, pad_id, spec.desc, TorchCollective(), rank, world,
        memory=config.engine,
    )  # fmt: skip
    log.info("%s: ZeRO-%d, %d ranks, %d steps", spec.desc, config.engine.zero_stage, world, steps)
    plan = sft_plan(cfg, steps, spec.desc, show_progress=False)
    try:
        report = run_loop(
            stepper,
            plan,
            Path(spec.out_dir) / "checkpoints",
            spec.fingerprint,
            rank_metrics(spec, rank),
        )
    except NonFiniteLossError as error:
        if rank == 0:
            bad = {"step": error.step, "what": error.what, "value": error.value}
            write_result(spec, {"non_finite": bad})
        raise
    log.info("%s: %d steps in %.1f s", spec.desc, report.steps, report.seconds)
    state = engine.full_state_dict()
    if rank == 0:
        assert state is not None
        result = {
            "steps": report.steps,
            "resumed_from": report.resumed_from,
            "final_loss": report.last.get("train/loss", float("nan")),
            "tokens_per_second": stepper.tokens / max(report.seconds, 1e-9),
            "seconds": report.seconds,
            "parameters": save_full_model(state, spec, tokenizer),
            "optimizer": type(engine.engine.optimizer).__name__,  # the one DeepSpeed chose
        }
        write_result(spec, result)
    dist.barrier()
    dist.destroy_process_group()


def worker_main(run_rank: Callable[[WorkerSpec], None], argv: list[str] | None = None) -> None:
    """The entry point of a worker module: read the spec named on the command line and run this
    rank's part; a failing rank leaves its traceback for the stage's error message."""
    args = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    spec = WorkerSpec.read(Path(args[0]))
    try:
        run_rank(spec)
    except BaseException:
        # for the stage's error message: the launcher's own report buries the cause
        spec.error_path(int(os.environ.get("RANK", "0"))).write_text(traceback.format_exc())
        raise
    # the work is done and on disk: skip the interpreter's teardown of torch, transformers and
    # DeepSpeed, which takes seconds per rank and holds up the launcher's exit
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    worker_main(run)

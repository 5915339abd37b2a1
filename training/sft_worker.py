"""One rank of an SFT stage under DeepSpeed ZeRO (`engine.kind: deepspeed`); the stage launches
it (training.distributed) as `python -m torch.distributed.run ... -m training.sft_worker
SPEC`.

Every rank builds the same examples and batch order as the single-process loop and takes its
share of each global batch. Its loss is the sum over its target tokens divided by the target
tokens of the whole global batch, times the world size (DeepSpeed averages gradients over the
ranks), so each update is the one the single-process loop makes on the whole batch. Gradient
clipping is ZeRO's (`gradient_clipping`), the learning-rate schedule the loop's LambdaLR, stepped
by the engine. No checkpoints are written: a run that stops starts over.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from configs.supervised import SFTConfig, TrainConfig
from training import PROGRESS
from training.distributed import WorkerSpec, rank_share, target_count, zero_config
from training.engines import full_state_dict
from training.examples import Example
from training.finite import LossGuard, NonFiniteLossError
from training.loop import batch_inputs, batch_order, lr_lambda
from training.varlen import packed_attention

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


def build_engine(model: torch.nn.Module, config: SFTConfig, world: int, total_steps: int):
    """The DeepSpeed engine over `model` with the loop's AdamW and learning-rate schedule;
    returns (engine, scheduler)."""
    import deepspeed

    cfg = config.train
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
    )

    def schedule(wrapped: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(wrapped, lr_lambda(cfg, total_steps))

    engine, _, _, scheduler = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=schedule,
        config=zero_config(config.engine, cfg, world),
    )
    return engine, scheduler


def share_loss(
    engine: Any, batch: list[Example], cfg: TrainConfig, pad_id: int, rank: int, world: int
):
    """This rank's loss on its share of `batch`, scaled so that DeepSpeed's average of the ranks'
    gradients is the gradient of the whole batch's token-mean loss."""
    inputs = batch_inputs(cfg)(rank_share(batch, rank, world), pad_id)
    inputs = {key: value.to(engine.device) for key, value in inputs.items()}
    with packed_attention(engine):
        loss = engine(**inputs, num_items_in_batch=target_count(batch), use_cache=False).loss
    return loss * world


def global_loss(share: torch.Tensor, world: int) -> torch.Tensor:
    """The whole batch's loss (the same on every rank): the mean of the scaled shares."""
    import torch.distributed as dist

    total = share.detach().clone()
    dist.all_reduce(total)
    return total / world


class MetricsFile:
    """Rank 0's logged steps, one JSON line each, for the stage to forward to its tracker."""

    def __init__(self, path: Path):
        self.path = path

    def log(self, metrics: dict[str, float], step: int) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"step": step, "metrics": metrics}) + "\n")


def train_zero(
    model: torch.nn.Module,
    examples: list[Example],
    config: SFTConfig,
    pad_id: int,
    spec: WorkerSpec,
    rank: int,
    world: int,
) -> tuple[Any, dict[str, float]]:
    """Train as `training.loop.train` does on one process, logging the same metrics at the same
    steps; returns the engine and a report (steps, final loss, tokens per second, seconds)."""
    cfg = config.train
    order = batch_order(len(examples), cfg, [len(e.input_ids) for e in examples])
    engine, scheduler = build_engine(model, config, world, len(order))
    guard = LossGuard(spec.desc)
    metrics = MetricsFile(spec.metrics_path) if rank == 0 else None
    log.info(
        "%s: ZeRO-%d, %d ranks, %d steps", spec.desc, config.engine.zero_stage, world, len(order)
    )
    engine.train()
    loss_value, tokens, began = float("nan"), 0, time.perf_counter()
    for step, indices in enumerate(order):
        guard.step = done = step + 1
        batch = [examples[i] for i in indices]
        loss = share_loss(engine, batch, cfg, pad_id, rank, world)
        loss_value = guard.check("loss", global_loss(loss, world))  # every rank stops together
        engine.backward(loss)
        engine.step()  # a non-finite gradient norm makes DeepSpeed skip the update
        grad_norm = engine.get_global_grad_norm()
        if grad_norm is not None:
            guard.check("gradient norm", grad_norm)
        tokens += sum(len(e.input_ids) for e in batch)
        if metrics is not None and (done % cfg.log_every == 0 or done == len(order)):
            lr = scheduler.get_last_lr()[0]
            metrics.log(
                {"train/loss": loss_value, "train/lr": lr, PROGRESS: done / len(order)}, done
            )
            if done % (cfg.log_every * 10) == 0:
                log.info("%s: step %d/%d loss %.4f", spec.desc, done, len(order), loss_value)
    seconds = time.perf_counter() - began
    log.info("%s: %d steps in %.1f s, final loss %.4f", spec.desc, len(order), seconds, loss_value)
    report = {
        "steps": len(order),
        "final_loss": loss_value,
        "tokens_per_second": tokens / max(seconds, 1e-9),
        "seconds": seconds,
    }
    return engine, report


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
    tokenizer = load_tokenizer(spec.base)
    examples = dataset_examples(tokenizer, Path(spec.dataset), config.train.max_length)
    if not examples:
        raise ValueError(f"{spec.desc}: no training examples")
    model = load_model(spec.base)
    try:
        engine, report = train_zero(
            model, examples, config, tokenizer.pad_token_id, spec, rank, world
        )
    except NonFiniteLossError as error:
        if rank == 0:
            bad = {"step": error.step, "what": error.what, "value": error.value}
            write_result(spec, {"non_finite": bad})
        raise
    state = full_state_dict(engine, config.engine.zero_stage)
    if rank == 0:
        assert state is not None
        write_result(spec, {**report, "parameters": save_full_model(state, spec, tokenizer)})
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

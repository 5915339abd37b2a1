"""One rank of a GRPO stage under DeepSpeed ZeRO (`engine.kind: deepspeed`); the stage launches
it (training.distributed) as `python -m torch.distributed.run ... -m rl.grpo_worker SPEC`.

Every rank runs the same GRPOTrainer as the single-process stage, with a DeepSpeed engine for
its update and torch.distributed for what the ranks exchange: each rank samples and trains on its
share of each step's prompts. Rank 0 appends the logged steps to `metrics.jsonl` for the stage to
forward, writes the sample tables into the stage folder, and saves the trained model where the
single-process stage saves it. Checkpoints are DeepSpeed's own, committed by a record written
after every rank's shard is on disk, so a killed stage resumes from the last committed step.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from configs.reinforcement import GRPOConfig
from contracts.reward_names import PREFERENCE
from guard.paired import ITEMS
from models.loading import load_model, load_tokenizer
from problems.loader import load_problems
from rewards.registry import RewardFn
from rl.trainer import GRPOTrainer
from training.collective import TorchCollective
from training.distributed import WorkerSpec
from training.engines import DeepSpeedEngine
from training.finite import NonFiniteLossError
from training.sft_worker import (
    MetricsFile,
    init_distributed,
    quiet_libraries,
    save_full_model,
    worker_main,
    write_result,
)

log = logging.getLogger("rl.grpo_worker")

REWARD_MODEL = "reward_model"  # spec.extras: the preference reward model's folder, if any
HELDOUT = "heldout"  # spec.extras: the held-out problems the probe draws from, if it probes


def runtime_rewards(spec: WorkerSpec) -> dict[str, RewardFn]:
    """The rewards a model backs, rebuilt in this process from the folders the spec names."""
    if REWARD_MODEL not in spec.extras:
        return {}
    from preference.reward import PreferenceReward

    return {PREFERENCE: PreferenceReward(spec.extras[REWARD_MODEL])}


def probes_here(config: GRPOConfig, world: int) -> bool:
    """Whether DeepSpeed workers run the stage's held-out probe: with one rank (one GPU), the
    trainer's own, as a single process does. Over several ranks each would draw the whole probe
    (or, under ZeRO-3, every rank in step), so they do not probe: the stage says so."""
    return config.probe.every > 0 and world == 1


def worker_probe(spec: WorkerSpec, config: GRPOConfig, tokenizer, world: int):
    """The held-out probe the stage asked for (rl/heldout.py), when this world runs it."""
    if HELDOUT not in spec.extras or not probes_here(config, world):
        return None
    from rl.heldout import heldout_probe

    return heldout_probe(config, Path(spec.extras[HELDOUT]), tokenizer)


class ItemsForwarder:
    """The trainer's step hook in rank 0 of a probing world: the probe's per-problem items
    (`items/...`, which the trainer keeps in its history, not in what it logs) of every history
    entry not yet sent, written to the metrics file for the stage's guard to pair its readings
    on (stages/guarded.py `MetricsWatch`), each under the step of its entry."""

    def __init__(self, log: Callable[[dict[str, float], int], None]) -> None:
        self.log, self.sent = log, 0

    def __call__(self, step: int, history: list[dict[str, float]]) -> None:
        for entry in history[self.sent :]:
            items = {k: v for k, v in entry.items() if k.startswith(ITEMS)}
            if items:
                self.log(items, int(entry["step"]))
        self.sent = len(history)


def sample_writer(out_dir: Path):
    """Rank 0's sample tables, one JSON file per logged step, as the single-process stage writes
    them (the stage logs them to its tracker when the workers are done)."""
    out_dir.mkdir(parents=True, exist_ok=True)

    def write(step: int, rows: list[dict[str, Any]]) -> None:
        path = out_dir / f"step_{step:05d}.json"
        path.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")

    return write


def run(spec: WorkerSpec) -> None:
    """This rank's part of the GRPO run that `spec` describes."""
    import torch.distributed as dist

    rank, world = init_distributed()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    quiet_libraries()
    config = GRPOConfig.model_validate(spec.config)
    tokenizer = load_tokenizer(spec.base)
    problems = load_problems(spec.dataset)
    engine = DeepSpeedEngine(
        load_model(spec.base), config.learning_rate, config.max_grad_norm, config.engine, world
    )
    # sharded like the policy under ZeRO-3, in its precision: no rank holds a whole fp32 copy
    reference = engine.frozen_reference(load_model(spec.base)) if config.beta > 0 else None
    out_dir = Path(spec.out_dir)
    metrics = MetricsFile(spec.metrics_path) if rank == 0 else None
    trainer = GRPOTrainer(
        engine.module,
        tokenizer,
        config,
        metrics.log if metrics is not None else lambda m, s: None,
        sample_writer(out_dir / "samples") if rank == 0 else None,
        show_progress=False,
        extra_rewards=runtime_rewards(spec),
        engine=engine,
        collective=TorchCollective(),
        reference=reference,
        policy_path=spec.base,
        probe=worker_probe(spec, config, tokenizer, world),
    )
    if metrics is not None and trainer.probe is not None:
        trainer.on_step = ItemsForwarder(metrics.log)
    elif config.probe.every and rank == 0:
        log.warning("%s: no held-out probe over %d ranks (rl/grpo_worker.py probes_here)",
                    spec.desc, world)  # fmt: skip
    zero = config.engine.zero_stage
    log.info("%s: ZeRO-%d, %d ranks, %d steps", spec.desc, zero, world, config.steps)
    try:
        train_and_save(trainer, engine, spec, problems, tokenizer, rank)
    finally:
        # after the last collective: closing an in-process vLLM engine ends the process group
        trainer.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def train_and_save(trainer, engine: DeepSpeedEngine, spec: WorkerSpec, problems, tokenizer, rank):
    """Train, then save the whole model and the result from rank 0."""
    import torch.distributed as dist

    out_dir = Path(spec.out_dir)
    try:
        report = trainer.train(problems, out_dir / "checkpoints", spec.fingerprint)
    except NonFiniteLossError as error:
        if rank == 0:
            bad = {"step": error.step, "what": error.what, "value": error.value}
            write_result(spec, {"non_finite": bad})
        raise
    held = held_elements(engine.module) + held_elements(trainer.reference)
    state = engine.full_state_dict()
    if rank == 0:
        assert state is not None
        parameters = save_full_model(state, spec, tokenizer)
        write_result(
            spec,
            {
                "steps": report.steps,
                "resumed_from": report.resumed_from,
                "history": report.history,
                "seconds": report.seconds,
                "parameters": parameters,
                "held_elements": held,  # rank 0's model weights: policy and reference
            },
        )
    dist.barrier()


def held_elements(model: torch.nn.Module | None) -> int:
    """Weight elements this rank holds for `model`: its shard of a ZeRO-3 parameter
    (`ds_tensor`), else the whole parameter."""
    if model is None:
        return 0
    return sum(
        p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in model.parameters()
    )


if __name__ == "__main__":
    worker_main(run)

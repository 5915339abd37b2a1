"""Run by tests/training/test_engine_release.py in a process of its own (DeepSpeed needs a
torch.distributed group, and keeps module-level state): a DeepSpeed engine and its frozen
reference train a few SFT steps on CPU, then close; prints JSON with the module stack's length
after each step, the losses, and which of the engine's objects are still alive."""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from benchmarks.gpu_check import SHAPES, start_rank, word_tokenizer  # noqa: E402
from configs.supervised import EngineConfig, TrainConfig  # noqa: E402
from models.loading import build_model  # noqa: E402
from training.collective import TorchCollective  # noqa: E402
from training.engines import DeepSpeedEngine, close_engine  # noqa: E402
from training.examples import Example  # noqa: E402
from training.supervised import SFTStepper  # noqa: E402

LINEAR = torch.nn.functional.linear  # torch's own, before any engine


def train_and_close(zero_stage: int, checkpointing: bool, scan: bool = True) -> dict:
    from deepspeed.runtime.zero import parameter_offload

    spec, vocab = SHAPES["tiny"]
    tokenizer = word_tokenizer(vocab)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    engine_cfg = EngineConfig(
        kind="deepspeed", processes=1, zero_stage=zero_stage, bucket_size=2e8,
        gradient_checkpointing=checkpointing, overflow_scan=scan,
        precision="bf16" if zero_stage == 1 else "fp32",  # ZeRO-1: DeepSpeed's bf16 optimizer
    )  # fmt: skip
    engine = DeepSpeedEngine(build_model(spec, vocab, pad, eos, 0), 1e-3, 1.0, engine_cfg, world=1)
    reference = engine.frozen_reference(build_model(spec, vocab, pad, eos, 1))
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(16):
        ids = torch.randint(8, vocab, (40,), generator=generator).tolist()
        examples.append(Example(ids, ids))
    cfg = TrainConfig(batch_size=4, epochs=1, warmup_steps=0)
    memory = engine_cfg.model_copy(update={"micro_batch_tokens": 100})
    stepper = SFTStepper(engine, examples, cfg, pad, "release", TorchCollective(), memory=memory)
    stepper.start(0)
    stack, losses = [], []
    for step in range(3):
        losses.append(stepper.run_step(step)["train/loss"])
        stack.append(len(parameter_offload.FWD_MODULE_STACK))
        with torch.no_grad():
            reference(input_ids=torch.tensor([examples[0].input_ids]))
    watched = {
        "model": weakref.ref(engine.module),
        "optimizer": weakref.ref(engine.engine.optimizer),
        "parameter": weakref.ref(next(engine.module.parameters())),
        "reference": weakref.ref(reference.module),
    }
    engine.close()
    close_engine(reference)
    del engine, reference, stepper
    gc.collect()
    alive = sorted(name for name, ref in watched.items() if ref() is not None)
    return {"stack": stack, "losses": losses, "alive": alive,
            "stack_after": len(parameter_offload.FWD_MODULE_STACK),
            "linear_restored": torch.nn.functional.linear is LINEAR}  # fmt: skip


if __name__ == "__main__":
    start_rank("cpu")
    runs = {}
    for arg in sys.argv[1:]:
        stage, checkpointing = arg.split(":")
        runs[arg] = train_and_close(int(stage), checkpointing == "ckpt", checkpointing != "noscan")
    print("RESULT " + json.dumps(runs))

"""Run by tests/sampling/test_sampling_under_engine.py in a process of its own (DeepSpeed needs a
torch.distributed group and keeps module-level state): a policy wrapped by a ZeRO-`stage`
DeepSpeed engine on CPU samples from the engine's module and, beside it, from a bare copy of
the same weights; prints JSON with both samples' tokens, which decode steps ran through the
plain-ops step, and how many forwards of the wrapped model ran (DeepSpeed's hook counts them)."""

from __future__ import annotations

import copy
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

import sampling.decode as decode_module  # noqa: E402
from benchmarks.gpu_check import start_rank  # noqa: E402
from configs.supervised import EngineConfig  # noqa: E402
from sampling.hf import HFSampler  # noqa: E402
from sampling.interface import SamplingParams  # noqa: E402
from tests.tiny_models import gqa_model, make_tokenizer  # noqa: E402
from training.engines import DeepSpeedEngine  # noqa: E402

PROMPTS = ["What is 3 + 4?", "What is 12 + 7? Think.", "What"]
PARAMS = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24, seed=5)


def lean_steps() -> list[bool]:
    """Record, for every decode call, whether it got a plain-ops step."""
    seen: list[bool] = []
    original = decode_module.decode_step_for

    def recording(model, cache):
        step = original(model, cache)
        seen.append(step is not None)
        return step

    decode_module.decode_step_for = recording
    return seen


def sample(model: torch.nn.Module, tokenizer) -> list[list[int]]:
    sampler = HFSampler(model, tokenizer, batch_size=6, show_progress=False)
    out = sampler.generate(PROMPTS, 2, PARAMS)
    return [c.token_ids for group in out for c in group]


def main(stage: int) -> dict:
    start_rank("cpu")
    tokenizer = make_tokenizer()
    bare = gqa_model(tokenizer).eval()
    precision = "bf16" if stage == 1 else "fp32"  # ZeRO-1 is DeepSpeed's bf16 optimizer
    if precision == "bf16":
        bare = bare.to(torch.bfloat16)
    config = EngineConfig(
        kind="deepspeed", processes=1, zero_stage=stage, bucket_size=2e8, precision=precision
    )
    engine = DeepSpeedEngine(copy.deepcopy(bare), 1e-3, 1.0, config, world=1)
    forwards = [0]
    prologue = engine.engine._forward_prologue  # what DeepSpeed's hook runs on each forward

    def counting(inputs, kwargs):
        forwards[0] += 1
        return prologue(inputs, kwargs)

    engine.engine._forward_prologue = counting
    seen = lean_steps()
    bare_tokens = sample(bare, tokenizer)
    bare_lean = list(seen)
    seen.clear()
    engine_tokens = sample(engine.module, tokenizer)
    return {
        "bare": bare_tokens, "engine": engine_tokens, "bare_lean": bare_lean,
        "engine_lean": list(seen), "engine_forwards": forwards[0],
    }  # fmt: skip


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(int(sys.argv[1]))), flush=True)

"""The GPU check (benchmarks/gpu_check.py) run on CPU at the tiny shape: SFT, the sampler and GRPO
under DeepSpeed ZeRO-2 and ZeRO-3 with several micro-batches, and a recorded step that fails
inside its backward pass (as torch's allocation record did under ZeRO-3 on an H100) is reported
without spoiling the phase after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training import distributed

ROOT = Path(__file__).resolve().parents[2]

# Runs the check with its allocation record replaced by one that makes the recorded step's
# backward pass fail once, after some of the policy's gradients have reached ZeRO's buckets.
DRIVER = """
import contextlib, sys
import benchmarks.gpu_check as check
import training.engines as engines

engines_made = []

class Watched(engines.DeepSpeedEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        engines_made.append(self)

engines.DeepSpeedEngine = check.DeepSpeedEngine = Watched
failed = []

@contextlib.contextmanager
def failing_record(device):
    handles = []
    if not failed:  # the first recorded step (SFT's) fails inside its backward pass
        params = [p for p in engines_made[-1].module.parameters() if p.requires_grad]

        def fail(param):
            if not failed:
                failed.append(True)
                raise RuntimeError("injected failure inside the backward pass")

        handles.append(params[len(params) // 2].register_post_accumulate_grad_hook(fail))
    try:
        yield []
    finally:
        for handle in handles:
            handle.remove()

check.allocation_record = failing_record
sys.exit(check.main(sys.argv[1:]))
"""

ARGS = [
    "--device", "cpu", "--shape", "tiny", "--sft-steps", "1", "--sft-shapes", "4x96",
    "--micro-batch-tokens", "200", "--prompts", "4", "--n", "2", "--no-peer", "--no-attention",
    "--max-new-tokens", "16", "--grpo-steps", "1", "--grpo-prompts", "2", "--group", "4",
]  # fmt: skip


@pytest.mark.heavy
@pytest.mark.skipif(
    not distributed.deepspeed_installed(),
    reason="deepspeed is not installed (the `dev` extra installs it)",
)
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_a_failed_recorded_step_spoils_no_later_phase(tmp_path, zero_stage):
    out = tmp_path / "gpu_check.json"
    env = os.environ | {"DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, *ARGS, "--zero-stage", str(zero_stage), "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    phases = {p["name"].split(" ")[0]: p for p in json.loads(out.read_text())["phases"]}
    assert phases["sft"]["top_blocks"] == [
        "the recorded step failed (RuntimeError: injected failure inside the backward pass)"
    ]
    for name in ("sft", "hf", "grpo"):
        assert phases[name]["ok"], (name, phases[name]["error"][-2000:])
        assert phases[name]["tokens"] > 0, name
    assert "trained" in phases["grpo"]["note"]
    assert done.returncode == 0, done.stderr[-3000:]

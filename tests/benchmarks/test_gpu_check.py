"""The GPU check (benchmarks/gpu_check.py) run on CPU at the tiny shapes: SFT, the sampler and
GRPO under DeepSpeed ZeRO-2 and ZeRO-3 with several micro-batches, and a recorded step that fails
inside its backward pass (as torch's allocation record did under ZeRO-3 on an H100) is reported
without spoiling the phase after it; two shapes in one run, each with a fixed and a
variable-length SFT case beside the plain loop on the same rows, counted alike, each step
profiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_peers import micro_rows
from benchmarks.gpu_profile import union_ns
from benchmarks.gpu_shapes import (
    SHAPES,
    case_examples,
    loss_positions,
    parse_case,
    shape_cases,
    step_batches,
    trace_lengths,
)
from benchmarks.throughput import loss_training_flops, training_flops
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
@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_a_failed_recorded_step_spoils_no_later_phase(tmp_path, zero_stage):
    out = tmp_path / "gpu_check.json"
    env = os.environ | {"DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, *ARGS, "--zero-stage", str(zero_stage), "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())["shapes"]["tiny"]["phases"]
    phases = {p["name"].split(" ")[0]: p for p in results}
    assert phases["sft"]["top_blocks"] == [
        "the recorded step failed (RuntimeError: injected failure inside the backward pass)"
    ]
    for name in ("sft", "hf", "grpo"):
        assert phases[name]["ok"], (name, phases[name]["error"][-2000:])
        assert phases[name]["tokens"] > 0, name
    assert "trained" in phases["grpo"]["note"]
    assert done.returncode == 0, done.stderr[-3000:]


def test_trace_lengths_are_seeded_bounded_and_skewed_like_gsm8k_traces():
    lengths = trace_lengths(5000, 512, seed=3)
    assert lengths == trace_lengths(5000, 512, seed=3)
    assert min(lengths) >= 100 and max(lengths) <= 512
    middle = sum(150 <= n <= 300 for n in lengths) / len(lengths)
    assert 0.6 < middle < 0.75  # most around 150-300
    assert 0.05 < sum(n > 345 for n in lengths) / len(lengths) < 0.15  # a tail towards 512
    assert max(trace_lengths(100, 96, seed=0)) <= 96


def test_cases_size_variable_rows_to_the_fixed_case_tokens():
    fixed, variable = shape_cases("qwen2.5-1.5b", None)
    assert (fixed.rows, fixed.length, fixed.variable) == (16, 512, False)
    assert variable.variable and variable.name == "var512"
    assert abs(variable.rows * 232 - 16 * 512) < 232  # about as many tokens a step
    assert parse_case("var512@16384", None).rows == shape_cases("qwen2.5-0.5b", None)[1].rows
    assert "qwen2.5-1.5b" in SHAPES and SHAPES["qwen2.5-1.5b"][0].hidden_size == 1536
    with pytest.raises(ValueError):
        parse_case("512", None)


def test_rows_share_steps_and_loss_positions_skip_prompts():
    case = shape_cases("tiny", ["var96"])[0]
    examples = case_examples(case, 4096, steps=3)
    batches = step_batches(examples, case.rows)
    assert len(batches) == 3 and all(len(b) == case.rows for b in batches)
    for example in examples:
        prompt = sum(label == -100 for label in example.labels)
        assert loss_positions(example) == len(example.input_ids) - prompt > 0
    assert len({len(e.input_ids) for e in examples}) > 5


def test_loss_flops_count_the_head_only_where_loss_is():
    config = SHAPES["tiny"][0]

    class View:
        num_attention_heads, num_key_value_heads = config.num_heads, config.num_kv_heads
        hidden_size, num_hidden_layers = config.hidden_size, config.num_layers

    whole = training_flops(1000, View, [96, 50])
    assert loss_training_flops(1000, 300, View, [96, 50], 146) == whole
    assert whole - loss_training_flops(1000, 300, View, [96, 50], 100) == 6 * 300 * 46


def test_the_peer_accumulates_padded_micro_batches_within_its_budget():
    case = shape_cases("tiny", ["var96"])[0]
    batch = step_batches(case_examples(case, 4096, steps=1), case.rows)[0]
    parts = micro_rows(batch, 384)
    assert [e for part in parts for e in part] == batch
    assert all(len(p) * max(len(e.input_ids) for e in p) <= 384 for p in parts)
    assert micro_rows(batch, 10_000) == [batch]


def test_union_of_intervals_counts_overlaps_once():
    assert union_ns([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert union_ns([]) == 0


@pytest.mark.heavy
@pytest.mark.skipif(
    not distributed.deepspeed_installed(),
    reason="deepspeed is not installed (the `dev` extra installs it)",
)
def test_two_shapes_fixed_and_variable_cases_beside_the_peer_profiled(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = os.environ | {"DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [
        "--device", "cpu", "--shape", "tiny", "tiny-deeper", "--phases", "sft", "peer", "mixed",
        "--zero-stage", "2", "--sft-steps", "1", "--micro-batch-tokens", "200", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shapes = json.loads(out.read_text())["shapes"]
    assert list(shapes) == ["tiny", "tiny-deeper"]
    for result in shapes.values():
        assert [c["variable"] for c in result["cases"]] == [False, True]
        peers = result["peers"]["plain_loop"]
        names = [p["name"] for p in result["phases"]]
        assert names == [f"sft {case} ({engine})" for engine in ("zero-2", "one process, mixed")
                         for case in ("4x96", "var96")]  # fmt: skip
        for ours, peer in zip(result["phases"][:2], peers, strict=True):
            assert ours["ok"] and peer["ok"], (ours["error"], peer["error"])
            for key in ("tokens", "loss_tokens", "flops", "loss_flops"):
                assert ours[key] == peer[key], key  # the same rows, counted alike
            assert 0 < ours["loss_tokens"] < ours["tokens"]
            assert ours["loss_flops"] < ours["flops"]
            for profile in (ours["profile"], peer["profile"]):
                assert not profile["error"] and profile["events"] > 0
                # not a speed: the union of the intervals is at most their summed durations
                assert 0 < profile["busy_seconds"] <= profile["kernel_seconds"]
        for zero, mixed in zip(result["phases"][:2], result["phases"][2:], strict=True):
            assert mixed["ok"] and mixed["loss_tokens"] == zero["loss_tokens"], mixed["error"]
        fixed, variable = peers
        assert fixed["padded_positions"] == fixed["tokens"]
        assert variable["padded_positions"] > variable["tokens"]  # padded to the longest
    assert done.stdout.count("ours/peer") == 2
    assert "profiler: cpu ops busy" in done.stdout

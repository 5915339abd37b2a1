"""Preflight: every GPU training stage of a profile checked against the GPU's memory before
anything runs, by the memory model (training/memory.py).

For each stage that trains under DeepSpeed on a GPU, the model's shape is read from its
checkpoint's config.json (or the profile's own model spec), a micro-batch's worst case from the
settings (every row at its longest: `train.max_length` for SFT; for GRPO the data's longest
question, estimated from its characters, plus the template and `max_new_tokens`), and the
estimate's peak (the trainer's state, activations, logits, the optimizer step, and a colocated
vLLM engine's share while it samples) is compared with the device's memory less what torch's
allocator cannot use (the CUDA context and NCCL's buffers, fragmentation: HEADROOM). A stage
that cannot fit is refused with the settings that would make it fit, and by how much.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from configs.reinforcement import GRPOConfig
from configs.schema import PipelineConfig
from configs.supervised import EngineConfig, ModelConfig, TrainConfig
from problems.loader import ProblemFileError, read_problems
from training.memory import GiB, ModelShape, Placement, Step, step_estimate

HEADROOM_SHARE = 0.05  # fragmentation: what the allocator reserves beyond what it hands out
HEADROOM_BYTES = int(1.5 * GiB)  # the CUDA context, NCCL's buffers, cuBLAS workspaces
CHARS_PER_TOKEN = 3.0  # a conservative reading of English text by BPE tokenizers
TEMPLATE_TOKENS = 32  # the chat template's markers around a question
PROMPT_SAMPLE_ROWS = 20_000  # the rows read for the longest question


class MemoryFitError(ValueError):
    """A profile's training stage does not fit the GPU; the message says what to change."""


@dataclass(frozen=True)
class StageFit:
    key: str  # the stage's config key, e.g. "reasoning_rl"
    peak: int
    capacity: int
    lines: list[str]
    advice: list[str]

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity


def usable_bytes(total: int) -> int:
    return int(total * (1 - HEADROOM_SHARE)) - HEADROOM_BYTES


def gpu_total_bytes() -> int | None:
    """The first visible GPU's memory, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def model_shape(path: Path | None, spec: ModelConfig, vocab: int) -> ModelShape:
    """A checkpoint's shape from its config.json, else the profile's model spec."""
    if path is not None and (Path(path) / "config.json").is_file():
        try:
            return ModelShape.from_config(json.loads((Path(path) / "config.json").read_text()))
        except ValueError as err:  # sizes under names the memory model does not read
            raise MemoryFitError(f"{path}: {err}") from None
    return ModelShape(
        layers=spec.num_layers, hidden=spec.hidden_size, intermediate=spec.intermediate_size,
        heads=spec.num_heads, kv_heads=spec.num_kv_heads, vocab=vocab, tied=True,
        qkv_bias=spec.architecture == "qwen2",
    )  # fmt: skip


def longest_prompt_tokens(config: PipelineConfig) -> int:
    """The data's longest question in tokens (its first PROMPT_SAMPLE_ROWS rows, read as the
    problems stage reads them: JSONL, a JSON array or Parquet), estimated from characters (no
    tokenizer is loaded), plus the template's markers; the tiny world's questions are short."""
    files = config.data.files
    if config.data.source != "files" or files is None or not Path(files.train_path).is_file():
        return 128 + TEMPLATE_TOKENS
    try:
        problems, _ = read_problems(
            files.train_path, files.question_field, files.answer_field,
            limit=PROMPT_SAMPLE_ROWS, bad_rows="skip", max_row_chars=files.max_row_chars,
            tests_field=files.tests_field,
        )  # fmt: skip
    except ProblemFileError:  # the problems stage refuses the file, naming what is wrong
        return 128 + TEMPLATE_TOKENS
    longest = max(len(p.question) for p in problems)
    return math.ceil(longest / CHARS_PER_TOKEN) + TEMPLATE_TOKENS


def placement(engine: EngineConfig, reference: bool, engine_share: int, sleeps: bool) -> Placement:
    deepspeed = engine.kind == "deepspeed"
    return Placement(
        precision=engine.precision, zero_stage=engine.zero_stage if deepspeed else 0,
        world=engine.processes if deepspeed else 1,
        gradient_checkpointing=engine.gradient_checkpointing, reference=reference,
        bucket_elements=int(engine.bucket_size), engine_share_bytes=engine_share,
        engine_sleeps=sleeps, device="cuda",
    )  # fmt: skip


def micro_step(
    loss: str, per_row: int, completion: int, rows: int, per_micro: int, logits_budget: int,
    fused_head: bool = False,
) -> Step:  # fmt: skip
    """The worst micro-batch of a step of `rows` rows of `per_row` tokens (`completion` of them
    read by the loss, GRPO), `per_micro` rows to a micro-batch."""
    per_micro = max(1, min(rows, per_micro))
    read = per_row if loss == "sft" else completion
    return Step(
        per_micro * per_row, per_micro * read, loss,  # type: ignore[arg-type]
        logits_budget=logits_budget, micro_batches=math.ceil(rows / per_micro),
        fused_head=fused_head,
    )  # fmt: skip


def largest_fitting_rows(
    shape: ModelShape, place: Placement, loss: str, per_row: int, completion: int, rows: int,
    capacity: int, logits_budget: int, fused_head: bool = False,
) -> int:  # fmt: skip
    """The most rows a micro-batch can take within `capacity` bytes (the training moments only:
    a colocated engine's sampling moment does not depend on it); 1 when even one does not fit
    (the preflight says so)."""

    def fits(k: int) -> bool:
        step = micro_step(loss, per_row, completion, rows, k, logits_budget, fused_head)
        estimate = step_estimate(shape, place, step)
        return max(estimate.moment_bytes(m) for m in estimate.moments if m != "sampling") <= (
            capacity
        )

    low, high = 1, max(1, rows)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def rows_per_micro(
    engine: EngineConfig, shape: ModelShape, place: Placement, loss: str, per_row: int,
    completion: int, rows: int, total: int | None,
) -> int:  # fmt: skip
    """Rows to a micro-batch: as many as `engine.micro_batch_tokens` holds, or with `auto` the
    most that fit a device of `total` bytes (all of them without a device to fit)."""
    if engine.micro_batch_tokens != "auto":
        return max(1, min(rows, int(engine.micro_batch_tokens) // max(1, per_row)))
    if total is None:
        return max(1, rows)
    return largest_fitting_rows(
        shape, place, loss, per_row, completion, rows, usable_bytes(total), engine.logits_budget,
        engine.fused_head,
    )  # fmt: skip


def micro_batch_tokens(
    engine: EngineConfig, model, loss: str, per_row: int, completion: int, rows: int,
    reference: bool = False,
) -> int:  # fmt: skip
    """`engine.micro_batch_tokens` for a step of `model` (on its device) of `rows` rows of up to
    `per_row` tokens: as set, or with `auto` the largest that the memory model fits the device's
    memory (its whole, less HEADROOM), in whole rows."""
    if engine.micro_batch_tokens != "auto":
        return int(engine.micro_batch_tokens)
    import torch

    device = next(model.parameters()).device
    total = None
    if device.type == "cuda":
        total = int(torch.cuda.get_device_properties(device).total_memory)
    shape = ModelShape.from_config(unwrapped_config(model))
    place = placement(engine, reference, 0, True)
    return per_row * rows_per_micro(engine, shape, place, loss, per_row, completion, rows, total)


def unwrapped_config(model) -> dict:
    inner = getattr(model, "module", model)
    return inner.config.to_dict()


def sft_step(train: TrainConfig, engine: EngineConfig, shape: ModelShape, total: int) -> Step:
    """The worst micro-batch of an SFT step: every row at `max_length`."""
    rows = max(1, train.batch_size // engine.processes)
    place = placement(engine, False, 0, True)
    per = train.max_length
    k = rows_per_micro(engine, shape, place, "sft", per, per, rows, total)
    return micro_step("sft", per, per, rows, k, engine.logits_budget, engine.fused_head)


def grpo_step(cfg: GRPOConfig, prompt_tokens: int, shape: ModelShape, total: int) -> Step:
    """The worst micro-batch of a GRPO update: every row at the longest prompt + cap."""
    engine = cfg.engine
    rows = max(1, cfg.prompts_per_step // engine.processes) * cfg.group_size
    per_row = prompt_tokens + cfg.max_new_tokens
    place = placement(engine, cfg.beta > 0, 0, True)
    k = rows_per_micro(engine, shape, place, "grpo", per_row, cfg.max_new_tokens, rows, total)
    return micro_step(
        "grpo", per_row, cfg.max_new_tokens, rows, k, engine.logits_budget, engine.fused_head
    )


def gpu_stages(config: PipelineConfig) -> Iterator[tuple[str, str, object, ModelShape]]:
    """(config key, "sft" | "grpo", stage config, model shape) of every stage that trains under
    DeepSpeed (the GPU path)."""
    boot = config.bootstrap
    policy = model_shape(boot.path, boot.model, boot.vocab_size)
    sft = {"cold_start_sft": config.cold_start_sft, "mixed_sft": config.mixed_sft}
    for key, stage in sft.items():
        if stage.engine.kind == "deepspeed":
            yield key, "sft", (stage.train, stage.engine), policy
    for key in ("r1_zero", "reasoning_rl", "all_scenarios_rl"):
        cfg = getattr(config, key)
        if cfg.engine.kind == "deepspeed":
            yield key, "grpo", cfg, policy
    distill = config.distillation
    for i, student in enumerate(distill.students):
        spec = student.model or boot.model
        shape = model_shape(student.path, spec, boot.vocab_size)
        if distill.engine.kind == "deepspeed":
            yield f"distillation.students[{i}] sft", "sft", (distill.sft, distill.engine), shape
        if distill.rl_twins and distill.rl_twin.engine.kind == "deepspeed":
            yield f"distillation.students[{i}] rl_twin", "grpo", distill.rl_twin, shape


def stage_fit(
    key: str, kind: str, stage: object, shape: ModelShape, total: int, prompt_tokens: int
) -> StageFit:
    capacity = usable_bytes(total)
    estimate = estimate_for(kind, stage, shape, total, prompt_tokens)
    advice = []
    if estimate.peak > capacity:
        advice = remedies(key, kind, stage, shape, total, prompt_tokens)
    return StageFit(key, estimate.peak, capacity, estimate.lines(), advice)


def estimate_for(kind: str, stage: object, shape: ModelShape, total: int, prompt_tokens: int):
    if kind == "sft":
        train, engine = stage  # type: ignore[misc]
        step = sft_step(train, engine, shape, total)
        return step_estimate(shape, placement(engine, False, 0, True), step)
    cfg: GRPOConfig = stage  # type: ignore[assignment]
    colocated = cfg.sampler.backend == "vllm"
    share = int(cfg.sampler.gpu_memory_utilization * total) if colocated else 0
    place = placement(cfg.engine, cfg.beta > 0, share, cfg.sampler.sleep_mode)
    return step_estimate(shape, place, grpo_step(cfg, prompt_tokens, shape, total))


def remedies(
    key: str, kind: str, stage: object, shape: ModelShape, total: int, prompt_tokens: int
) -> list[str]:
    """Settings that would make the stage fit, each alone, with the peak they give."""
    capacity = usable_bytes(total)
    engine = stage[1] if kind == "sft" else stage.engine  # type: ignore[index,attr-defined]
    out = []

    def with_engine(**changes) -> object:
        new = engine.model_copy(update=changes)
        if kind == "sft":
            return (stage[0], new)  # type: ignore[index]
        return stage.model_copy(update={"engine": new})  # type: ignore[attr-defined]

    def peak(candidate: object) -> int:
        return estimate_for(kind, candidate, shape, total, prompt_tokens).peak

    def fits(micro: int) -> bool:
        return peak(with_engine(micro_batch_tokens=micro)) <= capacity

    current = engine.micro_batch_tokens
    if current != "auto" and fits(1):
        low, high = 1, current
        while low < high:  # the largest micro-batch that fits
            mid = (low + high + 1) // 2
            low, high = (mid, high) if fits(mid) else (low, mid - 1)
        out.append(f"{key}.engine.micro_batch_tokens: {current} -> {low} or less")
    if not engine.gradient_checkpointing:
        ckpt = peak(with_engine(gradient_checkpointing=True))
        if ckpt <= capacity:
            out.append(f"{key}.engine.gradient_checkpointing: true (peak {ckpt / GiB:.1f} GiB)")
    sampler = getattr(stage, "sampler", None)
    if sampler is not None and sampler.backend == "vllm" and not sampler.sleep_mode:
        out.append(f"{key}.sampler.sleep_mode: true (the engine's share is free for the update)")
    for larger in range(engine.zero_stage + 1, 4):  # more of the state sharded
        sharded = peak(with_engine(zero_stage=larger))
        if sharded <= capacity:
            out.append(f"{key}.engine.zero_stage: {larger} (peak {sharded / GiB:.1f} GiB)")
            break
    if not out:
        out.append(
            "no single setting fits it: more processes (GPUs) with zero_stage 3, a smaller "
            "model, or shorter sequences"
        )
    return out


def memory_fits(config: PipelineConfig, total: int) -> list[StageFit]:
    """Each GPU training stage's estimate against a device of `total` bytes."""
    prompt_tokens = longest_prompt_tokens(config)
    return [
        stage_fit(key, kind, stage, shape, total, prompt_tokens)
        for key, kind, stage, shape in gpu_stages(config)
    ]


# fp32 weights, their gradients and AdamW's two moments: the least a model trained here holds
TRAINED_BYTES_PER_PARAMETER = 16


def scratch_models(config: PipelineConfig) -> dict[str, ModelShape]:
    """The models a run builds from nothing, by the setting that sizes each: the tiny world's
    base (no `bootstrap.path`) and each student given a `model` and no `path`."""
    vocab = config.bootstrap.vocab_size
    found = {}
    if config.bootstrap.path is None:
        found["bootstrap.model"] = model_shape(None, config.bootstrap.model, vocab)
    for i, student in enumerate(config.distillation.students):
        if student.path is None and student.model is not None:
            found[f"distillation.students.{i}.model"] = model_shape(None, student.model, vocab)
    return found


def check_host_model_sizes(config: PipelineConfig, source: str, memory: int | None = None) -> None:
    """Raise MemoryFitError naming each model built from nothing whose training state (weights,
    gradients, AdamW's moments) exceeds the machine's memory (or `memory` bytes): a size
    mistyped by orders of magnitude, refused before anything runs."""
    import psutil

    total = memory if memory is not None else psutil.virtual_memory().total
    over = {
        key: shape.parameters
        for key, shape in scratch_models(config).items()
        if shape.parameters * TRAINED_BYTES_PER_PARAMETER > total
    }
    if over:
        lines = [f"{source}: {len(over)} model(s) to train cannot fit this machine's "]
        lines[0] += f"{total / GiB:.1f} GiB of memory; nothing has run:"
        lines += [
            f"  {key}: {n:.3g} parameters, at least "
            f"{n * TRAINED_BYTES_PER_PARAMETER / GiB:.3g} GiB to train (fp32 weights, gradients, "
            "AdamW's moments)"
            for key, n in over.items()
        ]
        raise MemoryFitError("\n".join(lines))


def check_memory_fit(config: PipelineConfig, source: str, total: int | None = None) -> None:
    """Raise MemoryFitError naming each model built from nothing that this machine cannot hold
    (`check_host_model_sizes`), and every GPU stage that cannot fit the GPU found here (or
    `total` bytes) and what to change; no GPU check without a GPU or GPU stages."""
    check_host_model_sizes(config, source)
    total = total if total is not None else gpu_total_bytes()
    if total is None:
        return
    misfits = [fit for fit in memory_fits(config, total) if not fit.fits]
    if not misfits:
        return
    lines = [
        f"{source}: {len(misfits)} training stage(s) cannot fit this GPU's "
        f"{total / GiB:.0f} GiB ({usable_bytes(total) / GiB:.1f} GiB usable); nothing has run:"
    ]
    for fit in misfits:
        lines.append(f"  {fit.key}: needs {fit.peak / GiB:.1f} GiB ({fit.lines[0]})")
        lines += [f"    {line}" for line in fit.lines[1:]]
        lines += [f"    fits with: {advice}" for advice in fit.advice]
    lines.append("The estimate and what it counts: training/memory.py; docs/gpu.md, 'Memory'.")
    raise MemoryFitError("\n".join(lines))

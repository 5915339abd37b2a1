"""The GPU check's phases on our own stack (benchmarks/gpu_check.py runs them, each on an engine of
its own): SFT steps through training.supervised.SFTStepper, our HF sampler, and whole GRPO steps
through rl.trainer.GRPOTrainer, with the update timed apart from sampling.

Each phase returns a Phase: tokens, seconds and the FLOPs it counted (benchmarks/throughput.py:
6N a trained token, 2N a prefilled or generated one, attention on top), the allocator's peak and
the memory model's prediction for the same micro-batch. SFT's also counts the positions that carry
loss and the FLOPs over them, and the device's busy time in one profiled step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from benchmarks.gpu_profile import profile_step
from benchmarks.gpu_shapes import SFTCase, count_batches, sft_config
from benchmarks.throughput import attention_flops, training_flops
from configs.reinforcement import GRPOConfig, RewardTerm
from configs.supervised import EngineConfig, ModelConfig
from contracts.reward_names import PREFERENCE
from models.chat import render_prompt
from models.loading import build_model
from problems.types import Problem
from training.examples import Example
from training.memory import ModelShape, Placement, Step, step_estimate
from training.memory_fit import micro_step
from training.micro import micro_batches


@dataclass
class Phase:
    name: str
    ok: bool = False
    seconds: float = 0.0
    tokens: int = 0
    flops: float = 0.0
    peak_bytes: int | None = None
    predicted_bytes: int | None = None
    held_before: int = 0  # device bytes allocated when the phase started
    note: str = ""
    error: str = ""
    top_blocks: list[str] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)  # sub-timings: the GRPO update's
    steps: int = 0  # timed steps (SFT)
    loss_tokens: int = 0  # positions that carry loss (SFT; 0 where not counted)
    loss_flops: float = 0.0  # the FLOPs counted over them (benchmarks/throughput.py)
    profile: dict = field(default_factory=dict)  # one step under the profiler (gpu_profile.py)


@dataclass(frozen=True)
class Setting:
    """How a run of the check trains: its engine's settings."""

    device: str
    zero_stage: int
    gradient_checkpointing: bool
    micro_batch_tokens: int | str
    logits_chunk_mb: float
    compile: bool = False
    mixed: bool = False  # one process's bf16 engine with fp32 master weights (training/mixed.py)
    fused_head: bool = False  # the chunked head's elementwise work compiled (fused_head.py)
    overflow_scan: bool = True  # False: DeepSpeed's bf16 overflow scan off, the norm checked

    def engine(self) -> EngineConfig:
        return EngineConfig(
            kind="single" if self.mixed else "deepspeed", processes=1, zero_stage=self.zero_stage,
            precision="bf16" if self.device == "cuda" or self.zero_stage == 1 else "fp32",
            bucket_size=2e8,
            micro_batch_tokens=self.micro_batch_tokens, compile=self.compile,
            gradient_checkpointing=self.gradient_checkpointing,
            logits_chunk_mb=self.logits_chunk_mb, fused_head=self.fused_head,
            overflow_scan=self.overflow_scan,
        )  # fmt: skip

    def placement(self, reference: bool) -> Placement:
        cfg = self.engine()
        return Placement(
            precision=cfg.precision, zero_stage=cfg.zero_stage, world=1, reference=reference,
            gradient_checkpointing=cfg.gradient_checkpointing,
            bucket_elements=int(cfg.bucket_size), device=self.device,  # type: ignore[arg-type]
        )  # fmt: skip

    @property
    def label(self) -> str:
        extras = [
            " ckpt" if self.gradient_checkpointing else "",
            " compiled" if self.compile else "",
            " fused head" if self.fused_head else "",
            " no scan" if not self.overflow_scan else "",
        ]
        if self.mixed:
            return f"one process, mixed{''.join(extras)}"
        return f"zero-{self.zero_stage}{''.join(extras)}"


def synchronized(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(device: torch.device, fn: Callable[[], int]) -> tuple[float, int]:
    synchronized(device)
    began = time.perf_counter()
    out = fn()
    synchronized(device)
    return time.perf_counter() - began, out


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def read_peak(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated()) if device.type == "cuda" else None


Diagnose = Callable[[Phase, Callable[[], object]], None]


def sft_phase(
    setting: Setting, shape: ModelShape, engine, tokenizer, n_flop: int, n_head: int,
    case: SFTCase, examples: list[Example], steps: int, diagnose: Diagnose,
) -> Phase:  # fmt: skip
    """`steps` timed SFT steps of `case` on `examples` (benchmarks/gpu_shapes.py: a warm-up
    step's, the timed ones', a profiled step's and a recorded step's rows), after the warm-up;
    then the profiled step and the recorded one."""
    from training.collective import TorchCollective
    from training.supervised import SFTStepper

    phase = Phase(f"sft {case.name} ({setting.label})")
    stepper = SFTStepper(
        engine, examples, sft_config(case.rows), tokenizer.pad_token_id, "gpu-check sft",
        TorchCollective(), memory=setting.engine(),
    )  # fmt: skip
    stepper.start(0)
    stepper.run_step(0)  # warm-up: kernels, the allocator, AdamW's moments
    device = next(engine.module.parameters()).device
    reset_peak(device)
    seconds, _ = timed(device, lambda: [stepper.run_step(i) for i in range(1, steps + 1)])
    phase.peak_bytes = read_peak(device)
    phase.profile = profile_step(device, lambda: stepper.run_step(steps + 1))
    diagnose(phase, lambda: stepper.run_step(steps + 2))  # last: it may fail inside backward
    batches = [[examples[i] for i in stepper.order[s]] for s in range(1, steps + 1)]
    step = _worst_micro_batch(batches, stepper.micro_batch_tokens, setting)
    if not setting.compile and not setting.mixed:  # compiled layers fuse away activations the
        # model counts; the memory model has no one-process mixed engine yet
        phase.predicted_bytes = step_estimate(shape, setting.placement(False), step).peak
    count = count_batches(batches, n_flop, n_head, engine.module.config)
    phase.seconds, phase.steps = seconds, steps
    phase.tokens, phase.flops = count.tokens, count.flops
    phase.loss_tokens, phase.loss_flops = count.loss_tokens, count.loss_flops
    phase.note = (
        f"{steps} steps of {case.rows} rows, {count.tokens / steps:,.0f} tokens each; "
        f"micro-batches of up to {step.tokens:,} tokens ({step.micro_batches} a step)"
    )
    return phase


def _worst_micro_batch(batches: list[list[Example]], budget: int, setting: Setting) -> Step:
    """The largest micro-batch SFTStepper packs from `batches` within `budget` tokens, and the
    most micro-batches a step: what the memory model predicts the peak of."""
    worst, most = 1, 1
    for batch in batches:
        lengths = [len(e.input_ids) for e in batch]
        groups = micro_batches(lengths, budget)
        worst = max([worst, *(sum(lengths[i] for i in g) for g in groups)])
        most = max(most, len(groups))
    budget_elements = setting.engine().logits_budget
    return Step(worst, worst, "sft", logits_budget=budget_elements, micro_batches=most,
                fused_head=setting.fused_head)  # fmt: skip


@contextlib.contextmanager
def _sampler_for(model, tokenizer, batch: int) -> Iterator:
    from sampling.hf import HFSampler
    from training.collective import TorchCollective
    from training.whole_copy import zero3_sampling

    options = zero3_sampling(model, TorchCollective(), "auto")
    sampler = HFSampler(model, tokenizer, batch_size=batch, show_progress=False, **options)
    try:
        yield sampler
    finally:
        sampler.close()


def sample_phase(setting: Setting, model, tokenizer, n_flop: int, args) -> Phase:
    """One generate call of `args.prompts` prompts x `args.n` samples (a ZeRO-3 model through
    a whole copy gathered once, when it fits: training/whole_copy.py)."""
    from sampling.interface import SamplingParams

    phase = Phase(f"hf sampler ({setting.label})")
    prompts = [
        render_prompt(tokenizer, " ".join(f"w{100 + 7 * i + j}" for j in range(48)))
        for i in range(args.prompts)
    ]
    params = SamplingParams(1.0, 1.0, args.max_new_tokens, seed=0)
    device = next(model.parameters()).device
    with _sampler_for(model, tokenizer, args.sample_batch) as sampler:
        sampler.generate(prompts[:2], 1, SamplingParams(1.0, 1.0, 8))
        reset_peak(device)
        seconds, groups = timed(device, lambda: sampler.generate(prompts, args.n, params))
    lengths = [len(x) for x in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    generated = [len(c.token_ids) for g in groups for c in g]
    context = sum(lengths) / len(lengths) + args.max_new_tokens / 2  # a decoded token's, mean
    config = model.config
    phase.peak_bytes = read_peak(device)
    phase.seconds, phase.tokens = seconds, sum(generated)
    phase.flops = 2.0 * n_flop * (sum(generated) + sum(lengths))
    phase.flops += attention_flops(config, [1] * sum(generated), passes=1) * 2 * context
    phase.flops += attention_flops(config, lengths, passes=1)
    phase.note = f"{args.prompts} prompts x {args.n} samples, up to {args.max_new_tokens} tokens"
    return phase


def parity_reward(prompts, completions, **_: object) -> list[float]:
    """The share of a completion's words with an even index: random text scores about 0.5,
    differently for each sample, so every group has a spread to learn from."""
    scores = []
    for text in completions:
        words = [w for w in text.split() if w[:1] == "w" and w[1:].isdigit()]
        scores.append(sum(int(w[1:]) % 2 == 0 for w in words) / max(1, len(words)))
    return scores


class TimedUpdate:
    """The trainer's update, timed apart from sampling, with its peak and the rows it trained."""

    def __init__(self, update, device: torch.device):
        self.update, self.device = update, device
        self.seconds, self.lengths, self.peaks, self.budgets = 0.0, [], [], []
        self.recording = True

    def __call__(self, rows, fallback):
        reset_peak(self.device)
        seconds, out = timed(self.device, lambda: self.update(rows, fallback))
        if self.recording:
            self.seconds += seconds
            prompts = self.update.tokenizer(rows.prompts, add_special_tokens=False)["input_ids"]
            self.lengths += [
                len(p) + len(c) for p, c in zip(prompts, rows.completions, strict=True)
            ]
            peak = read_peak(self.device)
            if peak is not None:
                self.peaks.append(peak)
        return out


def grpo_phase(
    setting: Setting, shape: ModelShape, engine, tokenizer, spec: ModelConfig, n_flop: int, args,
    diagnose: Diagnose,
) -> Phase:  # fmt: skip
    """Whole GRPO steps (sampling, scoring, the micro-batched update with a frozen reference of
    another random model and the TIS correction), after one warm-up step."""
    from rl.trainer import GRPOTrainer, prompt_order
    from training.collective import TorchCollective
    from training.engines import close_engine

    phase = Phase(f"grpo ({setting.label}, ref)")
    cfg = GRPOConfig(
        steps=args.grpo_steps + 1, prompts_per_step=args.grpo_prompts, group_size=args.group,
        max_new_tokens=args.max_new_tokens, learning_rate=1e-6, beta=0.04,
        rewards=[RewardTerm(name=PREFERENCE)], engine=setting.engine(),
        importance_sampling_cap=2.0, checkpoint_every=10_000, samples_every=10_000,
        mask_truncated=False,  # a random model never ends a turn: every sample runs to the cap
    )  # fmt: skip
    reference = engine.frozen_reference(
        build_model(spec, shape.vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 1)
    )
    trainer = None
    try:
        trainer = GRPOTrainer(
            engine.module, tokenizer, cfg, lambda m, s: None, show_progress=False,
            extra_rewards={PREFERENCE: parity_reward}, engine=engine, collective=TorchCollective(),
            reference=reference,
        )  # fmt: skip
        device = next(engine.module.parameters()).device
        timer = TimedUpdate(trainer.update, device)
        trainer.update = timer  # type: ignore[assignment]
        problems = [
            Problem(f"p{i}", " ".join(f"w{50 + 3 * i + j}" for j in range(48)), "0", kind="general")
            for i in range(64)
        ]
        trainer.open_sampler(problems)
        order = prompt_order(len(problems), cfg.steps, cfg.prompts_per_step, 0)
        timer.recording = False
        trainer.step(0, [problems[i] for i in order[0]])  # warm-up
        timer.recording = True
        history: list[dict[str, float]] = []
        seconds, _ = timed(
            device,
            lambda: [
                history.append(trainer.step(s, [problems[i] for i in order[s]]))
                for s in range(1, cfg.steps)
            ],
        )
        timer.recording = False
        diagnose(phase, lambda: trainer.step(cfg.steps, [problems[i] for i in order[0]]))
    finally:
        if trainer is not None:
            trainer.close()
        close_engine(reference)
    _grpo_figures(phase, setting, shape, cfg, tokenizer, problems, history, timer, n_flop, seconds)
    return phase


def _grpo_figures(phase, setting, shape, cfg, tokenizer, problems, history, timer, n_flop, seconds):
    """The phase's tokens, FLOPs (sampling: 2N a prefilled or generated token; the update: the
    policy's training step and the reference's forward pass over each trained row), the
    update's share, and the memory model's prediction for its micro-batch."""
    config_lengths = timer.lengths
    rendered = render_prompt(tokenizer, problems[0].question)
    prompt = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    rows = cfg.prompts_per_step * cfg.group_size * len(history)
    generated = (
        sum(m["completion/mean_tokens"] for m in history) * cfg.prompts_per_step * cfg.group_size
    )
    model_config = _Config(shape)
    update_flops = training_flops(n_flop, model_config, config_lengths)
    update_flops += 2.0 * n_flop * sum(config_lengths)  # the reference's forward pass
    update_flops += attention_flops(model_config, config_lengths, passes=1)
    sampling = 2.0 * n_flop * (generated + rows * prompt / cfg.group_size)
    phase.flops = sampling + update_flops
    phase.seconds, phase.tokens = seconds, int(generated + sum(config_lengths))
    phase.parts = {
        "update_seconds": timer.seconds, "update_tokens": float(sum(config_lengths)),
        "update_flops": update_flops,
        "sample_seconds": sum(m.get("time/sample_seconds", 0.0) for m in history),
        "signals_seconds": sum(m.get("time/signals_seconds", 0.0) for m in history),
    }  # fmt: skip
    phase.peak_bytes = max(timer.peaks) if timer.peaks else None
    per_row = prompt + cfg.max_new_tokens
    total_rows = cfg.prompts_per_step * cfg.group_size
    budget = _update_budget(setting, shape, cfg, per_row, total_rows)
    step = micro_step("grpo", per_row, cfg.max_new_tokens, total_rows, budget // per_row,
                      cfg.engine.logits_budget, cfg.engine.fused_head)  # fmt: skip
    phase.predicted_bytes = step_estimate(shape, setting.placement(True), step).peak
    last = history[-1] if history else {}
    trained = sum(m["samples/trained"] for m in history)
    kl, ratio = last.get("kl", float("nan")), last.get("tis/mean_ratio", float("nan"))
    phase.note = (
        f"{len(history)} steps of {cfg.prompts_per_step} x {cfg.group_size}; trained "
        f"{trained:.0f}/{rows} samples in micro-batches of {budget // per_row} rows; kl "
        f"{kl:.2e}, tis ratio {ratio:.3f}"
    )


def _update_budget(
    setting: Setting, shape: ModelShape, cfg: GRPOConfig, per_row: int, rows: int
) -> int:
    """The update's micro-batch in tokens, as the trainer resolves it (`auto`: the most rows the
    memory model fits the device)."""
    from training.memory_fit import rows_per_micro

    total = None
    if setting.device == "cuda":
        total = int(torch.cuda.get_device_properties(0).total_memory)
    place = setting.placement(True)
    k = rows_per_micro(
        setting.engine(), shape, place, "grpo", per_row, cfg.max_new_tokens, rows, total
    )
    return per_row * k


class _Config:
    """A transformers-config-like view of a shape, for the FLOP counts."""

    def __init__(self, shape: ModelShape):
        self.num_attention_heads = shape.heads
        self.num_key_value_heads = shape.kv_heads
        self.hidden_size = shape.hidden
        self.head_dim = shape.head_dim or shape.hidden // shape.heads
        self.num_hidden_layers = shape.layers

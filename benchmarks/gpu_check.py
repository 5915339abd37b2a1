"""The GPU path checked on a bare GPU machine: no network, no vLLM, no checkpoint.

    python -m benchmarks.gpu_check                      # Qwen2.5-0.5B's shape, on CUDA
    python -m benchmarks.gpu_check --shape tiny --device cpu   # the script itself, here

A model of Qwen2.5-0.5B's shape (24 layers, d=896, 14 heads over 2 KV heads, MLP 4,864, a
151,936-token vocabulary, tied embeddings) with random weights, and a word-level tokenizer of
the same vocabulary made here, go through what a GPU run of the recipe does, in one process
(rank 0 of 1):
1. SFT steps under DeepSpeed ZeRO-2 in bf16 (training.supervised.SFTStepper, micro-batches);
2. our HF sampler generating from the bf16 policy on CUDA (sampling.hf.HFSampler);
3. GRPO steps (rl.trainer.GRPOTrainer: sampling, scoring, the micro-batched update with a
   frozen bf16 reference, beta > 0), the reward a word-parity score that varies within each
   group.
Each phase runs on an engine of its own over a fresh model, closed after it: a step that fails
inside its backward pass leaves ZeRO's buckets holding gradients, which the next phase would
trip on.
For each it prints tokens/s and MFU (benchmarks/throughput.py: 6N a trained token, 2N a
generated or prefilled one) and, for the training steps, the peak of torch's allocator
(`torch.cuda.max_memory_allocated`) against the memory model's prediction
(training/memory.py). It exits 1 when a phase fails or a peak is more than `--tolerance` off
the prediction, and writes everything it printed, with the allocator's largest live blocks at
each peak, to `--out` (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.throughput import flop_parameters, peak_tflops  # noqa: E402
from configs.reinforcement import GRPOConfig, RewardTerm  # noqa: E402
from configs.supervised import EngineConfig, ModelConfig, TrainConfig  # noqa: E402
from contracts.reward_names import PREFERENCE  # noqa: E402
from models.chat import CHAT_TEMPLATE, IM_END, PAD, SPECIAL_TOKENS, render_prompt  # noqa: E402
from models.loading import build_model  # noqa: E402
from problems.types import Problem  # noqa: E402
from training.engines import DeepSpeedEngine  # noqa: E402
from training.examples import Example  # noqa: E402
from training.memory import GiB, ModelShape, Placement, Step, step_estimate  # noqa: E402

LEFT_OVER = 256 * 2**20  # device bytes still held when a phase starts that are worth a note

SHAPES: dict[str, tuple[ModelConfig, int]] = {
    "qwen2.5-0.5b": (
        ModelConfig(
            architecture="qwen2", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
            intermediate_size=4864, max_position_embeddings=32768,
        ),
        151936,
    ),
    "tiny": (
        ModelConfig(
            hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
        ),
        4096,
    ),
}  # fmt: skip


@dataclass
class Phase:
    name: str
    ok: bool = False
    seconds: float = 0.0
    tokens: int = 0
    flops: float = 0.0
    peak_bytes: int | None = None
    predicted_bytes: int | None = None
    note: str = ""
    error: str = ""
    top_blocks: list[str] = field(default_factory=list)

    def row(self, peak: float | None) -> str:
        rate = self.tokens / self.seconds if self.seconds else 0.0
        mfu = (
            ""
            if peak is None or not self.seconds
            else f"{self.flops / self.seconds / 1e12 / peak:.1%}"
        )
        memory = ""
        if self.peak_bytes is not None:
            memory = f"{self.peak_bytes / GiB:.2f} GiB"
            if self.predicted_bytes:
                ratio = self.peak_bytes / self.predicted_bytes
                memory += f" (model {self.predicted_bytes / GiB:.2f} GiB, {ratio:.3f}x)"
        status = "ok" if self.ok else "FAILED"
        return (
            f"{self.name:22} {status:6} {rate:12,.0f} tok/s  MFU {mfu:>6}  peak {memory}  "
            f"{self.note}"
        )


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer of `vocab_size` tokens (`w<i>`) with our chat template and markers:
    every id decodes, so a random model's samples are text a reward can read."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [*SPECIAL_TOKENS, "<unk>"]
    vocab = {token: i for i, token in enumerate(specials)}
    vocab |= {f"w{i}": i for i in range(len(specials), vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=IM_END, pad_token=PAD, unk_token="<unk>",
        additional_special_tokens=[t for t in specials if t not in (IM_END, PAD, "<unk>")],
    )  # fmt: skip
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def parity_reward(prompts: Sequence[str], completions: Sequence[str], **_: object) -> list[float]:
    """The share of a completion's words with an even index: random text scores about 0.5,
    differently for each sample, so every group has a spread to learn from."""
    scores = []
    for text in completions:
        words = [w for w in text.split() if w[:1] == "w" and w[1:].isdigit()]
        scores.append(sum(int(w[1:]) % 2 == 0 for w in words) / max(1, len(words)))
    return scores


def start_rank(device: str) -> int:
    """torch.distributed's world of one (DeepSpeed needs a group), NCCL on a GPU."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    os.environ.update(env | {"MASTER_PORT": str(port)})
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from training.sft_worker import init_distributed, quiet_libraries

    init_distributed()
    quiet_libraries()
    return port


@contextlib.contextmanager
def allocation_record(device: torch.device) -> Iterator[list[str]]:
    """Record every allocation (with its Python frames) in the block; the list it yields is
    then filled with what was live at the block's peak, by where it was allocated. Used on an
    untimed step: the record slows allocation down."""
    lines: list[str] = []
    if device.type != "cuda":
        yield lines
        return
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=500_000)
    try:
        yield lines
    finally:
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        lines += peak_breakdown(snapshot["device_traces"][torch.cuda.current_device()], base)


def diagnose(device: torch.device, phase: Phase, step: Callable[[], object]) -> None:
    """One more, untimed step with every allocation recorded: what was live at its peak. A
    failure of the record is reported, not counted against the phase."""
    try:
        with allocation_record(device) as phase.top_blocks:
            step()
    except Exception as error:
        phase.top_blocks = [f"the recorded step failed ({type(error).__name__}: {error})"]


def peak_breakdown(events: list[dict], base: int, limit: int = 14) -> list[str]:
    """The allocations live at the largest total of `events` (torch's allocator trace), grouped
    by the first frames outside torch that made them."""
    total = best = best_at = 0
    sizes: dict[int, int] = {}
    for i, event in enumerate(events):
        if event["action"] == "alloc":
            sizes[event["addr"]] = event["size"]
            total += event["size"]
        elif event["action"] == "free_completed" and event["addr"] in sizes:
            total -= sizes.pop(event["addr"])
        if total > best:
            best, best_at = total, i
    live: dict[int, dict] = {}
    for event in events[: best_at + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    groups: Counter[str] = Counter()
    for event in live.values():
        groups[where(event.get("frames", []))] += event["size"]
    head = f"at the peak: {base / GiB:.2f} GiB held before + {best / GiB:.2f} GiB allocated in it"
    return [head] + [
        f"{size / 2**20:10.1f} MiB  {name}" for name, size in groups.most_common(limit)
    ]


def where(frames: list[dict]) -> str:
    """The innermost frames outside torch itself, briefly."""
    outside = [f for f in frames if "/torch/" not in f["filename"] and "<" not in f["filename"]]
    return " < ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in outside[:3])


def timed(device: torch.device, fn: Callable[[], int]) -> tuple[float, int]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    tokens = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began, tokens


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def read_peak(device: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated()) if device.type == "cuda" else None


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        kind="deepspeed", processes=1, zero_stage=args.zero_stage,
        precision="bf16" if args.device == "cuda" else "fp32", bucket_size=2e8,
        micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=args.gradient_checkpointing, logits_chunk_mb=args.logits_chunk_mb,
    )  # fmt: skip


def placement(args: argparse.Namespace, reference: bool) -> Placement:
    cfg = engine_config(args)
    return Placement(
        precision=cfg.precision, zero_stage=cfg.zero_stage, world=1, reference=reference,
        gradient_checkpointing=cfg.gradient_checkpointing, bucket_elements=int(cfg.bucket_size),
        device=args.device,  # type: ignore[arg-type]
    )  # fmt: skip


def sft_phase(args, shape: ModelShape, engine, tokenizer, n_flop: int) -> Phase:
    from training.collective import TorchCollective
    from training.supervised import SFTStepper

    phase = Phase(f"sft (zero-{args.zero_stage})")
    gen = torch.Generator().manual_seed(0)
    prompt, completion = 64, args.sft_length - 64
    examples = []
    for _ in range(args.sft_batch * (args.sft_steps + 2)):  # warm-up, timed, recorded
        ids = torch.randint(8, shape.vocab, (prompt + completion,), generator=gen).tolist()
        examples.append(Example(ids, [-100] * prompt + ids[prompt:]))
    cfg = TrainConfig(batch_size=args.sft_batch, epochs=1, warmup_steps=0, learning_rate=1e-5)
    stepper = SFTStepper(
        engine, examples, cfg, tokenizer.pad_token_id, "gpu-check sft", TorchCollective(),
        micro_batch_tokens=args.micro_batch_tokens,
    )  # fmt: skip
    stepper.start(0)
    stepper.run_step(0)  # warm-up: kernels, the allocator, AdamW's moments
    device = next(engine.module.parameters()).device
    reset_peak(device)
    timed_steps = range(1, args.sft_steps + 1)
    seconds, tokens = timed(device, lambda: sum(_sft(stepper, i, cfg) for i in timed_steps))
    phase.peak_bytes = read_peak(device)
    diagnose(device, phase, lambda: stepper.run_step(args.sft_steps + 1))
    rows = max(1, min(args.sft_batch, args.micro_batch_tokens // args.sft_length))
    micro = rows * args.sft_length
    step = Step(micro, micro, "sft", micro_batches=-(-args.sft_batch // rows))
    phase.predicted_bytes = step_estimate(shape, placement(args, False), step).peak
    phase.seconds, phase.tokens, phase.flops = seconds, tokens, 6.0 * n_flop * tokens
    phase.note = f"{args.sft_steps} steps of {args.sft_batch} x {args.sft_length} tokens"
    return phase


def _sft(stepper, i: int, cfg: TrainConfig) -> int:
    stepper.run_step(i)
    return cfg.batch_size * len(stepper.examples[0].input_ids)


def sample_phase(args, model, tokenizer, n_flop: int) -> Phase:
    from rl.trainer import partitioned
    from sampling.hf import HFSampler
    from sampling.interface import SamplingParams
    from training.collective import TorchCollective

    phase = Phase("hf sampler (bf16)")
    collective = TorchCollective()
    lockstep = (
        (lambda running: collective.max([float(running)])[0] > 0) if partitioned(model) else None
    )
    sampler = HFSampler(
        model, tokenizer, batch_size=args.sample_batch, show_progress=False, lockstep=lockstep
    )
    prompts = [
        render_prompt(tokenizer, " ".join(f"w{100 + 7 * i + j}" for j in range(48)))
        for i in range(args.prompts)
    ]
    params = SamplingParams(1.0, 1.0, args.max_new_tokens, seed=0)
    sampler.generate(prompts[:2], 1, SamplingParams(1.0, 1.0, 8))
    device = next(model.parameters()).device
    reset_peak(device)
    seconds, generated = timed(
        device,
        lambda: sum(len(c.token_ids) for g in sampler.generate(prompts, args.n, params) for c in g),
    )
    prefill = sum(len(x) for x in tokenizer(prompts, add_special_tokens=False)["input_ids"])
    phase.peak_bytes = read_peak(device)
    phase.seconds, phase.tokens, phase.flops = (
        seconds,
        generated,
        2.0 * n_flop * (generated + prefill),
    )
    phase.note = f"{args.prompts} prompts x {args.n} samples, up to {args.max_new_tokens} tokens"
    sampler.close()
    return phase


def grpo_phase(args, shape: ModelShape, engine, tokenizer, spec: ModelConfig, n_flop: int) -> Phase:
    from rl.trainer import GRPOTrainer
    from training.collective import TorchCollective

    phase = Phase(f"grpo (zero-{args.zero_stage}, ref)")
    cfg = GRPOConfig(
        steps=args.grpo_steps + 1, prompts_per_step=args.grpo_prompts, group_size=args.group,
        max_new_tokens=args.max_new_tokens, learning_rate=1e-6, beta=0.04,
        rewards=[RewardTerm(name=PREFERENCE)], engine=engine_config(args),
        importance_sampling_cap=2.0, checkpoint_every=10_000, samples_every=10_000,
        mask_truncated=False,  # a random model never ends a turn: every sample runs to the cap
    )  # fmt: skip
    reference = engine.frozen_reference(
        build_model(spec, shape.vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 1)
    )
    history: list[dict[str, float]] = []  # the timed steps' metrics
    trainer = None
    try:
        trainer = GRPOTrainer(
            engine.module, tokenizer, cfg, lambda m, s: None, show_progress=False,
            extra_rewards={PREFERENCE: parity_reward}, engine=engine, collective=TorchCollective(),
            reference=reference,
        )  # fmt: skip
        device = next(engine.module.parameters()).device
        update_peaks: list[int] = []
        update = trainer.update

        def measured_update(*a, **k):
            reset_peak(device)
            out = update(*a, **k)
            peak = read_peak(device)
            if peak is not None:
                update_peaks.append(peak)
            return out

        trainer.update = measured_update  # type: ignore[method-assign]
        problems = [
            Problem(f"p{i}", " ".join(f"w{50 + 3 * i + j}" for j in range(48)), "0", kind="general")
            for i in range(64)
        ]
        trainer.open_sampler(problems)
        from rl.trainer import prompt_order

        order = prompt_order(len(problems), cfg.steps, cfg.prompts_per_step, 0)
        trainer.step(0, [problems[i] for i in order[0]])  # warm-up
        update_peaks.clear()
        sampled = trained = 0.0

        def steps() -> int:
            nonlocal sampled, trained
            tokens = 0
            for s in range(1, cfg.steps):
                m = trainer.step(s, [problems[i] for i in order[s]])
                history.append(m)
                rows = cfg.prompts_per_step * cfg.group_size
                tokens += int(m["completion/mean_tokens"] * rows)
                sampled += rows
                trained += m["samples/trained"]
            return tokens

        seconds, completion_tokens = timed(device, steps)
        trainer.update = update  # type: ignore[method-assign]
        diagnose(device, phase, lambda: trainer.step(cfg.steps, [problems[i] for i in order[0]]))
    finally:
        if trainer is not None:
            trainer.close()
        reference.destroy()  # a DeepSpeed engine: its hooks and buffers
    rendered = render_prompt(tokenizer, problems[0].question)
    prompt_tokens = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    rows = sampled
    trained_tokens = trained * (prompt_tokens + completion_tokens / max(1, rows))
    phase.flops = (
        2.0 * n_flop * (completion_tokens + rows * prompt_tokens / cfg.group_size)
        + 6.0 * n_flop * trained_tokens
    )
    phase.seconds, phase.tokens = seconds, int(completion_tokens + trained_tokens)
    phase.peak_bytes = max(update_peaks) if update_peaks else None
    per_row = prompt_tokens + args.max_new_tokens
    rows_per_micro = max(
        1, min(cfg.prompts_per_step * cfg.group_size, args.micro_batch_tokens // per_row)
    )
    step = Step(
        tokens=rows_per_micro * per_row, logit_positions=rows_per_micro * args.max_new_tokens,
        loss="grpo", logits_budget=cfg.engine.logits_budget,
        micro_batches=-(-cfg.prompts_per_step * cfg.group_size // rows_per_micro),
    )  # fmt: skip
    phase.predicted_bytes = step_estimate(shape, placement(args, True), step).peak
    last = history[-1] if history else {}
    phase.note = (
        f"{args.grpo_steps} steps of {args.grpo_prompts} x {args.group}; trained {trained:.0f}/"
        f"{sampled:.0f} samples; kl {last.get('kl', float('nan')):.2e}, "
        f"tis ratio {last.get('tis/mean_ratio', float('nan')):.3f}"
    )
    return phase


def own_engine(
    args: argparse.Namespace,
    name: str,
    run: Callable[[DeepSpeedEngine], Phase],
    spec: ModelConfig,
    vocab: int,
    tokenizer,
) -> Phase:
    """`run` on an engine of its own over a fresh model, closed after it whatever happens: a
    step that fails inside its backward pass leaves ZeRO's reduce buckets holding gradients,
    and the next phase on that engine would trip on them (ZeRO-3 asserts that no parameter
    enters a bucket twice). Memory an earlier phase left on the device is reported: the
    memory model's prediction assumes none."""
    device = torch.device(args.device)
    held = held_bytes(device)
    engine = None
    try:
        model = build_model(spec, vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        engine = DeepSpeedEngine(model, 1e-5, 1.0, engine_config(args), world=1)
        del model
        phase = run(engine)
        phase.ok = True
    except Exception:
        phase = Phase(name, error=traceback.format_exc())
        print(phase.error, file=sys.stderr)
    finally:
        if engine is not None:
            engine.close()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if held > LEFT_OVER:
        phase.note += f"; {held / GiB:.2f} GiB still held from earlier phases"
    return phase


def held_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--sft-steps", type=int, default=4)
    p.add_argument("--sft-batch", type=int, default=32)
    p.add_argument("--sft-length", type=int, default=512)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--zero-stage", type=int, choices=(2, 3), default=2)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--logits-chunk-mb", type=float, default=1024.0)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--sample-batch", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--grpo-steps", type=int, default=2, help="timed, after one warm-up step")
    p.add_argument("--grpo-prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def environment() -> dict[str, str]:
    import deepspeed
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "deepspeed": deepspeed.__version__, "python": sys.version.split()[0]}  # fmt: skip
    if torch.cuda.is_available():
        info |= {"device": torch.cuda.get_device_name(), "cuda": str(torch.version.cuda)}
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (--device cpu checks the script itself)")
        return 2
    info = environment()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    start_rank(args.device)
    spec, vocab = SHAPES[args.shape]
    tokenizer = word_tokenizer(vocab)
    model = build_model(spec, vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
    shape = ModelShape.from_config(model.config.to_dict())
    n_flop = flop_parameters(model)
    del model
    print(f"model: {shape.parameters / 1e6:.1f}M parameters ({args.shape}), vocabulary {vocab}")
    phases: list[Phase] = []
    steps: list[tuple[str, Callable[[DeepSpeedEngine], Phase]]] = [
        ("sft", lambda engine: sft_phase(args, shape, engine, tokenizer, n_flop)),
        ("hf sampler", lambda engine: sample_phase(args, engine.module, tokenizer, n_flop)),
        ("grpo", lambda engine: grpo_phase(args, shape, engine, tokenizer, spec, n_flop)),
    ]
    for name, run in steps:
        phase = own_engine(args, name, run, spec, vocab, tokenizer)
        phases.append(phase)
        off = (
            phase.peak_bytes
            and phase.predicted_bytes
            and abs(phase.peak_bytes / phase.predicted_bytes - 1) > args.tolerance
        )
        if off:
            phase.ok = False
            phase.note += f"; peak off the model by more than {args.tolerance:.0%}"
        print(phase.row(args.peak_tflops or peak_tflops(info.get("device", ""))), flush=True)
        for line in phase.top_blocks:
            print("    " + line)
    if args.out:
        args.out.write_text(
            json.dumps({"environment": info, "phases": [asdict(p) for p in phases]}, indent=1)
        )
    return 0 if all(p.ok for p in phases) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The GPU path checked on a bare GPU machine: no network, no vLLM, no checkpoint.

    python -m benchmarks.gpu_check                      # Qwen2.5-0.5B's shape, on CUDA
    python -m benchmarks.gpu_check --shape tiny --device cpu   # the script itself, here

A model of Qwen2.5-0.5B's shape (24 layers, d=896, 14 heads over 2 KV heads, MLP 4,864, a
151,936-token vocabulary, tied embeddings) with random weights, and a word-level tokenizer of
the same vocabulary made here, go through what a GPU run of the recipe does, in one process
(rank 0 of 1), for each ZeRO stage asked (`--zero-stage 2 3`; ZeRO-3 with gradient
checkpointing unless `--no-zero3-checkpointing`):
1. SFT steps in bf16 (training.supervised.SFTStepper: packed rows through the varlen attention
   kernel, the loss's logits in chunks, micro-batches the memory model sizes), at each shape of
   `--sft-shapes`;
2. our HF sampler generating from the policy (under ZeRO-3 from a whole copy gathered once);
3. GRPO steps (rl.trainer.GRPOTrainer: sampling, scoring, the micro-batched update with a
   frozen bf16 reference, beta > 0), the reward a word-parity score that varies within each
   group; the update is timed apart from sampling.
Beside them, in the same run (benchmarks/gpu_peers.py): the packed-attention kernels on one
micro-batch, and the peer, a plain transformers SFT loop (SDPA, bf16 weights, fused AdamW, padded
rows) at the same shapes. With `--compile`, the ZeRO-2 SFT steps again with compiled layers.
Each phase runs on an engine of its own over a fresh model, closed after it (a step that fails
inside its backward pass leaves ZeRO's buckets holding gradients), and says how much device
memory an earlier phase still held when it began (0.00 GiB is the aim).
For each it prints tokens/s and MFU with the FLOPs it counted (benchmarks/throughput.py: 6N a
trained token, 2N a generated or prefilled one, the LM head in N, causal attention on top) and,
for the training steps, the peak of torch's allocator (`torch.cuda.max_memory_allocated`)
against the memory model's prediction (training/memory.py), with the allocator's largest live
blocks at the peak of one more, recorded step. It exits 1 when a phase fails or a peak is more
than `--tolerance` off the prediction, and writes everything to `--out` (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.gpu_peers import attention_bench, plain_loop  # noqa: E402
from benchmarks.gpu_phases import Phase, Setting, grpo_phase, sample_phase, sft_phase  # noqa: E402
from benchmarks.throughput import flop_parameters, peak_tflops  # noqa: E402
from configs.supervised import ModelConfig  # noqa: E402
from models.chat import CHAT_TEMPLATE, IM_END, PAD, SPECIAL_TOKENS  # noqa: E402
from models.loading import build_model  # noqa: E402
from training.engines import DeepSpeedEngine  # noqa: E402
from training.memory import GiB, ModelShape  # noqa: E402
from training.varlen import NAMES  # noqa: E402

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


def held_bytes(device: torch.device) -> int:
    """Device memory still allocated, without cuBLAS's workspaces (torch allocates them through
    its allocator at a handle's first matmul and keeps them for the process: 64 MiB on an H100,
    which no phase holds)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    return int(torch.cuda.memory_allocated())


def own_engine(
    setting: Setting, name: str, run: Callable[[DeepSpeedEngine], Phase], spec: ModelConfig,
    vocab: int, tokenizer,
) -> Phase:  # fmt: skip
    """`run` on an engine of its own over a fresh model, closed after it whatever happens: a
    step that fails inside its backward pass leaves ZeRO's reduce buckets holding gradients,
    and the next phase on that engine would trip on them. The device memory an earlier phase
    left allocated is recorded: the memory model's prediction assumes none."""
    device = torch.device(setting.device)
    held = held_bytes(device)
    engine = None
    try:
        model = build_model(spec, vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        engine = DeepSpeedEngine(model, 1e-5, 1.0, setting.engine(), world=1)
        del model
        phase = run(engine)
        phase.ok = True
    except Exception:
        phase = Phase(f"{name} ({setting.label})", error=traceback.format_exc())
        print(phase.error, file=sys.stderr)
    finally:
        if engine is not None:
            engine.close()
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    phase.held_before = held
    return phase


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--zero-stage", type=int, nargs="+", choices=(2, 3), default=[2, 3])
    p.add_argument("--gradient-checkpointing", action="store_true", help="under ZeRO-2 too")
    p.add_argument("--no-zero3-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="also: ZeRO-2 SFT, compiled layers")
    p.add_argument("--sft-steps", type=int, default=4)
    p.add_argument("--sft-shapes", nargs="+", default=["32x512", "8x2048"], help="ROWSxTOKENS")
    p.add_argument("--micro-batch-tokens", default="auto", help="tokens, or auto")
    p.add_argument("--logits-chunk-mb", type=float, default=1024.0)
    p.add_argument("--phases", nargs="+", default=["sft", "sampler", "grpo"])
    p.add_argument("--no-peer", action="store_true", help="skip the plain transformers loop")
    p.add_argument("--no-attention", action="store_true", help="skip the attention kernels")
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
    args = p.parse_args(argv)
    if args.micro_batch_tokens != "auto":
        args.micro_batch_tokens = int(args.micro_batch_tokens)
    args.sft_shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.sft_shapes]
    return args


def environment() -> dict[str, str]:
    import deepspeed
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "deepspeed": deepspeed.__version__, "python": sys.version.split()[0]}  # fmt: skip
    if torch.cuda.is_available():
        info |= {"device": torch.cuda.get_device_name(), "cuda": str(torch.version.cuda)}
    return info


def settings(args: argparse.Namespace) -> list[Setting]:
    out = []
    for stage in args.zero_stage:
        checkpointing = args.gradient_checkpointing or (
            stage == 3 and not args.no_zero3_checkpointing
        )
        out.append(
            Setting(
                args.device, stage, checkpointing, args.micro_batch_tokens, args.logits_chunk_mb
            )  # fmt: skip
        )
    return out


def mfu_text(flops: float, seconds: float, peak: float | None) -> str:
    if peak is None or not seconds:
        return "-"
    return f"{flops / seconds / 1e12 / peak:.1%}"


def phase_line(phase: Phase, peak: float | None) -> str:
    rate = phase.tokens / phase.seconds if phase.seconds else 0.0
    memory = "-"
    if phase.peak_bytes is not None:
        memory = f"{phase.peak_bytes / GiB:.2f} GiB"
        if phase.predicted_bytes:
            ratio = phase.peak_bytes / phase.predicted_bytes
            memory += f" (model {phase.predicted_bytes / GiB:.2f}, {ratio:.3f}x)"
    status = "ok" if phase.ok else "FAILED"
    mfu = mfu_text(phase.flops, phase.seconds, peak)
    line = (
        f"{phase.name:34} {status:6} {rate:10,.0f} tok/s  MFU {mfu:>6}"
        f"  {phase.flops / max(phase.tokens, 1) / 1e9:6.2f} GFLOP/tok  peak {memory}"
        f"  held before {phase.held_before / GiB:.2f} GiB"
    )
    if "update_seconds" in phase.parts:
        parts = phase.parts
        update_rate = parts["update_tokens"] / max(parts["update_seconds"], 1e-9)
        update_mfu = mfu_text(parts["update_flops"], parts["update_seconds"], peak)
        line += (
            f"\n{'':34}        update: {update_rate:,.0f} tok/s, MFU {update_mfu} "
            f"({parts['update_seconds']:.2f} s of {phase.seconds:.2f} s; sampling "
            f"{parts['sample_seconds']:.2f} s; the guard's text signals "
            f"{parts.get('signals_seconds', 0.0):.3f} s)"
        )
    return line + (f"\n{'':34}        {phase.note}" if phase.note else "")


def run_phases(args, spec, vocab, tokenizer, shape, n_flop, peak) -> list[Phase]:
    phases: list[Phase] = []

    def report(phase: Phase) -> None:
        off = (
            phase.peak_bytes
            and phase.predicted_bytes
            and abs(phase.peak_bytes / phase.predicted_bytes - 1) > args.tolerance
        )
        if off:
            phase.ok = False
            phase.note += f"; peak off the model by more than {args.tolerance:.0%}"
        phases.append(phase)
        print(phase_line(phase, peak), flush=True)
        for line in phase.top_blocks:
            print("    " + line, flush=True)

    device = torch.device(args.device)

    def diag(phase: Phase, step: Callable[[], object]) -> None:
        diagnose(device, phase, step)

    def on_engine(setting: Setting, name: str, run: Callable[[DeepSpeedEngine], Phase]) -> None:
        report(own_engine(setting, name, run, spec, vocab, tokenizer))

    runs = settings(args)
    if args.compile:
        runs.append(
            Setting(args.device, 2, False, args.micro_batch_tokens, args.logits_chunk_mb, True)
        )
    for s in runs:
        for rows, length in args.sft_shapes if "sft" in args.phases else []:
            on_engine(s, "sft", lambda e, s=s, r=rows, n=length: sft_phase(
                s, shape, e, tokenizer, n_flop, r, n, args.sft_steps, diag))  # fmt: skip
        if s.compile:
            continue
        if "sampler" in args.phases:
            on_engine(s, "hf sampler", lambda e, s=s: sample_phase(
                s, e.module, tokenizer, n_flop, args))  # fmt: skip
        if "grpo" in args.phases:
            on_engine(s, "grpo", lambda e, s=s: grpo_phase(
                s, shape, e, tokenizer, spec, n_flop, args, diag))  # fmt: skip
    return phases


def peers(args, spec, vocab, n_flop, peak, model_config) -> dict:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    out: dict = {"attention": [], "plain_loop": []}
    if not args.no_attention:
        for rows, length in args.sft_shapes:
            kernels = ("per_sequence", "varlen", "flex", "padded")
            if args.device != "cuda":
                kernels = ("per_sequence", "padded")
            for row in attention_bench(model_config, [length] * rows, device, dtype,
                                       kernels=kernels):  # fmt: skip
                out["attention"].append({"shape": f"{rows}x{length}", **asdict(row)})
                state = "ok" if row.ok else "FAILED " + row.error.strip().splitlines()[-1]
                print(f"attention {rows}x{length} {row.name:18} {row.milliseconds:8.2f} ms "
                      f"{row.tflops:7.1f} TFLOP/s  out err {row.max_output_error:.1e}  "
                      f"grad err {row.gradient_error:.1e}  {state}", flush=True)  # fmt: skip
    if not args.no_peer:
        for rows, length in args.sft_shapes:
            row = plain_loop(spec, vocab, device, rows, length, args.sft_steps, n_flop)
            out["plain_loop"].append(asdict(row))
            rate = row.tokens / row.seconds if row.seconds else 0.0
            memory = f"{row.peak_bytes / GiB:.2f} GiB" if row.peak_bytes else "-"
            state = "ok" if row.ok else "FAILED " + row.error.strip().splitlines()[-1]
            mfu = mfu_text(row.flops, row.seconds, peak)
            print(f"{row.name:34} {state:6} {rate:10,.0f} tok/s  MFU {mfu:>6}  peak {memory}")
    return out


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
    n_flop, model_config = flop_parameters(model), model.config
    del model
    peak = args.peak_tflops or peak_tflops(info.get("device", ""))
    print(f"model: {shape.parameters / 1e6:.1f}M parameters ({args.shape}), vocabulary {vocab}; "
          f"FLOPs: N = {n_flop / 1e6:.1f}M (the tied head once), peak {peak} TFLOP/s")  # fmt: skip
    yardsticks = peers(args, spec, vocab, n_flop, peak, model_config)
    broken = [r for r in yardsticks["attention"] if r["name"] == NAMES["varlen"] and not r["ok"]]
    if broken and "R1_PACKED_ATTENTION" not in os.environ:
        os.environ["R1_PACKED_ATTENTION"] = "per_sequence"
        print("the varlen kernel failed above: the phases run the per-sequence kernel")
    phases = run_phases(args, spec, vocab, tokenizer, shape, n_flop, peak)
    if args.out:
        args.out.write_text(json.dumps(
            {"environment": info, "peers": yardsticks, "phases": [asdict(p) for p in phases]},
            indent=1,
        ))  # fmt: skip
    return 0 if all(p.ok for p in phases) else 1


if __name__ == "__main__":
    sys.exit(main())

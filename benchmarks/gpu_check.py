"""The GPU path checked on a bare GPU machine: no network, no vLLM, no checkpoint.

    python -m benchmarks.gpu_check                      # Qwen2.5-0.5B's shape, on CUDA
    python -m benchmarks.gpu_check --shape qwen2.5-0.5b qwen2.5-1.5b \
        --zero-stage 2 --phases sft peer                # both shapes: SFT beside the peer
    python -m benchmarks.gpu_check --shape tiny --device cpu   # the script itself, here

For each shape of `--shape` in turn (benchmarks/gpu_shapes.py: Qwen2.5-0.5B's, 24 layers, d=896,
14 heads over 2 KV heads, MLP 4,864; Qwen2.5-1.5B's, the profile's policy, 28 layers, d=1536, 12
heads over 2, MLP 8,960; both a 151,936-token vocabulary and tied embeddings), models with random
weights and a word-level tokenizer of the same vocabulary made here go through what a GPU run of
the recipe does, in one process (rank 0 of 1), for each ZeRO stage asked (`--zero-stage 2 3`;
ZeRO-3 with gradient checkpointing unless `--no-zero3-checkpointing`):
1. SFT steps in bf16 (training.supervised.SFTStepper: packed rows through the varlen attention
   kernel, the loss's logits in chunks, micro-batches the memory model sizes), at each case of
   `--sft-shapes` (by default the shape's own: 32 x 512 for 0.5B, 16 x 512 for 1.5B, and rows of
   lengths drawn like GSM8K's traces, 100-512 tokens, about as many tokens a step: `var512`);
2. our HF sampler generating from the policy (under ZeRO-3 from a whole copy gathered once);
3. GRPO steps (rl.trainer.GRPOTrainer: sampling, scoring, the micro-batched update with a
   frozen bf16 reference, beta > 0), the reward a word-parity score that varies within each
   group; the update is timed apart from sampling.
Beside them, in the same run (benchmarks/gpu_peers.py): the packed-attention kernels on one
micro-batch, and the peer, a plain transformers SFT loop (SDPA, bf16 weights, fused AdamW, rows
padded to the longest of their batch) on the same rows in the same batches. With `--compile`, the
ZeRO-2 SFT steps again with compiled layers; with `--fused-head`, ZeRO-2's SFT and GRPO steps
again with the head's chunks fused (training/fused_head.py); with `--no-overflow-scan`, again
without DeepSpeed's bf16 overflow scan (training/finite.py). `--phases` picks among sft, peer,
attention, sampler and grpo. Each phase runs on an engine of its own over a fresh model, closed
after it (a step that fails inside its backward pass leaves ZeRO's buckets holding gradients),
and says how much device memory an earlier phase still held when it began (0.00 GiB is the aim).
For each it prints tokens/s and MFU with the FLOPs it counted (benchmarks/throughput.py: 6N a
trained token, 2N a generated or prefilled one, the LM head in N, causal attention on top); for
SFT, ours and the peer's alike, the headline counts only the positions that carry loss (loss
tokens/s; MFU with the head's FLOPs only there), then the figures over all positions; for the
training steps, the peak of torch's allocator (`torch.cuda.max_memory_allocated`) against the
memory model's prediction (training/memory.py), with the allocator's largest live blocks at the
peak of one more, recorded step, and for SFT's steps and the peer's the device's busy time in one
more step under torch's profiler against a timed step's wall time (benchmarks/gpu_profile.py:
host-bound or device-bound). Per shape it then prints our SFT beside the peer, case by case, with
the ratio of their loss tokens/s. It exits 1 when a phase fails or a peak is more than
`--tolerance` off the prediction, and writes everything to `--out` (JSON, by shape; rewritten as
each shape ends).
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

from benchmarks.gpu_peers import LoopRow, attention_bench, plain_loop  # noqa: E402
from benchmarks.gpu_phases import Phase, Setting, grpo_phase, sample_phase, sft_phase  # noqa: E402
from benchmarks.gpu_report import comparison_lines, peer_line, phase_line  # noqa: E402
from benchmarks.gpu_shapes import (  # noqa: E402
    SHAPES,
    SFTCase,
    case_examples,
    parse_case,
    peer_budget,
    shape_cases,
    step_batches,
)
from benchmarks.throughput import flop_parameters, head_parameters, peak_tflops  # noqa: E402
from configs.supervised import ModelConfig  # noqa: E402
from models.chat import CHAT_TEMPLATE, IM_END, PAD, SPECIAL_TOKENS  # noqa: E402
from models.loading import build_model  # noqa: E402
from training.engines import DeepSpeedEngine  # noqa: E402
from training.examples import Example  # noqa: E402
from training.memory import GiB, ModelShape  # noqa: E402
from training.mixed import MixedPrecisionEngine  # noqa: E402
from training.varlen import NAMES  # noqa: E402

LEFT_OVER = 256 * 2**20  # device bytes still held when a phase starts that are worth a note

PHASES = ("sft", "peer", "attention", "sampler", "grpo", "mixed")
EXTRA_STEPS = 3  # SFT's rows beyond the timed steps': a warm-up, a profiled and a recorded step


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
        with device:  # the random weights drawn where they train (a 1.5B draw on CPU is slow)
            model = build_model(spec, vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 0)
        if setting.mixed:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            engine = MixedPrecisionEngine(model, 1e-5, 1.0, dtype=dtype)
        else:
            engine = DeepSpeedEngine(model, 1e-5, 1.0, setting.engine(), world=1)
        del model
        phase = run(engine)
        phase.ok = True
    except Exception:
        phase = Phase(f"{name} ({setting.label})", error=traceback.format_exc())
        print(phase.error, file=sys.stderr)
    finally:
        if engine is not None and hasattr(engine, "close"):
            engine.close()
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    phase.held_before = held
    return phase


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs="+", choices=sorted(SHAPES), default=["qwen2.5-0.5b"],
                   help="one or more: each runs in turn on fresh models")  # fmt: skip
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--zero-stage", type=int, nargs="+", choices=(1, 2, 3), default=[2, 3],
                   help="1: DeepSpeed's BF16_Optimizer (bf16 on every device)")  # fmt: skip
    p.add_argument("--gradient-checkpointing", action="store_true", help="under ZeRO-2 too")
    p.add_argument("--no-zero3-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="also: ZeRO-2 SFT, compiled layers")
    p.add_argument(
        "--fused-head",
        action="store_true",
        help="also: ZeRO-2 SFT and GRPO with the head's chunks fused (fused_head.py)",
    )
    p.add_argument(
        "--no-overflow-scan",
        action="store_true",
        help="also: ZeRO-2 SFT and GRPO without DeepSpeed's bf16 overflow scan, the global "
        "norm checked once instead (engine.overflow_scan: false)",
    )
    p.add_argument("--sft-steps", type=int, default=4)
    p.add_argument("--sft-shapes", nargs="+", default=None,
                   help="ROWSxTOKENS or varMAX[@TOKENS] (rows of drawn lengths up to MAX); by "
                        "default each shape's own (benchmarks/gpu_shapes.py)")  # fmt: skip
    p.add_argument("--micro-batch-tokens", default="auto", help="tokens, or auto")
    p.add_argument("--logits-chunk-mb", type=float, default=1024.0)
    p.add_argument(
        "--phases", nargs="+", choices=PHASES, default=[p for p in PHASES if p != "mixed"]
    )  # mixed: on request
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
    args.shape = list(dict.fromkeys(args.shape))
    skipped = {"peer"} if args.no_peer else set()
    skipped |= {"attention"} if args.no_attention else set()
    args.phases = [phase for phase in args.phases if phase not in skipped]
    try:
        for text in args.sft_shapes or []:
            parse_case(text, None)
    except ValueError as error:
        p.error(str(error))
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
    if args.compile:
        out.append(
            Setting(args.device, 2, False, args.micro_batch_tokens, args.logits_chunk_mb, True)
        )
    if args.fused_head:
        out.append(Setting(args.device, 2, args.gradient_checkpointing, args.micro_batch_tokens,
                           args.logits_chunk_mb, fused_head=True))  # fmt: skip
    if args.no_overflow_scan:
        out.append(Setting(args.device, 2, args.gradient_checkpointing, args.micro_batch_tokens,
                           args.logits_chunk_mb, overflow_scan=False))  # fmt: skip
    if "mixed" in args.phases:  # SFT on one process's engine beside ZeRO's (training/mixed.py)
        mixed = Setting(args.device, 2, args.gradient_checkpointing, args.micro_batch_tokens,
                        args.logits_chunk_mb, mixed=True)  # fmt: skip
        out.append(mixed)
    return out


class ShapeRun:
    """One shape of the run: its model, FLOP counts, SFT cases and their rows."""

    def __init__(self, name: str, steps: int, sft_shapes: list[str] | None):
        self.name = name
        self.spec, self.vocab = SHAPES[name]
        self.tokenizer = word_tokenizer(self.vocab)
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        with torch.device("meta"):  # the shape and the counts only: no weights made
            model = build_model(self.spec, self.vocab, pad, eos, 0)
        self.shape = ModelShape.from_config(model.config.to_dict())
        self.n_flop, self.n_head = flop_parameters(model), head_parameters(model)
        self.config = model.config
        self.cases: list[SFTCase] = shape_cases(name, sft_shapes)
        self.examples: dict[str, list[Example]] = {
            case.name: case_examples(case, self.vocab, steps + EXTRA_STEPS) for case in self.cases
        }

    def batches(self, case: SFTCase) -> list[list[Example]]:
        return step_batches(self.examples[case.name], case.rows)


def run_phases(args, run: ShapeRun, peak: float | None) -> list[Phase]:
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

    def on_engine(setting: Setting, name: str, go: Callable[[DeepSpeedEngine], Phase]) -> None:
        report(own_engine(setting, name, go, run.spec, run.vocab, run.tokenizer))

    for s in settings(args):
        for case in run.cases if "sft" in args.phases or s.mixed else []:
            on_engine(s, "sft", lambda e, s=s, c=case: sft_phase(
                s, run.shape, e, run.tokenizer, run.n_flop, run.n_head, c,
                run.examples[c.name], args.sft_steps, diag))  # fmt: skip
        if s.compile or s.mixed:
            continue
        if "sampler" in args.phases and not s.fused_head and s.overflow_scan:  # no update
            on_engine(s, "hf sampler", lambda e, s=s: sample_phase(
                s, e.module, run.tokenizer, run.n_flop, args))  # fmt: skip
        if "grpo" in args.phases:
            on_engine(s, "grpo", lambda e, s=s: grpo_phase(
                s, run.shape, e, run.tokenizer, run.spec, run.n_flop, args, diag))  # fmt: skip
    return phases


def attention_rows(args, run: ShapeRun) -> list[dict]:
    """The packed-attention kernels on one step's rows of each case (a variable case's rows
    have no one length to pad to: the padded kernel is left out there)."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    out = []
    for case in run.cases:
        kernels = ("per_sequence", "varlen", "flex", "padded")
        if args.device != "cuda":
            kernels = ("per_sequence", "padded")
        if case.variable:
            kernels = tuple(k for k in kernels if k != "padded")
        lengths = [len(e.input_ids) for e in run.batches(case)[1]]
        for row in attention_bench(run.config, lengths, device, dtype, kernels=kernels):
            out.append({"shape": case.name, **asdict(row)})
            state = "ok" if row.ok else "FAILED " + row.error.strip().splitlines()[-1]
            print(f"attention {case.name:8} {row.name:18} {row.milliseconds:8.2f} ms "
                  f"{row.tflops:7.1f} TFLOP/s  out err {row.max_output_error:.1e}  "
                  f"grad err {row.gradient_error:.1e}  {state}", flush=True)  # fmt: skip
    return out


def peer_rows(args, run: ShapeRun, peak: float | None) -> list[LoopRow]:
    """The plain loop on each case's batches, the ones our SFT steps train on."""
    device = torch.device(args.device)
    budget = peer_budget(run.cases)
    rows = []
    for case in run.cases:
        row = plain_loop(run.spec, run.vocab, device, case, run.batches(case), args.sft_steps,
                         budget, run.n_flop, run.n_head)  # fmt: skip
        rows.append(row)
        print(peer_line(row, peak), flush=True)
    return rows


def run_shape(args, name: str, peak: float | None) -> dict:
    """Every phase asked of shape `name`, each on fresh models; what it printed, as a dict."""
    run = ShapeRun(name, args.sft_steps, args.sft_shapes)
    cases = ", ".join(f"{c.name} ({c.rows} rows, {c.tokens:,} tokens a step)" for c in run.cases)
    print(f"== {name}: {run.shape.parameters / 1e6:.1f}M parameters, vocabulary {run.vocab}; "
          f"FLOPs: N = {run.n_flop / 1e6:.1f}M (the tied head once, {run.n_head / 1e6:.1f}M), "
          f"peak {peak} TFLOP/s; SFT cases {cases}", flush=True)  # fmt: skip
    attention = attention_rows(args, run) if "attention" in args.phases else []
    peers = peer_rows(args, run, peak) if "peer" in args.phases else []
    broken = [r for r in attention if r["name"] == NAMES["varlen"] and not r["ok"]]
    if broken and "R1_PACKED_ATTENTION" not in os.environ:
        os.environ["R1_PACKED_ATTENTION"] = "per_sequence"
        print("the varlen kernel failed above: the phases run the per-sequence kernel")
    phases = run_phases(args, run, peak)
    if "sft" in args.phases and peers:
        names = [case.name for case in run.cases]
        for line in comparison_lines(name, names, phases, peers, peak):
            print(line, flush=True)
    return {
        "parameters": run.shape.parameters, "n_flop": run.n_flop, "n_head": run.n_head,
        "cases": [asdict(c) for c in run.cases],
        "peers": {"attention": attention, "plain_loop": [asdict(r) for r in peers]},
        "phases": [asdict(p) for p in phases],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (--device cpu checks the script itself)")
        return 2
    info = environment()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    start_rank(args.device)
    peak = args.peak_tflops or peak_tflops(info.get("device", ""))
    shapes: dict[str, dict] = {}
    for name in args.shape:
        shapes[name] = run_shape(args, name, peak)
        if args.out:  # after each shape: a run cut short keeps what it measured
            args.out.write_text(json.dumps(
                {"environment": info, "peak_tflops": peak, "shapes": shapes}, indent=1
            ))  # fmt: skip
    return 0 if all(p["ok"] for s in shapes.values() for p in s["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())

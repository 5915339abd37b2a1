"""The memory model (training/memory.py) against what torch allocates, on CPU.

    python -m benchmarks.memory_model            # every case; exits 1 if one is off by > 15%
    python -m benchmarks.memory_model --quick    # the two smallest cases
    python -m benchmarks.memory_model --profile gpu-qwen --gpu-gib 80   # what fits a GPU

Each case builds a random Qwen2-style model, runs one warm-up step (so AdamW's moments exist, as
in every step after the first), then one step, all of it under torch's profiler with its memory
record, and takes the peak of everything live at once during the step (`AllocationRecord`:
every block the CPU allocator handed out since before the model was built and has not taken
back). It prints the model's prediction, the measured peak and their ratio. SFT steps run the
stage's stepper (training.supervised SFTStepper), GRPO updates the trainer's update
(rl.update.PolicyUpdate), both through the single-process engine in fp32, the "zero" cases
through DeepSpeed's ZeRO on a world of one (gloo) in fp32 or bf16; GRPO rows are random
completions with random advantages.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from torch._C._profiler import _EventType  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from configs.reinforcement import GRPOConfig  # noqa: E402
from configs.supervised import EngineConfig, ModelConfig, TrainConfig  # noqa: E402
from models.chat import render_prompt  # noqa: E402
from models.loading import build_model  # noqa: E402
from models.tokenizer import train_tokenizer  # noqa: E402
from rl.update import PolicyUpdate, UpdateRows  # noqa: E402
from training.collective import Solo  # noqa: E402
from training.engines import LocalEngine  # noqa: E402
from training.examples import Example  # noqa: E402
from training.finite import LossGuard  # noqa: E402
from training.memory import GiB, ModelShape, Placement, Step, step_estimate  # noqa: E402
from training.supervised import SFTStepper  # noqa: E402

TOLERANCE = 0.15
MiB = 2**20


@dataclass(frozen=True)
class Case:
    name: str
    model: ModelConfig
    vocab: int
    kind: str  # "sft" | "grpo"
    rows: int
    prompt_tokens: int
    completion_tokens: int
    engine: EngineConfig = EngineConfig()
    beta: float = 0.0


TINY = ModelConfig(
    hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384
)
MID = ModelConfig(
    hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536,
    max_position_embeddings=2048,
)  # fmt: skip


def mid_sft(name: str, engine: EngineConfig | None = None) -> Case:
    return Case(name, MID, 32768, "sft", rows=8, prompt_tokens=64, completion_tokens=192,
                engine=engine or EngineConfig())  # fmt: skip


def mid_grpo(name: str, engine: EngineConfig | None = None, beta: float = 0.0) -> Case:
    return Case(name, MID, 32768, "grpo", rows=16, prompt_tokens=64, completion_tokens=128,
                engine=engine or EngineConfig(), beta=beta)  # fmt: skip


CASES = (
    Case("tiny sft", TINY, 1024, "sft", rows=16, prompt_tokens=40, completion_tokens=120),
    Case("tiny grpo", TINY, 1024, "grpo", rows=64, prompt_tokens=40, completion_tokens=100),
    mid_sft("mid sft"),
    mid_grpo("mid grpo", beta=0.04),
    mid_grpo("mid grpo chunked", EngineConfig(logits_chunk_mb=16)),
    mid_sft("mid sft chunked", EngineConfig(logits_chunk_mb=16)),
    mid_grpo("mid grpo chunked fused", EngineConfig(logits_chunk_mb=16, fused_head=True)),
    mid_sft("mid sft chunked fused", EngineConfig(logits_chunk_mb=16, fused_head=True)),
    mid_sft("mid sft zero-2", EngineConfig(kind="deepspeed", processes=1, zero_stage=2)),
    mid_sft("mid sft zero-3", EngineConfig(kind="deepspeed", processes=1, zero_stage=3)),
    mid_sft(
        "mid sft zero-2 bf16",
        EngineConfig(kind="deepspeed", processes=1, zero_stage=2, precision="bf16"),
    ),
    mid_sft(
        "mid sft zero-3 bf16",
        EngineConfig(kind="deepspeed", processes=1, zero_stage=3, precision="bf16"),
    ),
    mid_sft(
        "mid sft zero-1 bf16",
        EngineConfig(kind="deepspeed", processes=1, zero_stage=1, precision="bf16"),
    ),
    mid_sft("mid sft checkpointed", EngineConfig(gradient_checkpointing=True)),
    mid_grpo("mid grpo micro-batched", EngineConfig(micro_batch_tokens=1024)),
)
QUICK = ("tiny sft", "tiny grpo")


class AllocationRecord:
    """Every block torch's CPU allocator hands out and takes back while the record is open, as
    `torch.cuda.max_memory_allocated` counts them on a GPU: open it before the model is built,
    measure a step inside it, and `peak` is the most bytes live at once during that step, the
    model, the optimizer's state and every buffer made since the record opened included.

    Read from the profiler's raw allocation events (`peak_bytes`). The profiler records no free
    made in a thread it does not follow: with DeepSpeed over gloo, the warm-up step's ZeRO-2
    reduce bucket stayed counted through the measured step in 3 of 10 runs. So when the step
    starts, a block that no tensor's storage holds is taken off: a block that only C++ holds at
    that moment (a collective's pending work) would be taken off too, and a block freed unseen
    during the step stays counted unless its address is handed out again; at every case's step
    boundary here the blocks left were the model's resident state. (torch's memory timeline,
    `torch.profiler._memory_profiler`, rebuilds a data-flow graph from the ops it saw instead:
    it missed ZeRO-3's partitions and buffers, which a step does not pass through an op, and
    now and then failed its own consistency check under DeepSpeed, "duplicate outputs".)"""

    MARK = "## measured step ##"

    def __init__(self) -> None:
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._held: set[int] = set()
        self.peak = 0

    def __enter__(self) -> AllocationRecord:
        self._profile.__enter__()
        return self

    def measure(self, step: Callable[[], None]) -> None:
        self._held = tensor_storages()
        with record_function(self.MARK):
            step()

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        if exc[0] is None:
            self.peak = self._peak()

    def _events(self) -> list:
        events, stack = [], list(self._profile.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            events.append(event)
            stack.extend(event.children)
        return events

    def _peak(self) -> int:
        events = self._events()
        windows = [e for e in events if e.name == self.MARK]
        if len(windows) != 1:
            raise RuntimeError(f"measure one step inside the record, not {len(windows)}")
        allocations = [
            (e.start_time_ns, e.typed[1].ptr, e.typed[1].alloc_size)
            for e in events
            if e.typed[0] == _EventType.Allocation and e.typed[1].device.type == "cpu"
        ]
        return peak_bytes(allocations, windows[0].start_time_ns, windows[0].end_time_ns, self._held)


def peak_bytes(
    allocations: list[tuple[int, int, int]], start: int, end: int, held: set[int]
) -> int:
    """The most bytes live at once from `start` to `end`, from (time, address, bytes) records
    (negative bytes: a free). A free of a block allocated before the record is not counted (it
    never was); an address allocated again frees the block it held; at `start`, a live block
    whose address is not in `held` (the storages tensors hold) was freed unseen, and goes."""
    sizes: dict[int, int] = {}  # address: bytes, of the blocks live now
    live, peak, started = 0, 0, False
    for time, address, size in sorted(allocations):
        if not started and time >= start:
            started = True
            for gone in [a for a in sizes if a not in held]:
                live -= sizes.pop(gone)
            peak = live
        if size > 0:
            live += size - sizes.get(address, 0)
            sizes[address] = size
        else:
            live -= sizes.pop(address, 0)
        if start <= time <= end:
            peak = max(peak, live)
    if not started:  # nothing allocated or freed during the step
        peak = live - sum(n for a, n in sizes.items() if a not in held)
    return peak


def tensor_storages() -> set[int]:
    """The addresses of the storages of every tensor Python holds (a compiler's fake tensors,
    left in memory by an earlier `torch.compile`, hold none)."""
    from torch._subclasses.fake_tensor import FakeTensor

    held = set()
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor) or isinstance(obj, FakeTensor):
            continue
        if obj.device.type == "cpu":
            with contextlib.suppress(RuntimeError):  # a tensor without storage (sparse, nested)
                held.add(obj.untyped_storage().data_ptr())
    return held


def tokenizer_for_cases():
    texts = [f"What is {a} + {b}? The answer is {a + b}." for a in range(40) for b in range(40)]
    return train_tokenizer(texts, 256)


def rows_of(case: Case, tokenizer, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) per row: a prompt of about `prompt_tokens` tokens and a
    random completion of `completion_tokens`."""
    gen = torch.Generator().manual_seed(seed)
    question = " ".join(["What is 12 + 30?"] * max(1, case.prompt_tokens // 8))
    prompt = tokenizer(render_prompt(tokenizer, question), add_special_tokens=False)["input_ids"]
    prompt = prompt[: case.prompt_tokens]
    return [
        (prompt, torch.randint(3, case.vocab, (case.completion_tokens,), generator=gen).tolist())
        for _ in range(case.rows)
    ]


def engine_for(case: Case, model, learning_rate: float):
    """The case's engine over `model`: DeepSpeed's ZeRO on a world of one here (gloo), or the
    single-process engine."""
    if case.engine.kind != "deepspeed":
        checkpointing = case.engine.gradient_checkpointing
        return LocalEngine(model, learning_rate, 1.0, gradient_checkpointing=checkpointing)
    if not torch.distributed.is_initialized():
        from benchmarks.gpu_check import start_rank

        start_rank("cpu")
    from training.engines import DeepSpeedEngine

    return DeepSpeedEngine(model, learning_rate, 1.0, case.engine, world=1)


def sft_step(case: Case, engine, tokenizer) -> Callable[[], None]:
    examples = []
    for prompt, completion in rows_of(case, tokenizer):
        ids = prompt + completion
        labels = [-100] * len(prompt) + completion
        examples.append(Example(ids, labels))
    cfg = TrainConfig(batch_size=case.rows, epochs=2, warmup_steps=0)
    stepper = SFTStepper(
        engine, examples, cfg, tokenizer.pad_token_id, "memory",
        memory=case.engine,
    )  # fmt: skip
    stepper.start(0)
    steps = iter(range(2))
    return lambda: stepper.run_step(next(steps))


def grpo_step(case: Case, engine, tokenizer) -> Callable[[], None]:
    if case.engine.kind == "deepspeed":
        raise ValueError(f"{case.name}: GRPO cases run on the single-process engine only")
    cfg = GRPOConfig(engine=case.engine, beta=case.beta, max_new_tokens=case.completion_tokens)
    reference = None
    if case.beta > 0:
        reference = build_model(case.model, case.vocab, 0, 1, seed=1).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    update = PolicyUpdate(cfg, tokenizer, engine, Solo(), reference, LossGuard("memory"))
    pairs = rows_of(case, tokenizer)
    prompt = tokenizer.decode(pairs[0][0])
    adv = torch.randn(case.rows, generator=torch.Generator().manual_seed(1))
    rows = UpdateRows(
        [prompt] * case.rows,
        [c for _, c in pairs],
        adv,
        [[-1.0] * len(c) for _, c in pairs],
    )
    return lambda: update(rows, fallback=rows)


def predicted(case: Case, model, tokenizer) -> tuple[int, list[str]]:
    config = model.config.to_dict()
    shape = ModelShape.from_config(config)
    deepspeed = case.engine.kind == "deepspeed"
    place = Placement(
        precision=case.engine.precision if deepspeed else "fp32",
        zero_stage=case.engine.zero_stage if deepspeed else 0,  # type: ignore[arg-type]
        gradient_checkpointing=case.engine.gradient_checkpointing, reference=case.beta > 0,
        bucket_elements=int(case.engine.bucket_size) if deepspeed else 0,
    )  # fmt: skip
    prompt = len(rows_of(case, tokenizer)[0][0])
    per_row = prompt + case.completion_tokens
    rows_per_micro = max(1, min(case.rows, case.engine.micro_batch_tokens // per_row))
    step = Step(
        tokens=rows_per_micro * per_row,
        logit_positions=rows_per_micro
        * (case.completion_tokens if case.kind == "grpo" else per_row),
        loss=case.kind,  # type: ignore[arg-type]
        logits_budget=case.engine.logits_budget,
        micro_batches=-(-case.rows // rows_per_micro),
        fused_head=case.engine.fused_head,
    )
    estimate = step_estimate(shape, place, step)
    return estimate.peak, estimate.lines()


def run_case(case: Case, tokenizer) -> tuple[int, int]:
    with AllocationRecord() as record:
        torch.manual_seed(0)
        model = build_model(
            case.model, case.vocab, tokenizer.pad_token_id, tokenizer.eos_token_id, 0
        )
        engine = engine_for(case, model, 1e-4 if case.kind == "sft" else 1e-6)
        make = sft_step if case.kind == "sft" else grpo_step
        step = make(case, engine, tokenizer)
        step()  # warm-up: AdamW's moments exist from here on
        record.measure(step)
    prediction, lines = predicted(case, model, tokenizer)
    print("\n".join("    " + line for line in lines))
    if case.engine.kind == "deepspeed":
        for name, size in optimizer_tensors(engine.engine.optimizer).items():
            print(f"    held by DeepSpeed's optimizer after the step: {name} {size / MiB:.1f} MiB")
        engine.close()
    return prediction, record.peak


def optimizer_tensors(optimizer, smallest: int = MiB) -> dict[str, int]:
    """Bytes of the tensors a DeepSpeed ZeRO optimizer holds, by its attribute (the wrapped
    torch optimizer's state as `state`), each storage counted once; attributes holding less
    than `smallest` left out."""
    seen: dict[int, tuple[str, int]] = {}

    def walk(value, name: str, depth: int = 0) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen.setdefault(storage.data_ptr(), (name, storage.nbytes()))
        elif isinstance(value, (list, tuple)) and depth < 3:
            for item in value:
                walk(item, name, depth + 1)
        elif isinstance(value, dict) and depth < 3:
            for item in value.values():
                walk(item, name, depth + 1)
        elif hasattr(value, "buffer") and depth < 3:  # a reduce bucket (`ipg_buckets`)
            walk(value.buffer, name, depth + 1)

    for name, value in vars(optimizer).items():
        if name != "optimizer":
            walk(value, name)
    walk(list(optimizer.optimizer.state.values()), "state")
    totals: dict[str, int] = {}
    for name, size in seen.values():
        totals[name] = totals.get(name, 0) + size
    return {k: v for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v >= smallest}


# The published config.json of the GPU profile's checkpoints (the shapes the estimate reads).
PUBLISHED: dict[str, dict[str, object]] = {
    "Qwen2.5-1.5B-Instruct": dict(
        model_type="qwen2", num_hidden_layers=28, hidden_size=1536, intermediate_size=8960,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen2.5-0.5B-Instruct": dict(
        model_type="qwen2", num_hidden_layers=24, hidden_size=896, intermediate_size=4864,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Llama-3.2-1B-Instruct": dict(
        model_type="llama", num_hidden_layers=16, hidden_size=2048, intermediate_size=8192,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        tie_word_embeddings=True,
    ),
}  # fmt: skip


def profile_fits(profile: str, gpu_gib: float) -> int:
    """Each GPU stage of `profile` against a GPU of `gpu_gib` GiB, with the checkpoints' shapes
    from PUBLISHED (folders holding only their config.json, so no download is needed)."""
    import json
    import tempfile
    from pathlib import Path

    from configs.profiles import load_profile
    from training.memory_fit import memory_fits

    with tempfile.TemporaryDirectory() as root:
        for name, config in PUBLISHED.items():
            (Path(root) / name).mkdir()
            (Path(root) / name / "config.json").write_text(json.dumps(config))
        config = load_profile(profile, [])
        boot = config.bootstrap
        if boot.path is not None and boot.path.name in PUBLISHED:
            boot = boot.model_copy(update={"path": Path(root) / boot.path.name})
        students = [
            s.model_copy(update={"path": Path(root) / s.path.name})
            if s.path is not None and s.path.name in PUBLISHED
            else s
            for s in config.distillation.students
        ]
        distill = config.distillation.model_copy(update={"students": students})
        config = config.model_copy(update={"bootstrap": boot, "distillation": distill})
        fits = memory_fits(config, int(gpu_gib * GiB))
    print(f"{'stage':36} {'peak GiB':>9}  moment            fits {gpu_gib:g} GiB")
    for fit in fits:
        moment = fit.lines[0].split(" at ")[1]
        print(f"{fit.key:36} {fit.peak / GiB:9.1f}  {moment:17} {'yes' if fit.fits else 'NO'}")
    return 0 if all(fit.fits for fit in fits) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the two smallest cases")
    parser.add_argument("--case", action="append", help="run only these cases (by name)")
    parser.add_argument("--profile", help="instead: the profile's GPU stages against a GPU")
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="with --profile")
    args = parser.parse_args(argv)
    if args.profile:
        return profile_fits(args.profile, args.gpu_gib)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    tokenizer = tokenizer_for_cases()
    names = args.case or (QUICK if args.quick else [c.name for c in CASES])
    worst = 0.0
    print(f"{'case':26} {'predicted MiB':>14} {'measured MiB':>13} {'ratio':>6}")
    for case in (c for c in CASES if c.name in names):
        prediction, measured = run_case(case, tokenizer)
        ratio = prediction / measured
        worst = max(worst, abs(ratio - 1))
        print(f"{case.name:26} {prediction / MiB:14.1f} {measured / MiB:13.1f} {ratio:6.3f}")
    print(f"largest difference: {worst:.1%} (tolerance {TOLERANCE:.0%}); GiB = {GiB}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())

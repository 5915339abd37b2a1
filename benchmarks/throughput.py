"""Throughput and model FLOPs utilisation of generation and training, for benchmarks.gpu_validate
and benchmarks.gpu_check.

Model FLOPs (the PaLM paper's MFU convention): a token costs 2 * N FLOPs in a forward pass and
6 * N in a training step (forward, and a backward of twice the forward), where N counts the
parameters whose matmuls every token pays for: all of them, the LM head included, except an input
embedding table that is not also the LM head (a lookup costs no FLOPs; a tied table is counted
once, as the head). Attention's own matmuls come on top (`attention_flops`): for a causal sequence
of s tokens, the scores and their weighted sum cost 2 * s^2 * d * H per layer forward (s^2 / 2
query-key pairs, 2 FLOPs a multiply-add, twice), 6 * s^2 * d * H to train, d the head size and
H the query heads; a decoded token attends to its whole context (4 * context * d * H per layer).
Padding is not counted: only the tokens that carry content. MFU is the FLOPs over the seconds
over the device's dense bf16 peak (PEAK_BF16_TFLOPS).

Counted over the positions that carry loss (`loss_training_flops`, the GPU check's SFT headline):
every content position still pays for the layers (a prompt's tokens are attended to), but the LM
head's share of N is paid only where a position predicts a labelled token: a step that runs the
head over a prompt or padding does work no loss reads. At Qwen2.5-0.5B's shape the tied head is
27.6% of N, so a 512-token row with a 64-token prompt counts 3.4% fewer FLOPs this way.

Generation counts each prompt's prefill once (both samplers share one prefill among a prompt's
samples) and each generated token once. A GRPO step counts its sampling like that, plus a
training step over every sample's prompt and completion (the validation's config trains on every
sample: no dynamic sampling, no truncation mask, no reference model, one inner iteration).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from problems.types import Problem
from rl.trainer import GRPOTrainer
from sampling.factory import Sampler
from sampling.interface import SamplingParams
from training.batches import collate
from training.examples import Example

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s; first match
# of the device name wins, so the more specific names come first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100", 989.4),  # SXM
    ("H200", 989.4),
    ("A100", 312.0),
)


@dataclass(frozen=True)
class Measurement:
    name: str
    tokens: int  # tokens the rate is quoted in: generated, or trained on
    seconds: float
    flops: float  # model FLOPs of the work timed
    note: str = ""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    def mfu(self, peak_tflops: float | None) -> float | None:
        return None if peak_tflops is None else self.tflops / peak_tflops


def peak_tflops(device_name: str) -> float | None:
    for key, value in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return value
    return None


def flop_parameters(model: PreTrainedModel) -> int:
    """N of the 6N / 2N rule: see the module's docstring."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    return total if tied else total - embedding.numel()


def head_parameters(model: PreTrainedModel) -> int:
    """The LM head's share of N: its weight (and bias), paid at each position it runs on."""
    head = model.get_output_embeddings()
    return 0 if head is None else sum(p.numel() for p in head.parameters())


def attention_flops(config, lengths: Sequence[int], passes: float = 3.0) -> float:
    """The causal attention matmuls of sequences of `lengths` tokens under a transformers
    `config`: 2 * s^2 * d * H per layer forward, times `passes` (3: forward and backward)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    squares = sum(float(s) * s for s in lengths)
    return passes * 2.0 * squares * head_dim * heads * config.num_hidden_layers


def training_flops(n_params: int, config, lengths: Sequence[int]) -> float:
    """A training step over sequences of `lengths` tokens: 6N a token, plus attention."""
    return 6.0 * n_params * sum(lengths) + attention_flops(config, lengths)


def loss_training_flops(
    n_params: int, n_head: int, config, lengths: Sequence[int], loss_positions: int
) -> float:
    """A training step over sequences of `lengths` tokens whose LM head counts only at the
    `loss_positions` that carry loss: 6 (N - head) a token, 6 head a loss position, attention."""
    body = 6.0 * (n_params - n_head) * sum(lengths) + 6.0 * n_head * loss_positions
    return body + attention_flops(config, lengths)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def precision(device: torch.device, bf16: bool) -> Iterator[None]:
    """bf16 autocast over fp32 weights (mixed precision), or plain fp32."""
    if not bf16:
        yield
        return
    with torch.autocast(device.type, dtype=torch.bfloat16):
        yield


def prompt_tokens(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]


def measure_generation(
    name: str,
    sampler: Sampler,
    prompts: list[str],
    n: int,
    params: SamplingParams,
    prompt_lengths: list[int],
    n_params: int,
    device: torch.device,
) -> Measurement:
    """Completion tokens per second of one `generate` over all prompts, after a short warm-up
    (CUDA context, kernels, the allocator)."""
    warm = SamplingParams(params.temperature, params.top_p, min(8, params.max_new_tokens))
    sampler.generate(prompts[:2], 1, warm)
    synchronize(device)
    began = time.perf_counter()
    groups = sampler.generate(prompts, n, params)
    synchronize(device)
    seconds = time.perf_counter() - began
    generated = sum(len(c.token_ids) for group in groups for c in group)
    flops = 2.0 * n_params * (generated + sum(prompt_lengths))
    mean = generated / max(1, len(prompts) * n)
    return Measurement(name, generated, seconds, flops, f"{mean:.0f} tokens per completion")


def measure_sft(
    model: PreTrainedModel,
    examples: list[Example],
    batch_size: int,
    steps: int,
    pad_id: int,
    bf16: bool,
    n_params: int,
) -> Measurement:
    """Tokens per second of plain SFT steps (AdamW, clipping): one warm-up step, then `steps`
    timed ones, each on the next `batch_size` examples."""
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    model.train()

    def step(i: int) -> int:
        rows = [examples[(i * batch_size + j) % len(examples)] for j in range(batch_size)]
        batch = {k: v.to(device) for k, v in collate(rows, pad_id).items()}
        with precision(device, bf16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return int(batch["attention_mask"].sum())

    step(0)
    synchronize(device)
    began = time.perf_counter()
    tokens = sum(step(i + 1) for i in range(steps))
    synchronize(device)
    seconds = time.perf_counter() - began
    note = f"{steps} steps of {batch_size}, {'bf16 autocast' if bf16 else 'fp32'}"
    return Measurement("training sft", tokens, seconds, 6.0 * n_params * tokens, note)


def measure_grpo(
    trainer: GRPOTrainer,
    batches: list[list[Problem]],
    render: Callable[[str], str],
    bf16: bool,
    n_params: int,
) -> Measurement:
    """Tokens (prompts and completions of every sample) per second of whole GRPO steps:
    sampling, scoring, the update and, with vLLM, the weight sync. The first batch warms up."""
    cfg, device = trainer.cfg, next(trainer.model.parameters()).device
    g = cfg.group_size
    with precision(device, bf16):
        trainer.step(0, batches[0])
    seconds = sampled = flops = tokens = trained = 0.0
    parts = {"time/sample_seconds": 0.0, "sync/seconds": 0.0}
    for i, batch in enumerate(batches[1:], start=1):
        synchronize(device)
        began = time.perf_counter()
        with precision(device, bf16):
            metrics = trainer.step(i, batch)
        synchronize(device)
        seconds += time.perf_counter() - began
        prompts = sum(prompt_tokens(trainer.tokenizer, [render(p.question) for p in batch]))
        completions = metrics["completion/mean_tokens"] * len(batch) * g
        tokens += g * prompts + completions
        flops += 2.0 * n_params * (prompts + completions) + 6.0 * n_params * (
            g * prompts + completions
        )
        sampled += len(batch) * g
        trained += metrics["samples/trained"]
        for key in parts:
            parts[key] += metrics.get(key, 0.0)
    sampling, sync = parts["time/sample_seconds"], parts["sync/seconds"]
    note = (
        f"{len(batches) - 1} steps of {len(batches[0])}x{g}; sampling {sampling:.2f} s, "
        f"sync {sync:.2f} s; trained {trained:.0f}/{sampled:.0f} samples"
    )
    return Measurement("training grpo step", int(tokens), seconds, flops, note)

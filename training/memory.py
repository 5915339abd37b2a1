"""The memory model: the peak bytes one rank's training step holds, from the model's shape and
the step's settings, before anything is loaded.

What a step holds, counted from the code that runs it (transformers' Qwen2/Llama layers, our
log-probability and loss paths, torch's AdamW, DeepSpeed ZeRO's partitions) rather than fitted:

- **resident**: weights; gradients (a trainer in this process keeps whole ones from the backward
  pass to the optimizer step); AdamW's two moments; under DeepSpeed, the fp32 master partition,
  the moments and ZeRO-3's fp32 gradient partition are 1/world each, the bf16 weights whole
  (ZeRO-1, 2) or 1/world (ZeRO-3), ZeRO-3's reduce bucket whole, ZeRO-1's fp32 gradients whole
  (DeepSpeed's BF16_Optimizer adds each bf16 gradient to them as it is made and lets it go);
  ZeRO-2's gradient partition and reduce bucket are held from a step's first reduction to its
  update (the bucket let go before the update), so not at the start of its first backward
  pass; a frozen reference in the policy's dtype;
  a colocated vLLM engine's share of the device (none while it sleeps through the update).
- **activations** kept for the backward pass, per token and decoder layer, where `b` is the
  compute dtype's size: each RMSNorm keeps its float32 input and its normalised output
  (4H + bH), attention its projections' input, q and k before and after the rotary embedding,
  q, k and v as SDPA takes them, its output and log-sum-exp, and o_proj's input
  (6bH + 4bK + 4 per head, K = kv heads x head dim), the MLP its input and gate, activation, up
  and product (bH + 4bI): 8H + 9bH + 4bK + 4bI + 4A bytes. With gradient checkpointing a layer
  keeps only its input (bH), and the backward pass recomputes one layer at a time.
- **logits**: when a pass's logits fit `engine.logits_chunk_mb`, SFT goes through
  transformers' cross-entropy over every position (logits, their float32 copy and log-softmax
  forward; log-softmax and two float32 gradients backward), GRPO through a log-softmax over the
  completion positions; else both run the head a chunk of positions at a time
  (training/logits.py), holding one chunk's logits and the head's float32 gradient (with
  `engine.fused_head`, a chunk's logits and their gradient in the model's precision only).
- **optimizer step**: AdamW's temporaries (one float32 tensor per parameter tensor on CPU, one
  per parameter group, i.e. the whole model, with its multi-tensor kernels on a GPU).

The peak is the resident state plus the largest of three moments: the end of the forward pass,
the start of the backward pass (all activations, the loss's gradients, the LM head's gradient),
and the optimizer step (every gradient and the step's temporaries). Not counted: the CUDA
context and NCCL's buffers (outside torch's allocator), the allocator's fragmentation (measured
by `torch.cuda.memory_reserved` against `max_memory_allocated`), attention-score memory (flash
and per-sequence SDPA keep none), and a sleeping vLLM engine's remainder. benchmarks/
memory_model.py checks the figures against torch's own allocation record on CPU, and
benchmarks/gpu_check.py against `torch.cuda.max_memory_allocated` on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FP32 = 4
GiB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """A decoder's sizes, as the memory model counts them (Qwen2- and Llama-style)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    head_dim: int = 0  # 0: hidden // heads
    qkv_bias: bool = True  # Qwen2's q, k and v projections have biases; Llama's have none

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.head_dim or self.hidden // self.heads)

    @property
    def q_width(self) -> int:
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def parameters(self) -> int:
        h, k, q = self.hidden, self.kv_width, self.q_width
        attention = h * q + 2 * h * k + q * h + (q + 2 * k if self.qkv_bias else 0)
        layer = attention + 3 * h * self.intermediate + 2 * h
        head = 0 if self.tied else self.vocab * h
        return self.vocab * h + self.layers * layer + h + head

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """From a checkpoint's config.json (or a transformers config's `to_dict()`): Qwen2's and
        Llama's names, GPT-2's (n_layer, n_embd, n_head, n_inner: GPT-2, GPT-J, StarCoder) and a
        multimodal checkpoint's `text_config`; a config with none of a size's names is refused
        by name (ValueError). GPT-2's two-matrix MLP is counted as a gated one: an over-estimate
        of its memory."""
        text = config.get("text_config")
        config = text if isinstance(text, dict) else config

        def read(*names: str) -> Any:
            for name in names:
                if config.get(name) is not None:
                    return config[name]
            raise ValueError(
                f"config.json (model_type {config.get('model_type')!r}) has none of "
                f"{', '.join(names)}: the memory model reads Qwen2-, Llama- and GPT-2-style configs"
            )

        hidden = read("hidden_size", "n_embd")
        heads = read("num_attention_heads", "n_head")
        intermediate = config.get("intermediate_size") or config.get("n_inner") or 4 * hidden
        return cls(
            layers=read("num_hidden_layers", "n_layer"),
            hidden=hidden,
            intermediate=intermediate,
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            vocab=read("vocab_size"),
            tied=bool(config.get("tie_word_embeddings", False)),
            head_dim=config.get("head_dim") or 0,
            qkv_bias=config.get("model_type", "qwen2") in ("qwen2", "gpt2")
            or bool(config.get("attention_bias", False)),
        )


@dataclass(frozen=True)
class Placement:
    """Where and how the step runs on one rank."""

    precision: Literal["fp32", "bf16"] = "fp32"
    zero_stage: Literal[0, 1, 2, 3] = 0  # 0: a trainer in this process (LocalEngine)
    world: int = 1
    gradient_checkpointing: bool = False
    reference: bool = False  # GRPO with beta > 0
    bucket_elements: int = 0  # ZeRO's reduce bucket; ZeRO-3's prefetch of parameters too
    engine_share_bytes: int = 0  # a colocated vLLM engine's memory while it is awake
    engine_sleeps: bool = True  # ... and whether it gives it back for the update
    device: Literal["cpu", "cuda"] = "cpu"

    @property
    def dtype_bytes(self) -> int:
        return 2 if self.precision == "bf16" else FP32


@dataclass(frozen=True)
class Step:
    """One micro-batch: its tokens (prompts and completions, packed) and the positions its loss
    reads logits at; `loss`: SFT's cross-entropy or GRPO's log-probabilities."""

    tokens: int
    logit_positions: int
    loss: Literal["sft", "grpo"] = "sft"
    packed: bool = True  # one row, per-sequence attention (training/varlen.py)
    logits_budget: int | None = None  # float32 elements one pass may hold
    entropy: bool = True  # GRPO logs the policy's entropy
    micro_batches: int = 1  # in the step: from the second on, gradients accumulate
    fused_head: bool = False  # a chunk's elementwise work compiled (training/fused_head.py)


@dataclass
class Estimate:
    """Bytes by component and by moment; `peak` is the largest moment."""

    resident: dict[str, int] = field(default_factory=dict)
    moments: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def resident_bytes(self) -> int:
        return sum(self.resident.values())

    def moment_bytes(self, name: str) -> int:
        return self.resident_bytes + sum(self.moments[name].values())

    @property
    def peak_moment(self) -> str:
        return max(self.moments, key=self.moment_bytes)

    @property
    def peak(self) -> int:
        return self.moment_bytes(self.peak_moment)

    def lines(self) -> list[str]:
        """The estimate as readable lines, largest terms first."""
        out = [f"peak {self.peak / GiB:.2f} GiB at {self.peak_moment}"]
        for name, size in sorted(self.resident.items(), key=lambda kv: -kv[1]):
            out.append(f"  {name}: {size / GiB:.2f} GiB (resident)")
        for name, size in sorted(self.moments[self.peak_moment].items(), key=lambda kv: -kv[1]):
            out.append(f"  {name}: {size / GiB:.2f} GiB")
        return out


def activation_bytes_per_token(shape: ModelShape, place: Placement, packed: bool = True) -> int:
    """What one decoder layer keeps for the backward pass per token (see the module's doc)."""
    b, h = place.dtype_bytes, shape.hidden
    if place.gradient_checkpointing:
        return b * h  # the layer's input
    return layer_bytes_per_token(shape, place, packed)


def layer_bytes_per_token(shape: ModelShape, place: Placement, packed: bool = True) -> int:
    """One layer's activations, nothing checkpointed (also what a recomputed layer holds).

    RMSNorm: its float32 input, 1/rms and the normalised output. Attention: the projections'
    input, q, k and v as SDPA takes them (the rotary embedding keeps only cos and sin, shared by
    every layer), SDPA's log-sum-exp and output; o_proj reads that output in place, except that
    per-sequence attention over a packed row joins the sequences' outputs into a copy. MLP: its
    input, the gate, its activation, up and their product."""
    b, h, q, k, i = (
        place.dtype_bytes,
        shape.hidden,
        shape.q_width,
        shape.kv_width,
        shape.intermediate,
    )
    norms = 2 * (FP32 * h + FP32 + b * h)
    joined = packed and place.device != "cuda"  # per-sequence SDPA joins its pieces; varlen not
    attention = b * h + b * q + 2 * b * k + FP32 * shape.heads + b * q + (b * q if joined else 0)
    mlp = b * h + 4 * b * i
    return norms + attention + mlp


def resident(shape: ModelShape, place: Placement, optimizer_ready: bool = True) -> dict[str, int]:
    """The state a rank holds through the step."""
    n, b, w = shape.parameters, place.dtype_bytes, place.world
    out: dict[str, int] = {}
    if place.zero_stage == 0:
        out["weights"] = n * b
        if optimizer_ready:
            out["adam moments"] = 2 * n * b
    else:
        out["weights"] = n * b if place.zero_stage < 3 else _ceil(n, w) * b
        out["fp32 master partition"] = _ceil(n, w) * FP32
        if optimizer_ready:
            out["adam moments (partition)"] = 2 * _ceil(n, w) * FP32
        if place.zero_stage == 1:  # BF16_Optimizer's flat buffer, every rank the whole model's
            out["fp32 gradients"] = n * FP32
        if place.zero_stage == 3:  # ZeRO-2's only within a step (`zero2_reduction_bytes`)
            out["fp32 gradient partition"] = _ceil(n, w) * FP32
            out["reduce bucket"] = place.bucket_elements * b  # allocated with the optimizer
    if place.reference:
        out["reference"] = n * b if place.zero_stage < 3 else _ceil(n, w) * b
    return out


def _ceil(n: int, w: int) -> int:
    return -(-n // w)


def logits_moments(shape: ModelShape, place: Placement, step: Step) -> tuple[int, int]:
    """(forward, backward) peak bytes of the loss's logits and their gradients.

    Whole (the pass's logits fit `logits_budget`, or no budget): per logit the output
    projection's result (b bytes), then float32 tensors, at most three at once: the upcast (bf16
    only) and its division by the temperature, the log-softmax (kept for the backward pass) and,
    for the entropy, its exp and their product; backward, the kept log-softmax, the gradient
    reaching it and the gradient it passes on. SFT goes through transformers' cross-entropy over
    every position, GRPO over the completion positions. In chunks (training/logits.py), see
    `_chunked_moments`."""
    v, b, k = shape.vocab, place.dtype_bytes, step.logit_positions
    upcast = FP32 if b != FP32 else 0  # `.float()` copies only a lower precision
    backward = 3 * FP32
    if not _fits(step, shape):
        return _chunked_moments(shape, place, step)
    if step.loss == "sft":  # transformers' cross-entropy over every position
        t = step.tokens
        return t * v * (b + upcast + FP32), t * v * backward
    entropy = 2 * FP32 if step.entropy else 0  # exp and its product with the log-softmax
    per_logit = b + max(upcast + FP32, 2 * FP32, FP32 + entropy)
    return step.tokens * v * b + k * v * per_logit, k * v * backward


def _chunked_moments(shape: ModelShape, place: Placement, step: Step) -> tuple[int, int]:
    """The chunked head's (forward, backward) bytes beyond the final hidden states.

    A chunk of c positions: the projection's result (b bytes a logit) and its float32 copy,
    then one more float32 tensor (logsumexp's shifted copy, or the softmax for the entropy);
    its gradient on the logits in place of the copy, and again in b bytes. The head's gradient
    is summed in float32 (V x H) and, in bf16, each chunk's share passes through a bf16 matrix
    first. The completion positions' hidden states are copied out (K x H) and their gradient
    is K x H.
    Fused (`step.fused_head`), a chunk holds its logits and, beside them, their gradient, both
    in b bytes, and nothing in float32.
    SFT computes its gradients in the forward pass and keeps them until the backward pass (the
    head's converted to the weight's dtype at the end); GRPO keeps the positions' hidden
    states and log-sum-exps, and computes the gradients in the backward pass."""
    v, b, h, k = shape.vocab, place.dtype_bytes, shape.hidden, step.logit_positions
    c = min(k, max(1, (step.logits_budget or 0) // v))
    upcast = FP32 if b != FP32 else 0
    chunk_forward = c * v * (b + FP32) if upcast else c * v * 2 * FP32
    chunk_forward = max(chunk_forward, c * v * 2 * FP32)
    chunk_backward = c * v * (FP32 + (b if upcast else 0))
    product = v * h * b if upcast else 0  # a chunk's share of the head's gradient, bf16
    head_grad = v * h * FP32
    positions = k * h * b  # the positions' hidden states, copied out
    if step.fused_head:  # the logits and their gradient in b bytes, no float32 chunk between
        middle, after = 2 * c * v * b, c * v * b + product
        if step.loss == "sft":
            forward = positions + positions + head_grad + max(middle, after)
            return forward, positions + v * h * b
        forward = positions + k * FP32 + c * v * b
        return forward, positions + k * FP32 + positions + head_grad + max(middle, after)
    if step.loss == "sft":
        forward = positions + positions + head_grad + max(chunk_forward, chunk_backward + product)
        return forward, positions + v * h * b
    forward = positions + k * FP32 + chunk_forward
    backward = positions + k * FP32 + positions + head_grad + chunk_backward + product
    return forward, backward


def gathered_bytes(shape: ModelShape, place: Placement) -> int:
    """ZeRO-3's whole parameters while a layer runs: the layer's and the prefetch bucket's."""
    if place.zero_stage != 3:
        return 0
    layer = (shape.parameters - shape.vocab * shape.hidden) // max(1, shape.layers)
    return min(shape.parameters, place.bucket_elements + layer) * place.dtype_bytes


def zero2_reduction_bytes(shape: ModelShape, place: Placement) -> int:
    """ZeRO-2's gradient partition and its reduce bucket: DeepSpeed allocates the bucket when the
    backward pass's first gradient is ready (after the loss's and the LM head's logits), the
    partition when a bucket is first reduced, and frees both in the optimizer step
    (`stage_1_and_2.py` `setup_buckets`, `copy_grads_in_partition`, `_release_ipg_buffers`).
    ZeRO-3 holds its partition throughout (`resident`)."""
    if place.zero_stage != 2:
        return 0
    return _ceil(shape.parameters, place.world) * FP32 + reduce_bucket(place)


def reduce_bucket(place: Placement) -> int:
    """ZeRO-2's reduce bucket, in the model's precision (one: no overlapped communication);
    ZeRO-3's, the same size, is resident (`stage3.py` allocates it with the optimizer)."""
    return place.bucket_elements * place.dtype_bytes if place.zero_stage == 2 else 0


def gradient_bytes(shape: ModelShape, place: Placement) -> int:
    """Whole gradients, held in this process from a micro-batch's backward pass to the optimizer
    step (ZeRO reduces each into its partition during the backward pass instead)."""
    return shape.parameters * place.dtype_bytes if place.zero_stage == 0 else 0


def optimizer_step_bytes(shape: ModelShape, place: Placement) -> int:
    """Gradients held at the optimizer step and AdamW's temporaries."""
    n, b = shape.parameters, place.dtype_bytes
    if place.zero_stage == 0:
        largest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate)
        temporaries = n * b if place.device == "cuda" else largest * b  # foreach vs per tensor
        return n * b + temporaries
    part = _ceil(n, place.world)
    if place.zero_stage == 1:  # the gradients are resident; AdamW over one flat partition holds
        return part * FP32 * (2 if place.device == "cpu" else 1)  # two temporaries at once on
        # CPU (its denominator); torch's fused kernel on a GPU none (one kept: not measured)
    return part * FP32 + part * FP32  # the update's temporary over the fp32 partition


def step_estimate(shape: ModelShape, place: Placement, step: Step) -> Estimate:
    """Peak bytes of a step: a micro-batch's forward and backward, and the optimizer step.

    Moments: the end of the forward pass; the start of the backward pass (the logits'
    gradients, before the LM head's); under ZeRO-2, the first reduction (the backward pass's
    first gradients reach the reduce bucket), under ZeRO-1 the LM head's bf16 gradient made
    (held until the embedding's is added to it, then added to the fp32 gradients); with
    gradient checkpointing, a layer recomputed;
    the optimizer step. From a step's second micro-batch on, a trainer in this process holds the
    gradients accumulated so far through all of them, and ZeRO-2 its gradient partition."""
    est = Estimate(resident=resident(shape, place))
    b, h = place.dtype_bytes, shape.hidden
    per_layer = activation_bytes_per_token(shape, place, step.packed)
    rope = 2 * b * (shape.head_dim or h // shape.heads)  # cos and sin, shared by the layers
    acts = step.tokens * (shape.layers * per_layer + rope + 8)  # + the input ids
    final = step.tokens * (FP32 * h + FP32 + 2 * b * h)  # final norm and the states it returns
    forward_logits, backward_logits = logits_moments(shape, place, step)
    partition = zero2_reduction_bytes(shape, place)
    accumulated = gradient_bytes(shape, place) + partition if step.micro_batches > 1 else 0
    acts += gathered_bytes(shape, place)
    est.moments["forward end"] = {
        "activations": acts,
        "final hidden states": final,
        "logits (forward)": forward_logits,
        "accumulated gradients": accumulated,
    }
    est.moments["backward start"] = {
        "activations": acts,
        "final hidden states": final,
        "logits (backward)": backward_logits,
        "accumulated gradients": accumulated,
    }
    if place.zero_stage == 2:  # the first gradients reach the reduce bucket
        est.moments["first reduction"] = {
            "activations": acts,
            "final hidden states": final,
            "LM head's gradient": shape.vocab * h * b,  # summed with the embedding's, at the end
            "reduce bucket": 0 if accumulated else reduce_bucket(place),  # else accumulated's
            "accumulated gradients": accumulated,
        }
    if place.zero_stage == 1:
        est.moments["LM head's gradient made"] = {
            "activations": acts,
            "final hidden states": final,
            "LM head's gradient": shape.vocab * h * b,
        }
    if place.gradient_checkpointing:
        est.moments["layer recomputed"] = {
            "activations": acts,
            "recomputed layer": step.tokens * layer_bytes_per_token(shape, place, step.packed),
            "gradients": gradient_bytes(shape, place) + partition,
        }
    est.moments["optimizer step"] = {  # ZeRO-2's reduce bucket is let go before the update
        "gradients and AdamW temporaries": optimizer_step_bytes(shape, place)
        + partition
        - reduce_bucket(place)
    }
    if place.engine_share_bytes and not place.engine_sleeps:
        for moment in est.moments.values():
            moment["vLLM engine (awake)"] = place.engine_share_bytes
    if place.engine_share_bytes:
        est.moments["sampling"] = {"vLLM engine (awake)": place.engine_share_bytes}
    return est


def _fits(step: Step, shape: ModelShape) -> bool:
    return step.logits_budget is None or step.tokens * shape.vocab <= step.logits_budget


def sampling_bytes(
    shape: ModelShape, rows: int, context: int, prompt: int, dtype_bytes: int
) -> int:
    """A generate call's peak on a whole copy of the model (training/whole_copy.py): its weights,
    the KV cache of `rows` sequences of `context` tokens (the cache grows by concatenation, so a
    step can hold the old and the new one), the prefill of `rows` prompts of `prompt` tokens (a
    layer's activations at a time: its input, q/k/v, attention output and MLP intermediates),
    and a step's logits in float32 with the sampling's temporaries."""
    b, h = dtype_bytes, shape.hidden
    weights = shape.parameters * b
    kv = rows * context * shape.layers * 2 * shape.kv_width * b
    prefill = rows * prompt * (4 * b * h + 2 * b * shape.kv_width + 3 * b * shape.intermediate)
    logits = rows * shape.vocab * (b + 3 * FP32)
    return weights + 2 * kv + prefill + logits

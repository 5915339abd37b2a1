"""One decode step of a Qwen2 or Llama model in plain tensor ops: the same logits, less Python.

A decode step of a small model on CPU is mostly per-call overhead: transformers' forward runs a
dozen `nn.Module` calls per layer, each with its hook checks, plus decorators, keyword handling
and output objects, around a few dozen tensor ops that take microseconds each. `DecodeStep` reads
the model's weights once and runs the same ops in the same order on them (embedding, per layer:
RMSNorm, the q/k/v projections, rotary embedding, the cache write, one-query attention in two
matmuls, the output projection, RMSNorm, the SiLU-gated MLP; the final norm and the LM head), so
its logits are the model's bit for bit (tests/sampling/test_decode_step.py) at a fraction of the
calls. Models of other kinds, or with settings it does not reproduce, decode through the model's
own forward (`decode_step_for` returns None).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from sampling.attention import NAME as MATMUL_DECODE
from sampling.kv_cache import GrowingLayer

SUPPORTED = ("qwen2", "llama")


@dataclass(frozen=True)
class _Norm:
    weight: torch.Tensor
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """transformers' Qwen2/Llama RMSNorm, op for op."""
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(dtype)


@dataclass(frozen=True)
class _Linear:
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass(frozen=True)
class _Layer:
    input_norm: _Norm
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    post_norm: _Norm
    gate: _Linear
    up: _Linear
    down: _Linear


def _linear(module: torch.nn.Module) -> _Linear:
    return _Linear(module.weight, module.bias)  # type: ignore[arg-type]


def _norm(module: torch.nn.Module) -> _Norm:
    return _Norm(module.weight, float(module.variance_epsilon))  # type: ignore[arg-type]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecodeStep:
    """The model's next-token logits for one new token per row, its cache updated in place.

    Call with the rows' tokens (A,), their positions (A,), the additive attention mask
    (A, 1, 1, L) over the cache plus this token, and the cache the prompt pass filled.
    """

    def __init__(self, model: PreTrainedModel):
        core = model.model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = core.layers[0].self_attn.head_dim
        self.scaling = core.layers[0].self_attn.scaling
        self.embed = core.embed_tokens.weight
        self.inv_freq = core.rotary_emb.inv_freq
        self.rope_scaling = core.rotary_emb.attention_scaling
        self.norm = _norm(core.norm)
        self.head = _linear(model.lm_head)
        self.layers = [
            _Layer(
                _norm(layer.input_layernorm),
                _linear(layer.self_attn.q_proj),
                _linear(layer.self_attn.k_proj),
                _linear(layer.self_attn.v_proj),
                _linear(layer.self_attn.o_proj),
                _norm(layer.post_attention_layernorm),
                _linear(layer.mlp.gate_proj),
                _linear(layer.mlp.up_proj),
                _linear(layer.mlp.down_proj),
            )
            for layer in core.layers
        ]

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos and sin (A, 1, 1, D) of the rows' positions, as transformers computes them."""
        freqs = positions[:, None, None].float() * self.inv_freq.float()  # (A, 1, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scaling).to(dtype)
        sin = (emb.sin() * self.rope_scaling).to(dtype)
        return cos[:, None], sin[:, None]

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        rows = tokens.shape[0]
        hidden = F.embedding(tokens[:, None], self.embed)  # (A, 1, E)
        cos, sin = self._rotary(positions, hidden.dtype)
        group = self.heads // self.kv_heads
        for i, layer in enumerate(self.layers):
            x = layer.input_norm(hidden)
            q = layer.q(x).view(rows, 1, -1, self.head_dim).transpose(1, 2)  # (A, H, 1, D)
            k = layer.k(x).view(rows, 1, -1, self.head_dim).transpose(1, 2)  # (A, KV, 1, D)
            v = layer.v(x).view(rows, 1, -1, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = cache.layers[i].update(k, v)  # (A, KV, L, D)
            q = q.view(rows, self.kv_heads, group, self.head_dim)  # query heads by KV head
            scores = torch.matmul(q, keys.transpose(-1, -2)) * self.scaling  # (A, KV, G, L)
            weights = (scores + mask).softmax(dim=-1, dtype=torch.float32).to(values.dtype)
            out = torch.matmul(weights, values).view(rows, 1, -1)  # (A, 1, H * D)
            hidden = hidden + layer.o(out)
            x = layer.post_norm(hidden)
            hidden = hidden + layer.down(F.silu(layer.gate(x)) * layer.up(x))
        return self.head(self.norm(hidden))[:, -1]  # (A, V)


# What a DeepSpeed engine hooks onto the whole model it wraps: its forward's prologue and
# epilogue (timers, the FLOPs profiler, fp16 input casts, ZeRO-3's parameter discovery). Over
# whole weights (ZeRO-1/2) none of it changes a decode step's logits, so the step may skip them.
_ENGINE_HOOKS = ("_module_forward_pre_hook", "_module_forward_post_hook")


def _engine_hook(hook: object) -> bool:
    function = getattr(hook, "__func__", hook)
    module = getattr(function, "__module__", "") or ""
    return module.startswith("deepspeed.") and function.__name__ in _ENGINE_HOOKS


def _hooked(module: torch.nn.Module) -> bool:
    """Whether a forward of `module` runs code the decode step would skip: any hook but a
    DeepSpeed engine's own (`_ENGINE_HOOKS`), or accelerate's."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return any(not _engine_hook(h) for h in hooks) or hasattr(module, "_hf_hook")


def _partitioned(model: torch.nn.Module) -> bool:
    """Whether ZeRO-3 holds the model's weights in shards (its parameters carry `ds_id`)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def decode_step_for(model: PreTrainedModel, cache: DynamicCache) -> DecodeStep | None:
    """A `DecodeStep` for `model` when it reproduces the model's forward exactly, else None.

    That needs a Qwen2 or Llama model decoding on our matmul attention (`sampling.attention`)
    whose every layer attends to the whole cache (a growing one), on SiLU, without Llama's
    tensor-parallel projection split, with its weights whole, and with no hooks on its
    modules but a DeepSpeed engine's own: what other hooks do (accelerate's offloading, ZeRO-3
    gathering partitioned weights, a user's probe) happens only in the model's forward. So a
    policy trained under ZeRO-1/2 samples through the step from the engine's module itself.
    """
    if _partitioned(model) or any(_hooked(module) for module in model.modules()):
        return None
    config = model.config
    if config.model_type not in SUPPORTED or config.hidden_act != "silu":
        return None
    if config._attn_implementation != MATMUL_DECODE:
        return None
    if getattr(config, "pretraining_tp", 1) > 1:
        return None
    if not all(isinstance(layer, GrowingLayer) for layer in cache.layers):
        return None
    if getattr(model.model.rotary_emb, "rope_type", "default") != "default":
        return None  # dynamic variants recompute their frequencies as positions grow
    return DecodeStep(model)

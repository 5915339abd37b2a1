"""Our own decode loop: KV cache in place, finished rows dropped from the batch, seeded sampling.

`transformers.generate` keeps every row of a batch until the longest one ends, runs a chain of
logits processors and stopping criteria each step, rebuilds the attention mask and grows its
cache by concatenation. On a small model on CPU that overhead is most of the time. This loop does
one forward per step on the rows still running, with the 4D mask passed in, the cache written in
place (sampling/kv_cache.py) and one-query attention in two matmuls (sampling/attention.py); it
samples with plain tensor ops and drops a row from the cache, mask and positions at the step it
stops. Randomness comes only from the row keys passed in (sampling/streams.py): a row's draws
depend on its key and the step, not on the rows decoded beside it.
Tensors live on the model's device, so the same loop samples on CPU and on a GPU.

What a logprob means (the same as `compute_transition_scores(..., normalize_logits=True)` on the
scores `generate` returns): the log-probability of the sampled token under the distribution it
was drawn from, i.e. `log_softmax` of the processed logits, with the logits divided by the
temperature and the tokens outside the nucleus set to -inf, so the nucleus is renormalised. At
temperature 1 and top_p 1 that is the model's own log-softmax. Greedy decoding (temperature 0)
applies no processing, so its logprobs are the model's log-softmax at temperature 1.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import DynamicCache, PreTrainedModel

from sampling.attention import NAME as MATMUL_DECODE
from sampling.attention import matmul_decoding
from sampling.decode_step import DecodeStep, decode_step_for
from sampling.kv_cache import GrowingLayer, growing_cache
from sampling.static_decode import StaticDecoder, StaticState, static_decode
from sampling.streams import uniforms

# Most likely tokens searched first for the top-p nucleus (see `nucleus`).
NUCLEUS_CANDIDATES = 32
# Finished rows stay in the batch, their outputs ignored, until they are more than this share of
# it; then one copy drops them all from the cache (see `decode`).
COMPACT_SHARE = 0.1


@dataclass(frozen=True)
class Decoded:
    """One row's new tokens (the stop token included when it ended on one)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row (A,) drawn in proportion to non-negative `weights` (A, K), given one
    uniform in [0, 1) per row `u` (A, 1).

    Inverse-CDF sampling: the uniform located in the cumulative sum. Exact like
    `torch.multinomial`, and on CPU some thirty times cheaper for a single sample per row. The
    sum is taken in float64, so a uniform just below 1 still lands on a token of positive weight.
    """
    cdf = weights.double().cumsum(dim=-1)  # (A, K)
    scaled = u.double() * cdf[:, -1:]
    return torch.searchsorted(cdf, scaled, right=True).clamp_(max=weights.shape[1] - 1).squeeze(1)


def nucleus(logits: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-p nucleus of logits (A, V): candidate logits (A, K) and token ids (A, K), most
    likely first, and which of them are kept (A, K).

    transformers' TopPLogitsWarper rule: a token is kept while the probability mass of the tokens
    more likely than it is below top_p, so the most likely token always is. Only the
    NUCLEUS_CANDIDATES most likely tokens are searched, as a full sort of the vocabulary costs
    more than the model's step on CPU; when some row's nucleus is wider than that, every row
    takes the whole vocabulary instead.
    """
    log_norm = logits.logsumexp(dim=-1, keepdim=True)  # (A, 1)
    for k in (min(NUCLEUS_CANDIDATES, logits.shape[-1]), logits.shape[-1]):
        cand_logits, cand = logits.topk(k, dim=-1)  # (A, k)
        probs = (cand_logits - log_norm).exp()
        if k == logits.shape[-1] or bool((probs.sum(dim=-1) >= top_p).all()):
            break
    keep = probs.cumsum(dim=-1) - probs < top_p
    return cand_logits, cand, keep


def nucleus_sample(
    logits: torch.Tensor, top_p: float, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (A,) and logprobs (A,) drawn from the nucleus of tempered logits (A, V); the
    logprobs are renormalised over the nucleus, the distribution the tokens are drawn from."""
    cand_logits, cand, keep = nucleus(logits, top_p)
    kept_logits = cand_logits.masked_fill(~keep, float("-inf"))
    kept_logp = kept_logits - kept_logits.logsumexp(dim=-1, keepdim=True)  # (A, K)
    pick = draw(kept_logp.exp(), u)[:, None]  # (A, 1)
    return cand.gather(1, pick).squeeze(1), kept_logp.gather(1, pick).squeeze(1)


def choose_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens (A,) and their logprobs (A,) from last-position logits (A, V), with one
    uniform per row `u` (A, 1) (unused when greedy)."""
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
        return tokens, logp.gather(1, tokens[:, None]).squeeze(1)
    if temperature != 1:
        logits = logits / temperature
    if top_p < 1:
        return nucleus_sample(logits, top_p, u)
    logp = torch.log_softmax(logits, dim=-1)  # (A, V)
    tokens = draw(logp.exp(), u)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


@dataclass
class _Running:
    """The rows still decoding: which output row each is, and what their next forward needs."""

    rows: torch.Tensor  # (A,) index into the output buffers
    mask: torch.Tensor  # (A, W + max_new) 0/1 attention mask; columns past the cache unused
    positions: torch.Tensor  # (A,) position id of the token fed next

    def keep(self, index: torch.Tensor) -> None:
        self.rows = self.rows[index]
        self.mask = self.mask[index]
        self.positions = self.positions[index]


@dataclass
class _Outputs:
    """Per-row results, written column by column as the rows decode."""

    tokens: torch.Tensor  # (B, T)
    logprobs: torch.Tensor  # (B, T)
    lengths: torch.Tensor  # (B,) tokens kept
    stopped: torch.Tensor  # (B,) ended on a stop token

    @classmethod
    def empty(cls, rows: int, max_new_tokens: int, pad_id: int, device: torch.device) -> _Outputs:
        return cls(
            torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device),
            torch.zeros((rows, max_new_tokens), device=device),
            torch.full((rows,), max_new_tokens, dtype=torch.long, device=device),
            torch.zeros(rows, dtype=torch.bool, device=device),
        )

    def record(
        self,
        rows: torch.Tensor,
        step: int,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        finished: torch.Tensor,
    ) -> None:
        """Column `step` of `rows`; the rows that sampled a stop token end with it."""
        self.tokens[rows, step] = tokens
        self.logprobs[rows, step] = logprobs
        self.stopped[rows[finished]] = True
        self.lengths[rows[finished]] = step + 1

    def decoded(self) -> list[Decoded]:
        tokens, logprobs = self.tokens.cpu(), self.logprobs.cpu()  # one copy off the GPU
        stopped = self.stopped.tolist()
        return [
            Decoded(
                tokens[r, :n].tolist(), logprobs[r, :n].tolist(), "stop" if stopped[r] else "length"
            )
            for r, n in enumerate(self.lengths.tolist())
        ]


# Data-parallel ranks decoding a sharded (ZeRO-3) model in step: called after every step with
# whether this rank still has rows decoding, it returns whether any rank has (a collective).
LockStep = Callable[[bool], bool]

MaskKind = Literal["bool", "additive", "2d"]


def mask_kind(model: PreTrainedModel, cache: DynamicCache) -> MaskKind:
    """How a decode step hands its attention mask to the model.

    Given a 2D mask, transformers rebuilds the 4D one on every forward with an advanced-indexing
    op that cost as much as the rest of a small model's step on CPU. For SDPA, eager and our
    matmul attention we pass the 4D mask ourselves (one query row: (A, 1, 1, L)), additive where
    the attention adds it; that is only valid when every layer attends to the whole cache, so
    sliding-window models keep the 2D path.
    """
    if not all(isinstance(layer, GrowingLayer) for layer in cache.layers):
        return "2d"
    impl = model.config._attn_implementation
    return {"sdpa": "bool", MATMUL_DECODE: "additive", "eager": "additive"}.get(impl, "2d")


def step_mask(mask: torch.Tensor, kind: MaskKind, dtype: torch.dtype) -> torch.Tensor:
    """The attention mask for one decode step from the 2D 0/1 mask (A, L)."""
    if kind == "2d":
        return mask
    attend = mask.bool()[:, None, None, :]  # (A, 1, 1, L)
    if kind == "bool":
        return attend
    return torch.where(attend, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)


def cache_argument(model: torch.nn.Module) -> str:
    """The name by which the model's forward takes its KV cache: `cache` from transformers 5.2x
    on (where `past_key_values` is deprecated, to be removed in 5.40, after which that name
    would fall into the forward's `**kwargs`), `past_key_values` before."""
    try:
        names = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in names else "past_key_values"


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (U, W)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (U, W)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def _prefill(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    rows: Sequence[int],
    max_new_tokens: int,
    pad_id: int,
) -> tuple[DynamicCache, torch.Tensor, _Running]:
    """One forward over the distinct prompts, then their cache rows copied out to every row.

    Returns the cache, the last-position logits (B, V) and the rows' running state.
    """
    ids, prompt_mask = (t.to(model.device) for t in _left_pad(prompts, pad_id))  # (U, W)
    width = ids.shape[1]
    positions = (prompt_mask.cumsum(dim=1) - 1).clamp(min=0)  # (U, W)
    cache = growing_cache(model.config)
    logits = model(
        input_ids=ids,
        attention_mask=prompt_mask,
        position_ids=positions,
        **{cache_argument(model): cache},
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]  # (U, V)
    source = torch.tensor(list(rows), dtype=torch.long, device=ids.device)  # (B,)
    cache.batch_select_indices(source)
    mask = torch.zeros((len(rows), width + max_new_tokens), dtype=torch.long, device=ids.device)
    mask[:, :width] = prompt_mask[source]
    running = _Running(torch.arange(len(rows), device=ids.device), mask, positions[source, -1] + 1)
    return cache, logits[source], running


def decode(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    rows: Sequence[int],
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    keys: torch.Tensor,
    plain_step: bool = True,
    lockstep: LockStep | None = None,
    static: bool | None = None,
    compile_step: bool = False,
) -> list[Decoded]:
    """Continue prompt `rows[i]` once for each i; the results are in the order of `rows`.

    With `plain_step`, a Qwen2 or Llama model's decode steps run as plain tensor ops on its
    weights (sampling/decode_step.py), the same logits with less per-call overhead; without it,
    or for another model, through the model's own forward.

    With `lockstep` (ranks sharing a ZeRO-3 model, whose every forward is a collective), a rank
    whose rows are all done keeps stepping one of them, its outputs ignored, until every rank's
    are; gradients are off but not in inference mode, which ZeRO-3's gathered weights refuse.

    `keys` (B,) are the rows' random-stream keys (sampling/streams.py `row_keys`). A row that
    samples a stop token is done: it keeps its place, and the token it is fed, until the done
    rows are more than COMPACT_SHARE of the batch, when they all leave the cache, mask and
    positions in one copy. Dropping each row at its own step copied the whole cache nearly every
    step; on the evaluation's setting this decodes 1.09x faster (6.50 s against 5.94 s for 256
    prompts x 4 from the stage-3 model, median of 3, the same tokens).

    With `static` (by default on a GPU, where the plain-ops step is used and no `lockstep`),
    the steps run over a static cache as CUDA graphs instead (sampling/static_decode.py): no
    row leaves the batch, nothing is read back to the host each token; with `compile_step`
    the step is compiled by Inductor, its elementwise ops fused (`compiled_step`).
    """
    grad_off = torch.no_grad() if lockstep is not None else torch.inference_mode()
    with grad_off, matmul_decoding(model):
        cache, logits, run = _prefill(model, prompts, rows, max_new_tokens, pad_id)
        kind = mask_kind(model, cache)
        lean = decode_step_for(model, cache) if plain_step else None
        if static is None:
            static = model.device.type == "cuda"
        if lean is not None and lockstep is None and static:
            return _decode_static(model, lean, cache, logits, run, keys, max_new_tokens,
                                  (temperature, top_p), stop_ids, pad_id, compile_step)  # fmt: skip
        cache_name = cache_argument(model)  # once, not per step
        width = run.mask.shape[1] - max_new_tokens
        out = _Outputs.empty(len(rows), max_new_tokens, pad_id, model.device)
        stop = torch.tensor(list(stop_ids), dtype=torch.long, device=model.device)
        keys = keys.to(model.device)
        done = torch.zeros(len(rows), dtype=torch.bool, device=model.device)  # (A,) ended
        for step in range(max_new_tokens):
            u = uniforms(keys[run.rows], step)  # (A, 1)
            tokens, logprobs = choose_tokens(logits, temperature, top_p, u)  # (A,), (A,)
            live = (~done).nonzero().squeeze(1)
            finished = torch.isin(tokens[live], stop)  # (live,)
            out.record(run.rows[live], step, tokens[live], logprobs[live], finished)
            done[live[finished]] = True
            ended = int(done.sum())
            mine_done = ended == len(done)
            if step + 1 == max_new_tokens or (
                mine_done if lockstep is None else not lockstep(not mine_done)
            ):
                break
            if ended > len(done) * COMPACT_SHARE and not mine_done:
                going = (~done).nonzero().squeeze(1)
                cache.batch_select_indices(going)
                run.keep(going)
                tokens, done = tokens[going], done[going]
            run.mask[:, width + step] = 1
            mask = step_mask(run.mask[:, : width + step + 1], kind, model.dtype)
            if lean is not None:
                logits = lean(tokens, run.positions, mask, cache)  # (A, V)
            else:
                logits = model(
                    input_ids=tokens[:, None],
                    attention_mask=mask,
                    position_ids=run.positions[:, None],
                    **{cache_name: cache},
                    use_cache=True,
                ).logits[:, -1]  # (A, V)
            run.positions += 1
        return out.decoded()


def _decode_static(
    model: PreTrainedModel,
    lean: DecodeStep,
    prefilled: DynamicCache,
    logits: torch.Tensor,
    run: _Running,
    keys: torch.Tensor,
    max_new_tokens: int,
    sampling: tuple[float, float],
    stop_ids: Sequence[int],
    pad_id: int,
    compile_step: bool = False,
) -> list[Decoded]:
    """`decode`'s steps over a static cache (sampling/static_decode.py), CUDA graphs on a GPU."""
    width = run.mask.shape[1] - max_new_tokens
    device = model.device
    out = _Outputs.empty(len(run.rows), max_new_tokens, pad_id, device)
    state = StaticState.from_prefill(
        prefilled, run.mask[:, :width], run.positions, width + max_new_tokens, keys.to(device), out
    )
    temperature, top_p = sampling

    def choose(step_logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return choose_tokens(step_logits, temperature, top_p, u)

    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=device)
    on_gpu = device.type == "cuda"
    fused = temperature == 0 or top_p >= 1  # the nucleus's width is read back to the host
    decoder = StaticDecoder(lean, state, choose, stop, pad_id, graphs=on_gpu, fused=fused,
                            compiled=compile_step)  # fmt: skip
    static_decode(decoder, logits, max_new_tokens)
    return out.decoded()

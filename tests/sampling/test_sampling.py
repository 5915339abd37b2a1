"""The decode loop against transformers' generate and a plain forward pass, on a tiny model."""

import copy
import importlib.util
import warnings
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache
from transformers.generation.logits_process import TopPLogitsWarper
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import sampling.decode as decode_module
from rl.rollouts import build_batch, completion_logprobs
from sampling.attention import matmul_decode_attention
from sampling.decode import choose_tokens, decode, draw, nucleus
from sampling.factory import make_sampler
from sampling.hf import HFSampler
from sampling.interface import SamplingParams
from sampling.kv_cache import growing_cache
from sampling.reference import GenerateSampler
from sampling.streams import row_keys, uniforms
from sampling.vllm import completion_from_vllm, completions_from_request
from tests.tiny_models import tiny_model

PROMPTS = ["What is 1 + 2?", "What is 3 + 4? The answer", "7", "What is 9 + 9? The answer is 1"]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tokenizer):
    model = tiny_model(tokenizer, seed=1).eval()
    # A fresh init has nearly flat logits (std 0.08): greedy decoding repeats one token and ties
    # are close. Scaled weights give varied continuations with clear margins.
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(20)
        for name, p in model.named_parameters():
            if "layers" in name and p.dim() == 2:
                p.mul_(50)
    model.set_attn_implementation(request.param)
    return model


def encode(tokenizer, prompts):
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]


def run_decode(model, tokenizer, prompts, rows, stop_ids, temperature=0.0, top_p=1.0, seed=0, m=10):
    return decode(
        model,
        encode(tokenizer, prompts),
        rows,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=m,
        stop_ids=stop_ids,
        pad_id=tokenizer.pad_token_id,
        keys=row_keys(seed, torch.tensor(list(rows)), torch.arange(len(rows))),
    )


def hf_greedy(model, tokenizer, prompts, eos_id, m=10):
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc, do_sample=False, max_new_tokens=m, eos_token_id=eos_id, pad_token_id=0
    )
    rows = out[:, enc["input_ids"].shape[1] :].tolist()
    return [r[: r.index(eos_id) + 1] if eos_id in r else r for r in rows]


def test_greedy_matches_generate_token_for_token(model, tokenizer):
    never = tokenizer.eos_token_id
    ours = run_decode(model, tokenizer, PROMPTS, range(len(PROMPTS)), [never], m=12)
    assert [d.token_ids for d in ours] == hf_greedy(model, tokenizer, PROMPTS, never, m=12)
    assert len({tuple(d.token_ids) for d in ours}) > 1  # the prompts lead different ways


def test_rows_that_stop_early_are_dropped_and_match_generate(model, tokenizer):
    free = run_decode(model, tokenizer, PROMPTS, range(len(PROMPTS)), [tokenizer.eos_token_id])
    stop = free[0].token_ids[2]  # row 0 ends at its third token; others maybe sooner or later
    widths: list[int] = []  # a hooked model decodes through its forward: the hook sees each pass
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        ours = run_decode(model, tokenizer, PROMPTS, range(len(PROMPTS)), [stop])
    finally:
        hook.remove()
    assert [d.token_ids for d in ours] == hf_greedy(model, tokenizer, PROMPTS, stop)
    assert ours[0].token_ids[-1] == stop and len(ours[0].token_ids) <= 3
    assert ours[0].finish_reason == "stop"
    assert widths == sorted(widths, reverse=True) and widths[-1] < len(PROMPTS)
    for d in ours:
        assert d.finish_reason == ("stop" if stop in d.token_ids else "length")
        assert len(d.token_ids) == len(d.logprobs)
        assert stop not in d.token_ids[:-1]


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_when_done_rows_leave_the_batch_changes_no_row(model, tokenizer, monkeypatch, share):
    """Done rows stay in the batch until they are more than COMPACT_SHARE of it (never at 1.0):
    every row's tokens and logprobs are those of dropping each row at its stop (share 0)."""
    rows = [0, 0, 1, 1, 2, 2, 3, 3]
    free = run_decode(model, tokenizer, PROMPTS, rows, [tokenizer.eos_token_id], 1.0, seed=3)
    stop = free[0].token_ids[1]  # rows end at different steps, some not at all
    monkeypatch.setattr(decode_module, "COMPACT_SHARE", 0.0)
    at_once = run_decode(model, tokenizer, PROMPTS, rows, [stop], 1.0, seed=3)
    monkeypatch.setattr(decode_module, "COMPACT_SHARE", share)
    ours = run_decode(model, tokenizer, PROMPTS, rows, [stop], 1.0, seed=3)
    assert len({len(d.token_ids) for d in at_once}) > 1
    assert [d.token_ids for d in ours] == [d.token_ids for d in at_once]
    assert [d.finish_reason for d in ours] == [d.finish_reason for d in at_once]
    for a, b in zip(ours, at_once, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_stop_on_the_last_allowed_token_is_a_stop(model, tokenizer):
    free = run_decode(model, tokenizer, PROMPTS, range(len(PROMPTS)), [tokenizer.eos_token_id])
    # a prompt whose continuation brings a token it has not produced before, at position k
    p, k = next(
        (p, k)
        for p, d in enumerate(free)
        for k in range(1, len(d.token_ids))
        if d.token_ids[k] not in d.token_ids[:k]
    )
    ids = free[p].token_ids
    (ours,) = run_decode(model, tokenizer, [PROMPTS[p]], [0], [ids[k]], m=k + 1)
    assert ours.token_ids == ids[: k + 1] and ours.finish_reason == "stop"
    (cut,) = run_decode(model, tokenizer, [PROMPTS[p]], [0], [tokenizer.eos_token_id], m=k)
    assert cut.token_ids == ids[:k] and cut.finish_reason == "length"


def test_each_distinct_prompt_is_prefilled_once(model, tokenizer):
    widths: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        out = run_decode(model, tokenizer, PROMPTS[:2], [1, 0, 1, 0], [tokenizer.eos_token_id])
    finally:
        hook.remove()
    assert widths[:2] == [2, 4]
    alone = run_decode(model, tokenizer, PROMPTS[:2], [0, 1], [tokenizer.eos_token_id])
    assert [d.token_ids for d in out] == [alone[1].token_ids, alone[0].token_ids] * 2


@pytest.mark.parametrize("eos", ["im_end", "produced"])
def test_greedy_matches_the_generate_sampler_with_transition_scores(model, tokenizer, eos):
    """Same tokens, text, finish reasons and logprobs as `generate` with
    compute_transition_scores(normalize_logits=True); "produced" makes a token the model emits
    the end-of-sequence token, so some rows stop."""
    if eos == "produced":
        tokenizer = copy.deepcopy(tokenizer)
        (first,) = run_decode(model, tokenizer, PROMPTS[:1], [0], [tokenizer.eos_token_id])
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(first.token_ids[3])
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    ref = GenerateSampler(model, tokenizer, batch_size=8).generate(PROMPTS, 1, params)
    ours = HFSampler(model, tokenizer, batch_size=8, show_progress=False).generate(
        PROMPTS, 1, params
    )
    for (r,), (o,) in zip(ref, ours, strict=True):
        assert o.token_ids == r.token_ids and o.text == r.text
        assert o.finish_reason == r.finish_reason
        torch.testing.assert_close(torch.tensor(o.logprobs), torch.tensor(r.logprobs))
    if eos == "produced":
        assert ours[0][0].finish_reason == "stop"


def forward_logprobs(model, tokenizer, prompts, groups, temperature):
    """Log-softmax of the logits at `temperature`, recomputed by one forward over prompt and
    completion (what the GRPO update uses)."""
    flat = [c for g in groups for c in g]
    batch = build_batch(
        tokenizer,
        [p for p, g in zip(prompts, groups, strict=True) for _ in g],
        [c.token_ids for c in flat],
        tokenizer.pad_token_id,
    )
    with torch.no_grad():
        logp, _ = completion_logprobs(model, batch, temperature)
    return [logp[i, : len(c.token_ids)] for i, c in enumerate(flat)]


def test_sampled_logprobs_at_temperature_one_are_the_model_log_softmax(model, tokenizer):
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=10, seed=3)
    sampler = HFSampler(model, tokenizer, batch_size=5, show_progress=False)
    groups = sampler.generate(PROMPTS, 3, params)
    ref = forward_logprobs(model, tokenizer, PROMPTS, groups, 1.0)
    for c, r in zip([c for g in groups for c in g], ref, strict=True):
        torch.testing.assert_close(torch.tensor(c.logprobs), r, atol=1e-4, rtol=1e-4)


def nucleus_reference(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p the obvious way: keep tokens, most probable first, while the mass before them is
    below top_p."""
    out = torch.full_like(logits, float("-inf"))
    for row in range(logits.shape[0]):
        probs = logits[row].softmax(-1)
        mass = 0.0
        for token in torch.argsort(probs, descending=True).tolist():
            if mass >= top_p:
                break
            out[row, token] = logits[row, token]
            mass += float(probs[token])
    return out


def test_nucleus_matches_transformers_and_the_obvious_rule():
    gen = torch.Generator().manual_seed(0)
    flat = torch.randn(3, 300, generator=gen)  # wide nuclei: the whole-vocabulary fallback
    peaked = torch.randn(3, 300, generator=gen) * 6  # narrow nuclei: within the candidates
    for logits in (flat, peaked, torch.cat([flat, peaked])):
        for top_p in (0.3, 0.9, 0.95):
            cand_logits, cand, keep = nucleus(logits, top_p)
            ours = torch.full_like(logits, float("-inf"))
            ours.scatter_(1, cand, cand_logits.masked_fill(~keep, float("-inf")))
            assert torch.equal(ours, TopPLogitsWarper(top_p)(None, logits.clone()))
            assert torch.equal(ours.isinf(), nucleus_reference(logits, top_p).isinf())


def test_tempered_nucleus_logprobs_are_renormalised_over_the_nucleus(model, tokenizer):
    """At T < 1 with top-p, a logprob is log-softmax of logits / T over the kept tokens only:
    the sampling distribution, as compute_transition_scores(normalize_logits=True) gives it."""
    temperature, top_p = 0.7, 0.8
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=8, seed=1)
    groups = HFSampler(model, tokenizer, batch_size=16, show_progress=False).generate(
        PROMPTS, 2, params
    )
    flat = [c for g in groups for c in g]
    tokenizer.padding_side = "left"
    for prompt, c in zip([p for p in PROMPTS for _ in range(2)], flat, strict=True):
        ids = encode(tokenizer, [prompt])[0] + c.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]  # (P + C, V)
        steps = logits[len(ids) - len(c.token_ids) - 1 : -1] / temperature  # (C, V)
        kept = nucleus_reference(steps, top_p)
        want = torch.log_softmax(kept, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=1e-4)
        assert (
            want
            >= torch.log_softmax(steps, -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
            - 1e-6
        ).all()


def test_choose_tokens_greedy_and_sampled():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    u = torch.tensor([[0.3], [0.9]])
    tokens, logp = choose_tokens(logits, 0.0, 1.0, u)
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).max(-1).values)
    tokens, logp = choose_tokens(logits, 1.0, 0.01, u)  # nucleus of one token: certain
    assert tokens.tolist() == [1, 0] and torch.allclose(logp, torch.zeros(2))


def test_sampling_is_seeded_and_results_come_in_prompt_order(model, tokenizer):
    sampler = HFSampler(model, tokenizer, batch_size=3, show_progress=False)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=8, seed=7)
    first = sampler.generate(PROMPTS, 2, params)
    again = sampler.generate(PROMPTS, 2, params)
    other = sampler.generate(PROMPTS, 2, SamplingParams(1.0, 0.95, 8, seed=8))
    assert first == again
    assert first != other
    assert [len(g) for g in first] == [2] * len(PROMPTS)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    together = sampler.generate(PROMPTS, 2, greedy)
    alone = [sampler.generate([p], 1, greedy)[0][0] for p in PROMPTS]
    assert [g[0].token_ids for g in together] == [a.token_ids for a in alone]
    for first_sample, second_sample in together:  # greedy: both samples of a prompt agree
        assert first_sample.token_ids == second_sample.token_ids
        assert first_sample.logprobs == pytest.approx(second_sample.logprobs, abs=1e-5)


def test_a_prompts_samples_do_not_depend_on_its_batch(model, tokenizer):
    """Per-prompt streams: the batch size, the other prompts and their order change nothing, and
    a share of the prompts sampled with `prompt_offset` draws what sampling them all draws."""
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=8, seed=5)

    def tokens(groups):
        return [[c.token_ids for c in g] for g in groups]

    def sample(batch_size, prompts, sampling):
        sampler = HFSampler(model, tokenizer, batch_size, show_progress=False)
        return tokens(sampler.generate(prompts, 3, sampling))

    whole = sample(64, PROMPTS, params)
    small = sample(2, PROMPTS, params)
    assert small == whole
    for start in (1, 2, 3):
        shifted = SamplingParams(1.0, 0.95, 8, seed=5, prompt_offset=start)
        assert sample(64, PROMPTS[start:], shifted) == whole[start:]
    unshifted = sample(64, PROMPTS[2:], params)
    assert unshifted != whole[2:]  # without the offset the share takes the first prompts' streams


def test_sampler_leaves_the_global_rng_alone(model, tokenizer):
    state = torch.get_rng_state()
    HFSampler(model, tokenizer, show_progress=False).generate(
        PROMPTS[:1], 2, SamplingParams(temperature=1.0, max_new_tokens=4)
    )
    assert torch.equal(state, torch.get_rng_state())


def test_growing_cache_holds_what_a_dynamic_cache_holds(model):
    config = model.config
    ours, ref = growing_cache(config), DynamicCache(config=config)
    gen = torch.Generator().manual_seed(0)
    shape = (5, config.num_key_value_heads, 3, config.hidden_size // config.num_attention_heads)
    for step in range(70):  # past one growth of the buffer
        k, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
        if step:
            k, v = k[:, :, :1], v[:, :, :1]
        for cache in (ours, ref):
            cache.update(k, v, 0)
        if step == 30:
            keep = torch.tensor([4, 1, 2])
            ours.batch_select_indices(keep)
            ref.batch_select_indices(keep)
            shape = (3, *shape[1:])
    assert ours.get_seq_length() == ref.get_seq_length() == 72
    assert torch.equal(ours.layers[0].keys, ref.layers[0].keys)
    assert torch.equal(ours.layers[0].values, ref.layers[0].values)


# ---- vLLM mapping and the backend choice --------------------------------------------------------


def vllm_output(ids, lps, reason, index=0, text=" 42 "):
    return SimpleNamespace(
        index=index,
        text=text,
        token_ids=ids,
        logprobs=[{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(ids, lps, strict=True)],
        finish_reason=reason,
    )


def test_vllm_output_maps_to_completion():
    c = completion_from_vllm(vllm_output([5, 6, 3], [-0.1, -0.2, -0.3], "stop"))
    assert (c.text, c.token_ids, c.logprobs, c.finish_reason) == (
        "42",
        [5, 6, 3],
        [-0.1, -0.2, -0.3],
        "stop",
    )
    assert completion_from_vllm(vllm_output([5], [-1.0], "length")).finish_reason == "length"
    request = SimpleNamespace(
        outputs=[vllm_output([7], [-0.5], "length", index=1), vllm_output([8], [-0.7], "stop")]
    )
    assert [c.token_ids for c in completions_from_request(request)] == [[8], [7]]
    with pytest.raises(ValueError, match="abort"):
        completion_from_vllm(vllm_output([5], [-1.0], "abort"))


def test_factory_builds_hf_and_names_the_gpu_extra_for_vllm(model, tokenizer):
    assert isinstance(make_sampler("hf", model, tokenizer, batch_size=4), HFSampler)
    if importlib.util.find_spec("vllm") is None:  # the CPU machines: a clear error, not a crash
        with pytest.raises(ImportError, match="gpu"):
            make_sampler("vllm", model_path="/nonexistent")
    with pytest.raises(ValueError):
        make_sampler("tpu", model, tokenizer)  # type: ignore[arg-type]


def test_draw_follows_the_weights():
    weights = torch.tensor([[1.0, 2.0, 0.0, 5.0]]).expand(40_000, 4)
    picks = draw(weights, uniforms(row_keys(0, torch.arange(40_000), torch.zeros(40_000)), 0))
    freq = torch.bincount(picks, minlength=4).float() / len(picks)
    assert freq[2] == 0
    torch.testing.assert_close(freq, torch.tensor([1, 2, 0, 5]) / 8, atol=0.01, rtol=0)
    # a uniform just below 1 takes the last token of positive weight, never a zero-weight tail
    tail = torch.tensor([[1.0, 3.0, 0.0, 0.0]])
    assert draw(tail, torch.tensor([[1 - 2**-32]], dtype=torch.float64)).item() == 1
    assert draw(tail, torch.tensor([[0.0]])).item() == 0


def test_keyed_uniforms_are_uniform_and_independent_across_rows_and_steps():
    keys = row_keys(3, torch.arange(2_000).repeat_interleave(5), torch.arange(5).repeat(2_000))
    assert len(set(keys.tolist())) == len(keys)
    u = torch.cat([uniforms(keys, step) for step in range(10)], dim=1)  # (10000, 10)
    assert float(u.min()) >= 0 and float(u.max()) < 1
    counts = torch.histc(u.flatten().float(), bins=20, min=0, max=1)
    expected = u.numel() / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 43.8  # the 0.999 quantile of chi-square with 19 degrees of freedom
    centred = u - u.mean()
    corr = (centred[:, :-1] * centred[:, 1:]).mean() / centred.var()
    assert abs(float(corr)) < 0.02  # successive steps of a row
    assert abs(float(torch.corrcoef(u[:, :2].T.float())[0, 1])) < 0.03
    assert torch.equal(uniforms(keys[:7], 4), uniforms(keys, 4)[:7])  # a row is its own stream


def test_matmul_decode_attention_equals_sdpa_for_one_query():
    gen = torch.Generator().manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    q = torch.randn(3, 4, 1, 8, generator=gen)  # (B, H, 1, D)
    k, v = torch.randn(2, 3, 2, 7, 8, generator=gen)  # (B, KV, L, D)
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., :3] = False  # left padding
    additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    for m in (mask, additive):
        got, _ = matmul_decode_attention(module, q, k, v, m, scaling=0.3)
        torch.testing.assert_close(got, want)


def test_decoding_restores_the_attention_implementation(model, tokenizer):
    before = model.config._attn_implementation
    run_decode(model, tokenizer, PROMPTS[:1], [0], [tokenizer.eos_token_id], m=2)
    assert model.config._attn_implementation == before


def test_sampler_benchmark_finds_the_state_folders_model_and_problems(tmp_path):
    from benchmarks.sampler import find_heldout, find_model

    model = tmp_path / "runs" / "cold_start_sft" / "0123" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    heldout = tmp_path / "runs" / "problems" / "4567" / "heldout.jsonl"
    heldout.parent.mkdir(parents=True)
    heldout.write_text("")
    assert find_model(tmp_path) == model
    assert find_heldout(model) == heldout


def test_the_cache_goes_by_the_name_the_installed_forward_takes(model, tokenizer):
    class Renamed(torch.nn.Module):  # transformers 5.2x on
        def forward(self, input_ids=None, cache=None, **kwargs):
            return input_ids

    class Before(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, **kwargs):
            return input_ids

    assert decode_module.cache_argument(Renamed()) == "cache"
    assert decode_module.cache_argument(Before()) == "past_key_values"
    # through the model's forward (a hook turns the plain decode step off), with no warning
    # that a name is deprecated
    hook = model.register_forward_pre_hook(lambda *_: None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            ours = run_decode(model, tokenizer, PROMPTS, range(len(PROMPTS)), [-1], m=4)
    finally:
        hook.remove()
    assert [d.token_ids for d in ours] == hf_greedy(model, tokenizer, PROMPTS, -1, m=4)


def test_the_sampler_stops_on_every_eos_id_of_the_generation_config():
    """Llama-3.2-Instruct's generation_config.json lists <|end_of_text|>, which its tokenizer
    names neither EOS nor end-of-turn: a model that emits it ends there under its own generate
    (and vLLM), and so under the sampler."""
    from tests.real_checkpoints import decoder, llama_style_tokenizer

    tokenizer = llama_style_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token  # as models.loading.load_tokenizer sets it
    model = decoder(tokenizer, "llama", 16, 1).eval()
    end_of_text, eot = tokenizer.convert_tokens_to_ids(["<|end_of_text|>", "<|eot_id|>"])
    model.generation_config.eos_token_id = [end_of_text, eot]
    bias = torch.zeros(model.config.vocab_size)
    bias[end_of_text] = 1e4  # every step's likeliest token
    model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=8, pad_token_id=eot)  # fmt: skip
    reference = out[0, ids.shape[1] :].tolist()
    sampler = HFSampler(model, tokenizer, show_progress=False)
    (completion,) = sampler.generate([prompt], 1, SamplingParams(0.0, 1.0, 8, 0))[0]
    assert completion.token_ids == reference == [end_of_text]
    assert completion.finish_reason == "stop"

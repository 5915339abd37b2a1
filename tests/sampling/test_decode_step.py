"""The plain-ops decode step against the model's own forward: the same logits, bit for bit."""

import pytest
import torch
from transformers import DynamicCache

from sampling.attention import matmul_decoding
from sampling.decode import _prefill, cache_argument, decode, mask_kind, step_mask
from sampling.decode_step import decode_step_for
from sampling.kv_cache import growing_cache
from sampling.streams import row_keys
from tests.tiny_models import gqa_model, make_tokenizer


def _model(architecture: str, tokenizer) -> torch.nn.Module:
    model = gqa_model(tokenizer, architecture)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norms and biases away from their ones and zeros, so each one counts
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


PROMPTS = ["What is 3 + 4?", "What is 12 + 7? Think.", "What"]


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
@torch.inference_mode()
def test_logits_equal_the_models_forward_bit_for_bit(architecture, tokenizer):
    """Step by step from the same prefill, rows dropped halfway as the decode loop drops them."""
    model = _model(architecture, tokenizer)
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    rows = [0, 1, 2, 0, 1, 2]
    with matmul_decoding(model):
        theirs, _, run = _prefill(model, prompts, rows, 30, tokenizer.pad_token_id)
        ours, _, _ = _prefill(model, prompts, rows, 30, tokenizer.pad_token_id)
        step = decode_step_for(model, ours)
        assert step is not None
        kind = mask_kind(model, theirs)
        width = run.mask.shape[1] - 30
        tokens = torch.randint(3, len(tokenizer), (len(rows),), generator=torch.Generator())
        for i in range(25):
            if i == 10:  # three rows finished: both caches drop them
                keep = torch.tensor([0, 2, 5])
                theirs.batch_select_indices(keep)
                ours.batch_select_indices(keep)
                run.keep(keep)
                tokens = tokens[keep]
            run.mask[:, width + i] = 1
            mask = step_mask(run.mask[:, : width + i + 1], kind, model.dtype)
            expected = model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=run.positions[:, None],
                **{cache_argument(model): theirs},
                use_cache=True,
            ).logits[:, -1]
            got = step(tokens, run.positions, mask, ours)
            assert torch.equal(got, expected), (i, (got - expected).abs().max())
            tokens = expected.argmax(dim=-1)
            run.positions += 1


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_the_decode_loop_samples_the_same_tokens_with_and_without_it(architecture, tokenizer):
    model = _model(architecture, tokenizer)
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    rows = [0, 0, 1, 1, 2, 2]
    args = (model, prompts, rows, 1.0, 0.95, 20, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    keys = row_keys(7, torch.tensor(rows), torch.tensor([0, 1, 0, 1, 0, 1]))
    ours = decode(*args, keys)
    theirs = decode(*args, keys, plain_step=False)
    assert ours == theirs
    assert len({tuple(d.token_ids) for d in ours}) > 1  # the rows really sampled


def test_models_it_cannot_reproduce_decode_through_their_forward(tokenizer):
    model = _model("qwen2", tokenizer)
    assert decode_step_for(model, growing_cache(model.config)) is None  # plain SDPA: not switched
    with matmul_decoding(model):
        assert decode_step_for(model, growing_cache(model.config)) is not None
        assert decode_step_for(model, DynamicCache(config=model.config)) is None
        hook = model.model.layers[1].mlp.register_forward_hook(lambda *args: None)
        assert decode_step_for(model, growing_cache(model.config)) is None  # it would skip it
        hook.remove()
        next(model.parameters()).ds_id = 0  # a ZeRO-3 shard: the step would read a slice
        assert decode_step_for(model, growing_cache(model.config)) is None
        del next(model.parameters()).ds_id
        model.config.hidden_act = "gelu"
        assert decode_step_for(model, growing_cache(model.config)) is None

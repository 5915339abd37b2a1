"""Packed batches (`training.loop.pack`): each example keeps the loss it has in a row of its own."""

import pytest
import torch

from configs.schema import ModelConfig, TrainConfig
from models.loading import build_model
from tests.tiny_models import make_tokenizer
from training.distributed import target_count
from training.examples import IGNORE, Example
from training.loop import collate, pack, train


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def _model(tokenizer, architecture: str):
    spec = ModelConfig(
        architecture=architecture,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return build_model(spec, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, 0)


def _examples(vocab: int, lengths: list[int], seed: int = 0) -> list[Example]:
    """Random token examples; every other one an SFT example with no loss on its first third."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(3, vocab, (n,), generator=generator).tolist()
        prompt = n // 3 if i % 2 else 0
        out.append(Example(ids, [IGNORE] * prompt + ids[prompt:]))
    return out


def _alone_loss(model, examples: list[Example]) -> torch.Tensor:
    """The token-mean loss of `examples`, each run in a batch of its own (no padding at all)."""
    total, count = torch.zeros(()), 0
    for e in examples:
        out = model(
            input_ids=torch.tensor([e.input_ids]), labels=torch.tensor([e.labels]), use_cache=False
        )
        n = target_count([e])
        total, count = total + out.loss * n, count + n
    return total / count


def _blocks(batch) -> list[list[int]]:
    """The token blocks of a packed batch, read back from where the positions restart."""
    blocks = []
    for ids, positions in zip(batch["input_ids"], batch["position_ids"], strict=True):
        starts = [i for i, p in enumerate(positions.tolist()) if p == 0] + [len(ids)]
        blocks += [ids[a:b].tolist() for a, b in zip(starts, starts[1:], strict=False)]
    return blocks


def test_pack_fills_rows_longest_first_and_keeps_every_example_whole():
    examples = _examples(50, [10, 3, 7, 2, 9, 1])
    batch = pack(examples, pad_id=0)
    # first fit, longest first, rows as wide as the longest (10): [10], [9, 1], [7, 3], [2, pad]
    assert batch["input_ids"].shape == (4, 10)
    assert batch["position_ids"][1].tolist() == list(range(9)) + [0]
    assert batch["position_ids"][3].tolist() == [0, 1] + list(range(8))
    blocks = _blocks(batch)
    assert sorted(blocks) == sorted([e.input_ids for e in examples] + [[0] * 8])
    assert int((batch["labels"] != IGNORE).sum()) == target_count(examples)


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_a_packed_batch_has_the_loss_and_gradient_of_its_examples_alone(tokenizer, architecture):
    model = _model(tokenizer, architecture)
    examples = _examples(len(tokenizer), [40, 12, 29, 33, 5, 18, 21, 40], seed=1)
    reference = _alone_loss(model, examples)
    packed = pack(examples, tokenizer.pad_token_id)
    assert packed["input_ids"].shape[0] < len(examples)
    loss = model(**packed, use_cache=False).loss
    assert abs(float((loss - reference).detach())) < 2e-6  # a few float32 steps at a loss near 5.7
    # with a cache the model does not read the restarts: tokens see the example before them
    leaky = model(**packed, use_cache=True).loss
    assert abs(float((leaky - reference).detach())) > 2e-5

    loss.backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(**collate(examples, tokenizer.pad_token_id), use_cache=False).loss.backward()
    for a, b in zip(packed_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_training_on_packed_batches_reaches_the_weights_of_padded_ones(tokenizer, tmp_path):
    examples = _examples(len(tokenizer), [5 + (7 * i) % 40 for i in range(48)], seed=2)
    weights = []
    for packing in (False, True):
        model = _model(tokenizer, "qwen2")
        cfg = TrainConfig(
            epochs=1, batch_size=8, learning_rate=1e-2, warmup_steps=0, packing=packing
        )
        train(
            model,
            examples,
            cfg,
            tmp_path / str(packing),
            "fp",
            lambda m, s: None,
            tokenizer.pad_token_id,
        )
        weights.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*weights, strict=True):
        assert torch.allclose(a, b, atol=1e-4)

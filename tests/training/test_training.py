import pytest
import torch

from configs.supervised import TrainConfig
from models.chat import render_completion, render_prompt
from tests.tiny_models import TEXTS, tiny_model
from training.batches import batch_order
from training.examples import IGNORE, lm_examples, sft_examples
from training.supervised import train


def test_tokenizer_keeps_tags_whole_and_splits_digits(tokenizer):
    ids = tokenizer("<think> 123 </think>", add_special_tokens=False)["input_ids"]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert pieces[0] == "<think>" and pieces[-1] == "</think>"
    assert all(sum(ch.isdigit() for ch in piece) <= 1 for piece in pieces)
    text = "<think> 1 + 2 = 3 </think> <answer> 3 </answer>"
    assert (
        tokenizer.decode(
            tokenizer(text, add_special_tokens=False)["input_ids"], skip_special_tokens=True
        )
        == text
    )


def test_sft_examples_put_the_loss_on_the_completion_only(tokenizer):
    prompt = render_prompt(tokenizer, "What is 1 + 2?")
    (example,) = sft_examples(
        tokenizer, [prompt], [render_completion(tokenizer, "The answer is 3.")], max_length=256
    )
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert example.labels[:n_prompt] == [IGNORE] * n_prompt
    assert example.labels[n_prompt:] == example.input_ids[n_prompt:]
    assert example.input_ids[-1] == tokenizer.eos_token_id


def test_sft_examples_drop_rows_whose_completion_is_truncated_away(tokenizer):
    prompt = render_prompt(tokenizer, "What is 1 + 2?")
    examples = sft_examples(tokenizer, [prompt], ["3"], max_length=3)
    assert examples == []
    assert (examples.cuts.cut, examples.cuts.dropped) == (1, 1)


def test_examples_count_what_max_length_cut(tokenizer, caplog):
    """Three examples of 5, 8 and 12 tokens under max_length 8: one cut by 4 tokens; the SFT
    example whose prompt alone fills the length is dropped."""
    texts = ["a b c d e", "a b c d e f g h", "a b c d e f g h i j k l"]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    limit = lengths[1]
    lm = lm_examples(tokenizer, texts, max_length=limit)
    assert [len(e.input_ids) for e in lm] == [lengths[0], limit, limit]
    assert lm.cuts.metrics() == {
        "data/examples": 3.0,
        "data/truncated_examples": 1.0,
        "data/dropped_examples": 0.0,
        "data/truncated_tokens": float(lengths[2] - limit),
    }
    sft = sft_examples(tokenizer, [texts[0], texts[2]], [texts[0], "m"], max_length=limit + 2)
    assert len(sft) == 1 and (sft.cuts.cut, sft.cuts.dropped) == (2, 1)
    logged = []
    with caplog.at_level("WARNING", logger="training.examples"):
        sft.cuts.report(logged.append, "cold_start_sft")
    assert logged == [sft.cuts.metrics()]
    assert "cold_start_sft: 2 of 2 examples are longer than max_length" in caplog.text


def test_batch_order_covers_fractional_epochs():
    cfg = TrainConfig(epochs=1.5, batch_size=4, seed=1)
    order = batch_order(10, cfg)
    assert len(order) == 4 and all(len(b) == 4 for b in order)
    assert sorted(i for b in order[:2] for i in b)[:8] == sorted(
        set(i for b in order[:2] for i in b)
    )


def _padded(order: list[list[int]], lengths: list[int]) -> int:
    return sum(max(lengths[i] for i in batch) * len(batch) for batch in order)


def test_length_grouped_batches_hold_the_same_examples_with_less_padding():
    lengths = torch.randint(5, 200, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    plain = batch_order(300, TrainConfig(epochs=2.5, batch_size=8, length_window=0, seed=3))
    cfg = TrainConfig(epochs=2.5, batch_size=8, length_window=10, seed=3)
    grouped = batch_order(300, cfg, lengths)
    assert grouped == batch_order(300, cfg, lengths)  # a pure function: resumes see the same
    assert len(grouped) == len(plain) and all(len(b) == 8 for b in grouped)
    for start in range(0, len(plain), 10):  # each stretch of 10 batches: the same examples
        stretch = slice(start, start + 10)
        assert sorted(sum(grouped[stretch], [])) == sorted(sum(plain[stretch], []))
    real = sum(lengths[i] for batch in plain for i in batch)
    assert _padded(plain, lengths) / real > 1.3
    assert _padded(grouped, lengths) / real < 1.1
    first_lengths = [max(lengths[i] for i in b) for b in grouped[:10]]
    assert first_lengths != sorted(first_lengths)  # the stretch's batches are shuffled


def test_length_window_of_one_or_no_lengths_gives_plain_batches():
    cfg = TrainConfig(epochs=1, batch_size=4, length_window=1, seed=0)
    plain = batch_order(20, cfg)
    assert batch_order(20, cfg, list(range(20))) == plain
    windowed = TrainConfig(epochs=1, batch_size=4, length_window=5, seed=0)
    assert batch_order(20, windowed) == plain


def test_training_lowers_the_loss_and_changes_parameters(tokenizer, tmp_path):
    model = tiny_model(tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    examples = lm_examples(tokenizer, TEXTS, max_length=64)
    losses = []
    cfg = TrainConfig(
        epochs=6,
        batch_size=20,
        learning_rate=1e-2,
        warmup_steps=0,
        log_every=1,
        checkpoint_every=100,
    )
    train(
        model,
        examples,
        cfg,
        tmp_path,
        "fp",
        lambda m, s: losses.append(m["train/loss"]),
        tokenizer.pad_token_id,
    )
    assert losses[-1] < 0.7 * losses[0]
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class Crash(RuntimeError):
    """Stands for a process dying mid-run."""


def test_a_crashed_run_resumes_from_its_checkpoint_to_the_same_weights(tokenizer, tmp_path):
    examples = lm_examples(tokenizer, TEXTS, max_length=64)
    cfg = TrainConfig(
        epochs=1, batch_size=10, learning_rate=5e-3, warmup_steps=2, log_every=1, checkpoint_every=4
    )

    straight = tiny_model(tokenizer)
    train(straight, examples, cfg, tmp_path / "a", "fp", lambda m, s: None, tokenizer.pad_token_id)

    def crash_at_step_7(metrics, step):
        if step == 7:
            raise Crash

    interrupted = tiny_model(tokenizer)
    with pytest.raises(Crash):
        train(
            interrupted,
            examples,
            cfg,
            tmp_path / "b",
            "fp",
            crash_at_step_7,
            tokenizer.pad_token_id,
        )
    resumed = tiny_model(tokenizer)
    report = train(
        resumed, examples, cfg, tmp_path / "b", "fp", lambda m, s: None, tokenizer.pad_token_id
    )
    assert report.resumed_from == 4
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_checkpoint_of_another_run_is_not_resumed(tokenizer, tmp_path):
    examples = lm_examples(tokenizer, TEXTS[:20], max_length=64)
    cfg = TrainConfig(epochs=1, batch_size=10, checkpoint_every=1)
    train(
        tiny_model(tokenizer),
        examples,
        cfg,
        tmp_path,
        "run-a",
        lambda m, s: None,
        tokenizer.pad_token_id,
    )
    report = train(
        tiny_model(tokenizer),
        examples,
        cfg,
        tmp_path,
        "run-b",
        lambda m, s: None,
        tokenizer.pad_token_id,
    )
    assert report.resumed_from == 0

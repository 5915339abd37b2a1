"""A corpus at a real data set's size is tokenised without holding the tokenizer's whole output."""

import tracemalloc

from training.examples import lm_examples, sft_examples


def long_texts(n: int) -> list[str]:
    return [" ".join(str((start + i) % 97) for i in range(300)) for start in range(n)]


def test_a_corpus_is_tokenised_a_chunk_at_a_time_keeping_only_what_is_cut_to(tokenizer):
    texts = long_texts(6000)
    whole = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts[:50]]
    # What the corpus's full-length id lists alone take (a pointer an id), all texts at once.
    tokens = sum(map(len, whole)) / len(whole) * len(texts)
    all_at_once = tokens * 8

    tracemalloc.start()
    try:
        examples = lm_examples(tokenizer, texts, max_length=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert peak < all_at_once / 2, f"peak {peak / 2**20:.0f} MiB for {tokens:.0f} tokens"
    assert len(examples) == len(texts) and examples.cuts.cut == len(texts)
    assert [e.input_ids for e in examples[:50]] == [ids[:8] for ids in whole]
    assert examples.cuts.tokens_cut > 0.9 * tokens - 8 * len(texts)


def test_sft_examples_pair_each_prompt_with_its_completion_across_chunks(tokenizer):
    texts = long_texts(2500)
    examples = sft_examples(tokenizer, texts, [str(i) for i in range(2500)], max_length=10_000)
    for i in (0, 1023, 1024, 2499):
        completion = tokenizer(str(i), add_special_tokens=False)["input_ids"]
        assert examples[i].labels[-len(completion) :] == completion

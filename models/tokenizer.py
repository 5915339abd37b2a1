"""A byte-level BPE tokenizer trained locally, with the chat template and format tags.

Digits are split one per token so arithmetic is learnable by a small model; the format tags are
single tokens (kept when decoding) and the chat markers are special tokens (dropped).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from models.chat import CHAT_TEMPLATE, EOS, FORMAT_TOKENS, IM_END, PAD, SPECIAL_TOKENS


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: list[str]) -> Tokenizer:
    """The byte-level BPE model with digits split one per token, trained on `texts`."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    return core


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """The tiny world's tokenizer: our chat template, its markers and the format tags."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(texts, vocab_size, SPECIAL_TOKENS),
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[EOS],
    )
    tokenizer.add_tokens(FORMAT_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def vocabulary_mismatch(
    first: PreTrainedTokenizerBase, second: PreTrainedTokenizerBase
) -> str | None:
    """How two tokenizers' ids differ in meaning (their sizes, their special tokens' ids, then
    any token->id entry), or None when every id means the same token in both."""
    if len(first) != len(second):
        return f"one tokenizer has {len(first)} tokens, the other {len(second)}"
    specials = [
        {t: tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens} for tok in (first, second)
    ]
    if specials[0] != specials[1]:
        diff = sorted(set(specials[0].items()) ^ set(specials[1].items()))
        return f"special tokens map to different ids: {diff[:8]}"
    vocabularies = first.get_vocab(), second.get_vocab()
    if vocabularies[0] != vocabularies[1]:
        diff = sorted(set(vocabularies[0].items()) ^ set(vocabularies[1].items()))
        return f"{len(diff)} token->id entries differ between the tokenizers, e.g. {diff[:8]}"
    return None

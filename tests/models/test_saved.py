"""A saved model folder's bytes depend on the model, not on what its tokenizer did before: the
folder's digest is its identity in the stage cache and in lineage."""

from models.saved import save_model
from storage.digests import tree_digest
from tests.tiny_models import make_tokenizer, tiny_model


def test_the_same_weights_save_to_the_same_bytes_after_a_padded_batch_call(tmp_path):
    tokenizer = make_tokenizer()
    model = tiny_model(tokenizer)
    before = save_model(model, tokenizer, tmp_path / "before").path
    tokenizer.padding_side = "left"  # as the sampler leaves it
    tokenizer(["1 + 2", "a longer prompt than that"], padding=True, truncation=True, max_length=8)
    after = save_model(model, tokenizer, tmp_path / "after").path
    assert (before / "tokenizer.json").read_bytes() == (after / "tokenizer.json").read_bytes()
    assert tree_digest(before) == tree_digest(after)
    batch = tokenizer(["1 + 2", "a longer prompt"], padding=True)  # the tokenizer still pads
    assert len(set(map(len, batch["input_ids"]))) == 1

"""A sampling actor's model, in this process (the actor's class without Ray): loaded for the spec
a call names, loaded again for another, and freed when the stage gives the actor back."""

from __future__ import annotations

import gc
import weakref

import pytest

from cluster import actors
from cluster.actors import ModelSpec, SamplerActor, code_digest
from configs.reinforcement import SamplerConfig
from models.saved import save_model
from sampling.interface import SamplingParams
from storage.digests import tree_digest
from tests.tiny_models import make_tokenizer, tiny_model


@pytest.fixture
def specs(tmp_path, monkeypatch) -> list[ModelSpec]:
    monkeypatch.setattr(actors, "actor_device", lambda: "cpu")  # what Ray's CPU actor sees
    tokenizer = make_tokenizer()
    out = []
    for seed in (0, 1):
        ref = save_model(tiny_model(tokenizer, seed=seed), tokenizer, tmp_path / f"m{seed}")
        digests = {"model": tree_digest(ref.path), "code": code_digest()}
        out.append(ModelSpec(SamplerConfig(), str(ref.path), digests, 4))
    return out


def test_unloading_frees_the_model_and_the_next_spec_loads_its_own(specs):
    actor = SamplerActor(threads=1)
    params = SamplingParams(max_new_tokens=4)
    first = actor.generate(specs[0], ["What is 1 + 1?"], 2, params)
    model = weakref.ref(actor.sampler.model)
    again = actor.generate(specs[0], ["What is 1 + 1?"], 2, params)
    assert actor.sampler.model is model()  # the same spec: not loaded again
    assert [c.token_ids for c in again.groups[0]] == [c.token_ids for c in first.groups[0]]
    actor.unload()
    gc.collect()
    assert model() is None and actor.spec is None
    actor.generate(specs[1], ["What is 1 + 1?"], 2, params)
    assert actor.spec == specs[1]
    other = weakref.ref(actor.sampler.model)
    actor.open(specs[0])  # another spec: the model it held is let go first
    gc.collect()
    assert other() is None


def test_a_model_folder_that_changed_is_refused_by_name(specs):
    wrong = ModelSpec(specs[0].config, specs[0].model_path, specs[1].digests, 4)
    with pytest.raises(actors.ModelMismatchError, match="has digest"):
        SamplerActor(threads=1).open(wrong)

"""The KL reference a single-process GRPO trainer keeps is in the dtype of the policy it trains,
whatever precision the engine samples in: a bf16 policy against an fp32 reference would start
its KL at bf16's precision gap instead of 0. (Under DeepSpeed the reference is an engine of its
own in the policy's precision: tests/rl/test_deepspeed_grpo.py.)"""

import copy

import torch

from rl.trainer import GRPOTrainer
from tests.tiny_models import grpo_config, tiny_model
from training.engines import LocalEngine


class SamplesInFP32(LocalEngine):
    """A real local engine training a bf16 module that samples from an fp32 copy of it, as an
    engine keeping fp32 master weights would: here the copy the reference is made from and the
    policy differ in dtype, which with LocalEngine's own `sampling_model()` (the module itself)
    they never do."""

    def __init__(self, model: torch.nn.Module):
        super().__init__(model, learning_rate=1e-2, max_grad_norm=1.0)
        self._sampling = copy.deepcopy(model).float()

    def sampling_model(self) -> torch.nn.Module:
        return self._sampling


def test_the_reference_is_in_the_trained_policys_dtype(tokenizer):
    policy = tiny_model(tokenizer).to(torch.bfloat16)
    engine = SamplesInFP32(policy)
    trainer = GRPOTrainer(
        policy, tokenizer, grpo_config(beta=0.04), lambda m, s: None, engine=engine,
        show_progress=False,
    )  # fmt: skip
    assert trainer.reference is not None
    assert {p.dtype for p in trainer.reference.parameters()} == {torch.bfloat16}
    assert all(not p.requires_grad for p in trainer.reference.parameters())
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():  # the same weights, the same numbers: the KL starts at exactly 0
        assert torch.equal(trainer.reference(ids).logits, policy(ids).logits)

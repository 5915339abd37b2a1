"""The vLLM sampler on a real engine (`-m gpu`, on a CUDA machine with the `gpu` extra): after a
weight sync the engine samples from the trainer's weights, not from the folder it started with.

The check is on log-probabilities rather than tokens: the engine's log-probability of each
token it sampled must equal the trainer's (teacher-forced, same fp32 weights) after the sync, to
TF32's precision (vLLM's fp32 attention uses it), and differ before it by much more. Greedy
tokens alone could agree by chance on a small random model.
"""

import pytest
import torch

from configs.reinforcement import SamplerConfig
from configs.supervised import ModelConfig
from models.chat import render_prompt
from models.loading import build_model
from rl.rollouts import build_batch, completion_logprobs
from sampling.interface import SamplingParams
from tests.tiny_models import make_tokenizer

pytestmark = pytest.mark.gpu

TF32_ATOL = 2e-2  # a small random model's log-probabilities through TF32 attention

SPEC = ModelConfig(
    hidden_size=256,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=512,
    max_position_embeddings=1024,
)  # fmt: skip  (head_dim 64: a size vLLM's attention kernels take)


def logprob_gap(sampler, trainer, tokenizer, prompts) -> float:
    """Largest |engine - trainer| log-probability over every sampled token."""
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=0)
    groups = sampler.generate(prompts, 2, params)
    flat = [(p, c) for p, group in zip(prompts, groups, strict=True) for c in group]
    batch = build_batch(
        tokenizer, [p for p, _ in flat], [c.token_ids for _, c in flat], tokenizer.pad_token_id
    ).to("cuda")
    with torch.no_grad():
        logp, _ = completion_logprobs(trainer, batch, temperature=1.0)
    theirs = torch.tensor([lp for _, c in flat for lp in c.logprobs])
    return float((logp[batch.completion_mask.bool()].cpu() - theirs).abs().max())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_a_synced_engine_samples_from_the_trainer_s_weights(tmp_path):
    pytest.importorskip("vllm", reason="needs vLLM: the `gpu` extra")
    from sampling.vllm import VLLMSampler

    tokenizer = make_tokenizer()
    ids = (len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    build_model(SPEC, *ids, seed=0).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    trainer = build_model(SPEC, *ids, seed=1).cuda().eval()
    config = SamplerConfig(
        backend="vllm", dtype="float32", gpu_memory_utilization=0.3, max_model_len=512
    )
    prompts = [render_prompt(tokenizer, f"What is {a} + {a + 1}?") for a in range(4)]
    with VLLMSampler(str(tmp_path), config, weight_sync=True) as sampler:
        before = logprob_gap(sampler, trainer, tokenizer, prompts)  # the folder's weights
        report = sampler.sync_weights(trainer)
        assert report.version == 1 and report.tensors > 0
        after = logprob_gap(sampler, trainer, tokenizer, prompts)
    # vLLM's float32 attention runs on Triton with TF32 dot products (10-bit mantissas), so the
    # engine's log-probabilities are the trainer's only to about 1e-3 relative per logit:
    # within TF32_ATOL, where the weights of another seed are off by ten times more
    assert after < TF32_ATOL < before / 10, (before, after)

"""Decoding on the CPU in lanes (sampling/hf.py): one torch thread each, the process's threads
turned into lanes where two or more get rows enough; smaller calls decode as one batch on the
process's threads. The samples are those of one lane."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

import sampling.hf as hf_module
from sampling.hf import HFSampler, cpu_lanes
from sampling.interface import SamplingParams
from tests.tiny_models import tiny_model

PROMPTS = ["What is 1 + 2?", "What is 3 + 4? The answer", "7", "What is 9 + 9? The answer is 1"]


@pytest.fixture
def threads():
    """torch's thread count, restored after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_lanes_are_the_threads_as_far_as_each_gets_its_rows(threads):
    cpu = SimpleNamespace(device=torch.device("cpu"))
    torch.set_num_threads(2)
    assert cpu_lanes(cpu, None, 512) == 2
    assert cpu_lanes(cpu, None, 300) == 0  # not 256 rows for each of two: one batch, 2 threads
    assert cpu_lanes(cpu, None, 8) == 0
    torch.set_num_threads(4)
    assert cpu_lanes(cpu, None, 4096) == 4
    assert cpu_lanes(cpu, object(), 4096) == 0  # in step with other ranks: torch's own threads
    assert cpu_lanes(SimpleNamespace(device=torch.device("meta")), None, 4096) == 0


def test_lanes_draw_the_samples_of_one_lane_each_with_one_thread(tokenizer, monkeypatch, threads):
    model = tiny_model(tokenizer, seed=1).eval()
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=8, seed=5)
    seen: dict[str, int] = {}

    def note(module, args, output):  # the torch threads of each thread the model runs on
        seen[threading.current_thread().name] = torch.get_num_threads()

    model.register_forward_hook(note)
    monkeypatch.setattr(hf_module, "LANE_ROWS", 4)  # 12 rows in batches of 8: two lanes of 4
    torch.set_num_threads(1)
    one = HFSampler(model, tokenizer, 8, show_progress=False).generate(PROMPTS, 3, params)
    assert seen == {threading.current_thread().name: 1}
    seen.clear()
    torch.set_num_threads(2)
    two = HFSampler(model, tokenizer, 8, show_progress=False).generate(PROMPTS, 3, params)
    lanes = [name for name in seen if name.startswith("decode-lane")]
    assert len(lanes) == 2 and all(seen[name] == 1 for name in lanes)
    assert torch.get_num_threads() == 2  # the process's count back
    assert [[c.token_ids for c in g] for g in two] == [[c.token_ids for c in g] for g in one]
    for a, b in zip(two, one, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)

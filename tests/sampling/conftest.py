"""The vLLM stand-in (tests/vllm_standin.py) for the sampler tests of this room."""

import gc

import pytest
import torch

from sampling import vllm as vllm_module
from tests.tiny_models import tiny_model
from tests.vllm_standin import StandInLLM, standin_api

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("policy")
    tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def standin(monkeypatch):
    """A fresh stand-in per test, with no launcher variable set; its hangs end when the test
    does, and an engine a test left running (a hung one) is shut down after it."""
    StandInLLM.reset()
    monkeypatch.setattr(vllm_module, "import_vllm", standin_api)
    for key in LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    yield StandInLLM
    StandInLLM.behaviour.release.set()
    for ref in StandInLLM.instances:
        engine = ref()
        if engine is not None:
            engine.shut_down()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    gc.collect()

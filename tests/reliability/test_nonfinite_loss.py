"""A NaN or infinite loss stops a training stage at once: the error names the stage and the step,
the bad update is not applied, the checkpoint on disk is the last good one, and a rerun without
the fault resumes from it to the weights of a run that never met the fault."""

from __future__ import annotations

import itertools
import math
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import preference.training as rm_training
from configs.supervised import ModelConfig, TrainConfig
from models.chat import render_prompt
from preference.model import build_reward_model
from preference.training import EncodedPair, train_reward_model
from rl import update as grpo_module
from rl.on_policy import OnPolicyDistiller
from rl.trainer import GRPOTrainer
from tests.tiny_models import (
    PROBLEMS,
    TEXTS,
    distill_config,
    grpo_config,
    tiny_model,
)
from training.checkpoints import load_checkpoint
from training.examples import lm_examples
from training.finite import NonFiniteLossError
from training.supervised import train

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: these models are tiny, and two threads on a shared 2-core machine only
    fight each other and other processes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def no_log(metrics: dict[str, float], step: int) -> None:
    pass


def same_weights(a: torch.nn.Module, b: dict[str, torch.Tensor] | torch.nn.Module) -> bool:
    theirs = b if isinstance(b, dict) else b.state_dict()
    return all(torch.allclose(v, theirs[k], atol=1e-6) for k, v in a.state_dict().items())


def checkpoint_step(folder: Path) -> int:
    state = load_checkpoint(folder, "fp")
    assert state is not None
    return state["step"]


def assert_stopped(err: NonFiniteLossError, desc: str, what: str, step: int, kept: int) -> None:
    assert (err.desc, err.what, err.step, err.checkpoint_step) == (desc, what, step, kept)
    assert str(err).startswith(f"{desc}: {what} is ")
    assert f" at step {step}; stopped before the update, " in str(err)
    assert f"the last checkpoint (step {kept})" in str(err)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


# ---- the SFT / pretraining loop ----------------------------------------------------------------

SFT = TrainConfig(
    epochs=1, batch_size=10, learning_rate=5e-3, warmup_steps=2, log_every=1, checkpoint_every=2
)


def poison_forward(model: torch.nn.Module, at_call: int, value: float) -> None:
    """The model's loss becomes `value` on its `at_call`-th forward pass."""
    forward, calls = model.forward, itertools.count(1)

    def poisoned(*args, **kwargs):
        out = forward(*args, **kwargs)
        if next(calls) == at_call:
            out.loss = out.loss * value
        return out

    model.forward = poisoned


def run_sft(tokenizer, folder: Path, fault: Callable[[torch.nn.Module], None] | None = None):
    model = tiny_model(tokenizer)
    if fault is not None:
        fault(model)
    examples = lm_examples(tokenizer, TEXTS, max_length=64)
    return model, train(model, examples, SFT, folder, "fp", no_log, tokenizer.pad_token_id, "sft")


@pytest.mark.parametrize("value", [NAN, INF])
def test_sft_stops_at_a_non_finite_loss_and_resumes_from_the_last_good_checkpoint(
    tokenizer, tmp_path, value
):
    straight, _ = run_sft(tokenizer, tmp_path / "straight")
    with pytest.raises(NonFiniteLossError) as err:
        run_sft(tokenizer, tmp_path / "b", lambda m: poison_forward(m, 5, value))
    assert_stopped(err.value, "sft", "loss", step=5, kept=4)
    assert math.isnan(err.value.value) if value != value else err.value.value == value
    assert checkpoint_step(tmp_path / "b") == 4
    resumed, report = run_sft(tokenizer, tmp_path / "b")
    assert report.resumed_from == 4
    assert same_weights(resumed, straight)


def test_sft_stops_at_an_infinite_gradient_before_the_update(tokenizer, tmp_path):
    seen: dict[str, torch.nn.Module] = {}

    def poison_gradient(model: torch.nn.Module) -> None:
        seen["model"] = model
        calls = itertools.count(1)
        weight = model.get_input_embeddings().weight
        weight.register_hook(lambda g: g * INF if next(calls) == 3 else g)

    with pytest.raises(NonFiniteLossError) as err:
        run_sft(tokenizer, tmp_path, poison_gradient)
    assert_stopped(err.value, "sft", "gradient norm", step=3, kept=2)
    state = load_checkpoint(tmp_path, "fp")
    assert state is not None and state["step"] == 2
    assert same_weights(seen["model"], state["model"])  # step 3's update never reached it


def test_a_fault_before_the_first_checkpoint_says_none_is_kept(tokenizer, tmp_path):
    with pytest.raises(NonFiniteLossError, match=r"at step 1; .* no checkpoint had been saved"):
        run_sft(tokenizer, tmp_path, lambda m: poison_forward(m, 1, NAN))
    assert load_checkpoint(tmp_path, "fp") is None


# ---- GRPO --------------------------------------------------------------------------------------

GRPO = grpo_config(steps=6)


def run_grpo(
    tokenizer, folder: Path, poison: dict[str, GRPOTrainer] | None = None
) -> tuple[torch.nn.Module, int]:
    """A GRPO run; `poison`, if given, is told the trainer, for a patched loss to read its step."""
    model = tiny_model(tokenizer)
    trainer = GRPOTrainer(model, tokenizer, GRPO, no_log, show_progress=False)
    if poison is not None:
        poison["trainer"] = trainer
    return model, trainer.train(PROBLEMS, folder, "fp").resumed_from


def test_grpo_stops_at_a_non_finite_loss_and_resumes(tokenizer, tmp_path, monkeypatch):
    straight, _ = run_grpo(tokenizer, tmp_path / "straight")
    real_loss, poison, poisoned_at = grpo_module.grpo_loss, {}, []

    def nan_from_step_3(*args, **kwargs):
        loss, stats = real_loss(*args, **kwargs)
        step = poison["trainer"].guard.step
        if step >= 3 and not poisoned_at:  # the first update at step 3 or later
            poisoned_at.append(step)
            loss = loss * NAN
        return loss, stats

    monkeypatch.setattr(grpo_module, "grpo_loss", nan_from_step_3)
    with pytest.raises(NonFiniteLossError) as err:
        run_grpo(tokenizer, tmp_path / "b", poison)
    (step,) = poisoned_at
    kept = (step - 1) // 2 * 2
    assert_stopped(err.value, "grpo", "loss", step=step, kept=kept)
    assert checkpoint_step(tmp_path / "b") == kept
    monkeypatch.undo()
    resumed, resumed_from = run_grpo(tokenizer, tmp_path / "b")
    assert resumed_from == kept
    assert same_weights(resumed, straight)


# ---- on-policy distillation --------------------------------------------------------------------

DISTILL = distill_config()


def run_distill(tokenizer, folder: Path, poison_step: int | None = None):
    student, teacher = tiny_model(tokenizer, seed=0), tiny_model(tokenizer, seed=1)
    distiller = OnPolicyDistiller(student, teacher, tokenizer, DISTILL, no_log, False)
    if poison_step is not None:
        real = distiller.loss_fn

        def poisoned(*args):
            loss = real(*args)
            return loss * INF if distiller.guard.step == poison_step else loss

        distiller.loss_fn = poisoned
    prompts = [render_prompt(tokenizer, f"What is {i} + {i}?") for i in range(16)]
    return student, distiller.train(prompts, folder, "fp")


def test_distillation_stops_at_a_non_finite_loss_and_resumes(tokenizer, tmp_path):
    straight, _ = run_distill(tokenizer, tmp_path / "straight")
    with pytest.raises(NonFiniteLossError) as err:
        run_distill(tokenizer, tmp_path / "b", poison_step=3)
    assert_stopped(err.value, "distill", "loss", step=3, kept=2)
    assert checkpoint_step(tmp_path / "b") == 2
    resumed, report = run_distill(tokenizer, tmp_path / "b")
    assert report.resumed_from == 2
    assert same_weights(resumed, straight)


# ---- the reward model --------------------------------------------------------------------------


def run_reward_model(tokenizer, folder: Path):
    spec = ModelConfig(
        hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32
    )
    model = build_reward_model(spec, len(tokenizer), tokenizer.pad_token_id)
    ids = tokenizer(TEXTS[:40], add_special_tokens=False)["input_ids"]
    pairs = [EncodedPair(a, b) for a, b in zip(ids[::2], ids[1::2], strict=True)]
    cfg = TrainConfig(epochs=1, batch_size=4, warmup_steps=0, checkpoint_every=2)
    report = train_reward_model(
        model, pairs, cfg, folder, "fp", no_log, tokenizer.pad_token_id, show_progress=False
    )
    return model, report


def test_the_reward_model_stops_at_a_non_finite_loss_and_resumes(tokenizer, tmp_path, monkeypatch):
    straight, _ = run_reward_model(tokenizer, tmp_path / "straight")
    real, calls = rm_training.bt_loss, itertools.count(1)
    monkeypatch.setattr(
        rm_training, "bt_loss", lambda c, r: real(c, r) * (NAN if next(calls) == 4 else 1.0)
    )
    with pytest.raises(NonFiniteLossError) as err:
        run_reward_model(tokenizer, tmp_path / "b")
    assert_stopped(err.value, "reward model", "loss", step=4, kept=2)
    monkeypatch.undo()
    resumed, report = run_reward_model(tokenizer, tmp_path / "b")
    assert report.resumed_from == 2
    assert same_weights(resumed, straight)

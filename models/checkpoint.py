"""A local pretrained checkpoint (Qwen2.5, Llama 3), checked before the pipeline builds on it.

Every later stage renders prompts with the tokenizer's chat template, ends training completions
with its end-of-turn token and samples until that token, so a checkpoint is loaded and those
are tried once here, where a failure names the folder, rather than deep inside a training stage.
Before anything runs, `check_model_inputs` puts every model folder a profile names through the
checks that need no weights loaded (seconds), so that a broken student is not found only at
stage 7, after every policy stage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from jinja2 import TemplateError

from configs.preflight import model_folder_problems, required_inputs
from configs.schema import PipelineConfig
from contracts.answer_format import TAGS
from models.chat import (
    ChatTemplateError,
    end_of_turn,
    render_completion,
    render_prompt,
    stop_token_ids,
)
from models.loading import load_model, load_tokenizer, parameter_count
from models.tokenizer import vocabulary_mismatch

_PROBE_QUESTION = "What is 2 + 3?"
_PROBE_COMPLETION = "<think> 2 + 3 = 5 </think> <answer> The answer is 5. </answer>"


class CheckpointError(ValueError):
    """A folder that cannot serve as a base or student: the message names it and the cause."""


@dataclass(frozen=True)
class CheckedCheckpoint:
    """What the checks found: enough to record the checkpoint and to compare sizes."""

    path: Path
    model_type: str  # transformers' name of the architecture: "qwen2", "llama"
    parameters: int
    tokens: int  # len(tokenizer)
    embedding_rows: int  # the model's vocabulary (often padded beyond the tokenizer's)
    end_of_turn: str
    stop_ids: tuple[int, ...]


def check_chat(path: Path) -> tuple[str, tuple[int, ...], int]:
    """The tokenizer renders a prompt and a completion, its generation prompt writes none of the
    tags our completions write (`<think>`), and the completion ends in exactly one end-of-turn
    token; returns that token, the stop ids and the tokenizer's size."""
    tokenizer = load_tokenizer(path)
    try:
        prompt = render_prompt(tokenizer, _PROBE_QUESTION)
        text = prompt + render_completion(tokenizer, _PROBE_COMPLETION)
        end = end_of_turn(tokenizer)
    except (ChatTemplateError, TemplateError, ValueError) as err:
        raise CheckpointError(
            f"{path}: the tokenizer's chat template cannot render our prompts: {err}"
        ) from None
    opened = [tag for tag in TAGS if tag in prompt.rsplit(_PROBE_QUESTION, 1)[-1]]
    if opened:  # DeepSeek-R1-Distill's and QwQ's generation prompts end in '<think>\n'
        raise CheckpointError(
            f"{path}: the chat template's generation prompt already writes {opened[0]!r}, which "
            "our completions write themselves (every example would hold it twice): save the "
            "tokenizer with a template whose generation prompt stops before it"
        )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if ids[-1] != tokenizer.convert_tokens_to_ids(end):
        raise CheckpointError(
            f"{path}: the end-of-turn {end!r} does not encode as one token of the tokenizer"
        )
    return end, tuple(stop_token_ids(tokenizer)), len(tokenizer)


def check_tokenizer_side(path: Path) -> tuple[str, tuple[int, ...], int]:
    """What check_checkpoint checks without loading the weights: the folder's files (weights
    that are git-lfs pointers or cut short included), the chat template and its end-of-turn
    token, and the tokenizer against config.json's vocab_size; returns what check_chat does."""
    problems = model_folder_problems(path)
    if problems:
        raise CheckpointError(f"{path}: not a model folder: {'; '.join(problems)}")
    end, stop_ids, tokens = check_chat(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: config.json cannot be read: {err}") from None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    rows = text.get("vocab_size", config.get("vocab_size"))
    if isinstance(rows, int) and tokens > rows:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokens} tokens but the model embeds only {rows}"
        )
    return end, stop_ids, tokens


def check_model_inputs(config: PipelineConfig, flow: str, source: str | None = None) -> None:
    """Every model folder `flow` opens under `config` (the policy's base, each student) through
    check_tokenizer_side, all of them listed at once in one CheckpointError; run after
    configs.preflight.check_inputs has found each folder there."""
    errors = []
    for item in required_inputs(config, flow):
        if item.kind == "model":
            try:
                check_tokenizer_side(item.path)
            except CheckpointError as err:
                errors.append(f"  {item.key} ({item.what}): {err}")
    if not errors:
        errors = [f"  {problem}" for problem in on_policy_problems(config, flow)]
    if errors:
        raise CheckpointError(
            f"{source or f'profile {config.name}'}: {len(errors)} checkpoint(s) cannot be used; "
            "nothing has run:\n" + "\n".join(errors)
        )


def on_policy_problems(config: PipelineConfig, flow: str) -> list[str]:
    """Why on-policy distillation (`distillation.method: on_policy`) cannot take a student
    checkpoint the flow opens: its KL compares the teacher's and the student's logits id by id,
    so the student's tokenizer must be the policy's, which is the base checkpoint's (or, with no
    `bootstrap.path`, one trained here, which no checkpoint shares)."""
    if config.distillation.method != "on_policy":
        return []
    students = [i for i in required_inputs(config, flow) if i.key.startswith("distillation.")]
    base = config.bootstrap.path
    if base is None:
        return [
            f"{item.key} ({item.what}): on-policy distillation needs the policy's tokenizer, and "
            "the policy's is trained here (no bootstrap.path); use distillation.method=sft"
            for item in students
        ]
    if not students or not Path(base).is_dir():
        return []
    teacher = load_tokenizer(base)
    problems = []
    for item in students:
        mismatch = vocabulary_mismatch(load_tokenizer(item.path), teacher)
        if mismatch is not None:
            problems.append(
                f"{item.key} ({item.what}): not the policy's tokenizer ({base}), which on-policy "
                f"distillation needs: {mismatch}; use distillation.method=sft"
            )
    return problems


def check_checkpoint(path: Path) -> CheckedCheckpoint:
    """Load and check the tokenizer and model of a local folder; CheckpointError says what
    is wrong. The weights are loaded once (bfloat16: half the memory) to prove they load."""
    end, stop_ids, tokens = check_tokenizer_side(path)
    try:
        model = load_model(path, dtype=torch.bfloat16)
    except Exception as err:  # safetensors' SafetensorError, torch's UnpicklingError, ...
        raise CheckpointError(
            f"{path}: the model does not load: {type(err).__name__}: {err}"
        ) from None
    rows = model.get_input_embeddings().num_embeddings
    if tokens > rows:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokens} tokens but the model embeds only {rows}"
        )
    checked = CheckedCheckpoint(
        path, model.config.model_type, parameter_count(model), tokens, rows, end, stop_ids
    )
    del model
    return checked

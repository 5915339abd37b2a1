"""A local pretrained checkpoint (Qwen2.5, Llama 3), checked before the pipeline builds on it.

Every later stage renders prompts with the tokenizer's chat template, ends training completions
with its end-of-turn token and samples until that token, so a checkpoint is loaded and those
are tried once here, where a failure names the folder, rather than deep inside a training stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from jinja2 import TemplateError

from configs.preflight import model_folder_problems
from models.chat import (
    ChatTemplateError,
    end_of_turn,
    render_completion,
    render_prompt,
    stop_token_ids,
)
from models.loading import load_model, load_tokenizer, parameter_count

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
    """The tokenizer renders a prompt and a completion, and the completion ends in exactly one
    end-of-turn token; returns that token, the stop ids and the tokenizer's size."""
    tokenizer = load_tokenizer(path)
    try:
        text = render_prompt(tokenizer, _PROBE_QUESTION)
        text += render_completion(tokenizer, _PROBE_COMPLETION)
        end = end_of_turn(tokenizer)
    except (ChatTemplateError, TemplateError, ValueError) as err:
        raise CheckpointError(
            f"{path}: the tokenizer's chat template cannot render our prompts: {err}"
        ) from None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if ids[-1] != tokenizer.convert_tokens_to_ids(end):
        raise CheckpointError(
            f"{path}: the end-of-turn {end!r} does not encode as one token of the tokenizer"
        )
    return end, tuple(stop_token_ids(tokenizer)), len(tokenizer)


def check_checkpoint(path: Path) -> CheckedCheckpoint:
    """Load and check the tokenizer and model of a local folder; CheckpointError says what
    is wrong. The weights are loaded once (bfloat16: half the memory) to prove they load."""
    problems = model_folder_problems(path)
    if problems:
        raise CheckpointError(f"{path}: not a model folder: {'; '.join(problems)}")
    end, stop_ids, tokens = check_chat(path)
    try:
        model = load_model(path, dtype=torch.bfloat16)
    except (OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"{path}: the model does not load: {err}") from None
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

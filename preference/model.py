"""A transformer with a scalar head that scores a (prompt, response) pair, and batched scoring.

The model is transformers' `AutoModelForSequenceClassification` with one label, so it saves,
loads and serves like any Hugging Face reward model. It starts either from a causal LM folder (the
body loads, the score head is new: what DeepSeek-R1 and InstructGPT do, the policy's knowledge of
the language helping the judge) or fresh from a small config.

The score is read at the last real token. We pool from the attention mask ourselves rather than
through the head's own rule (the rightmost token that is not `pad_token_id`), because a tokenizer
whose pad token is its end-of-turn token would make that rule skip the very token every response
ends with. `config.pad_token_id` is still set, so the saved model also scores right elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import (
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from configs.supervised import ModelConfig
from models.chat import render_completions, render_prompt
from models.loading import ModelNotFoundError, decoder_config


def build_reward_model(
    spec: ModelConfig, vocab_size: int, pad_token_id: int, seed: int = 0
) -> PreTrainedModel:
    """A freshly initialised Qwen2- or Llama-architecture body with a scalar head."""
    config = decoder_config(spec, vocab_size, pad_token_id, num_labels=1)
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(config)


def load_reward_model(path: str | Path, pad_token_id: int | None = None) -> PreTrainedModel:
    """A reward model from a saved folder, or a new one on a causal LM's body (head initialised
    from `torch`'s seed: seed it first for a reproducible start)."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise ModelNotFoundError(f"{path}: no model here (no config.json); nothing is downloaded")
    extra = {} if pad_token_id is None else {"pad_token_id": pad_token_id}
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **extra)
    if model.config.pad_token_id is None:
        raise ValueError(f"{path}: the model config has no pad_token_id; pass the tokenizer's")
    return model.eval()


def template_ends(tokenizer: PreTrainedTokenizerBase) -> tuple[str, str]:
    """What the chat template puts before and after a user question (read off a marker)."""
    marker = "\x00"
    before, after = render_prompt(tokenizer, marker).split(marker)
    return before, after


def pair_texts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], responses: Sequence[str]
) -> list[str]:
    """What the reward model reads: the rendered prompt, then the response and its end-of-turn,
    exactly the text of an SFT example or a sampled rollout.

    Prompts may come raw (data files) or already rendered (the GRPO trainer hands rewards the
    rendered prompt); a prompt already wrapped in the template's ends is not wrapped again.
    """
    before, after = template_ends(tokenizer)
    texts = []
    for prompt, response in zip(prompts, render_completions(tokenizer, responses), strict=True):
        rendered = prompt.startswith(before) and prompt.endswith(after)
        texts.append((prompt if rendered else render_prompt(tokenizer, prompt)) + response)
    return texts


def fit_length(ids: list[int], max_length: int) -> list[int]:
    """Cut the middle of an over-long sequence: the prompt (what was asked) and the end (how the
    response finishes, where the score is read) both stay in view."""
    if len(ids) <= max_length:
        return ids
    head = max_length // 2
    return ids[:head] + ids[len(ids) - (max_length - head) :]


def encode(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int
) -> list[list[int]]:
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [fit_length(row, max_length) for row in ids]


def pad_batch(rows: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and attention mask; (B, T) each."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def sequence_scores(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The scalar score at each row's last real token; (B, T), (B, T) -> (B,)."""
    body = getattr(model, model.base_model_prefix)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B,T,H)
    last = attention_mask.sum(dim=1) - 1  # (B,) right padding: the last 1 in the mask
    pooled = hidden[torch.arange(hidden.shape[0]), last]  # (B, H)
    return model.score(pooled).squeeze(-1)  # (B,)


@torch.no_grad()
def score_ids(
    model: PreTrainedModel, rows: Sequence[list[int]], pad_id: int, batch_size: int
) -> list[float]:
    """Scores for token rows, batched by length (less padding), returned in the given order."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    scores = [0.0] * len(rows)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        ids, mask = pad_batch([rows[i] for i in chunk], pad_id)
        for i, s in zip(chunk, sequence_scores(model, ids, mask).tolist(), strict=True):
            scores[i] = float(s)
    model.train(was_training)
    return scores


def score_pairs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    responses: Sequence[str],
    batch_size: int = 64,
    max_length: int = 512,
) -> list[float]:
    """The reward model's score for each (prompt, response); prompts raw or already rendered."""
    rows = encode(tokenizer, pair_texts(tokenizer, prompts, responses), max_length)
    return score_ids(model, rows, tokenizer.pad_token_id, batch_size)

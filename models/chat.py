"""The chat template and how prompts and training examples are rendered with it.

Prompts are rendered by the tokenizer's own chat template, so the tiny world's tokenizer and a
real one (Qwen2.5's `<|im_end|>`, Llama 3's `<|eot_id|>`) go through the same code. What ends an
assistant turn is read off that template too (`end_of_turn`): a completion trained without it
never learns to stop, and a sampler that does not stop on it runs every sample to the length cap.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from contracts.answer_format import TAGS

IM_START, IM_END, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]
FORMAT_TOKENS = list(TAGS)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# What a template may read beyond the messages, fixed: Llama 3's puts `strftime_now` (today's
# date) into every prompt unless given `date_string`, so a run's prompts, training examples and
# stage keys would change with the day it ran on. Its template's own fallback date is used.
TEMPLATE_VARIABLES = {"date_string": "26 Jul 2024"}

_PROBE = "R1ENDOFTURNPROBE"  # plain letters: no template trims, escapes or splits it


class ChatTemplateError(ValueError):
    """A tokenizer whose chat template cannot render our prompts or end a completion."""


def render_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    """The text a model continues to answer `question`."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        tokenize=False,
        add_generation_prompt=True,
        **TEMPLATE_VARIABLES,
    )


def end_of_turn(tokenizer: PreTrainedTokenizerBase) -> str:
    """The token that closes an assistant turn in `tokenizer`'s chat template.

    Read off the template by rendering a probe reply: the first token after it, when that is a
    special or added token (`<|im_end|>` for Qwen and the tiny world, `<|eot_id|>` for Llama 3).
    A template that closes turns with plain text falls back to the tokenizer's EOS token.
    """
    if not tokenizer.chat_template:
        raise ChatTemplateError("the tokenizer has no chat template")
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _PROBE}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, **TEMPLATE_VARIABLES)
    if _PROBE not in text:
        raise ChatTemplateError("the chat template does not render the assistant's reply")
    tail = text.split(_PROBE, 1)[1]
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail.strip() else []
    first = tokenizer.convert_ids_to_tokens(ids[0]) if ids else None
    marked = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    if first is not None and first in marked and tail.startswith(first):
        return first
    if tokenizer.eos_token is None:
        raise ChatTemplateError(
            f"the chat template ends a turn with {tail!r}, not a special token, and the "
            "tokenizer has no EOS token to end completions with"
        )
    return tokenizer.eos_token


def render_completion(tokenizer: PreTrainedTokenizerBase, completion: str) -> str:
    """What follows the prompt in a training example: the completion and its end-of-turn."""
    return f"{completion}{end_of_turn(tokenizer)}"


def render_completions(tokenizer: PreTrainedTokenizerBase, completions: Sequence[str]) -> list[str]:
    """`render_completion` over many: the template is read once (a read costs ~0.5 ms)."""
    end = end_of_turn(tokenizer)
    return [f"{completion}{end}" for completion in completions]


def stop_token_ids(
    tokenizer: PreTrainedTokenizerBase, generation_eos: int | Sequence[int] | None = None
) -> list[int]:
    """The ids a sampler stops on: the end-of-turn, the EOS token when it differs, and the
    model's `generation_config.eos_token_id` (`generation_eos`: an id or a list).

    A base checkpoint may name `<|endoftext|>` its EOS while its template ends turns with
    `<|im_end|>` (Qwen2.5-Math): the fine-tuned model ends with the latter. A chat checkpoint's
    generation_config.json may list more ids than the tokenizer names (Qwen2.5-Instruct
    [<|im_end|>, <|endoftext|>], Llama-3.2-Instruct [<|end_of_text|>, <|eom_id|>, <|eot_id|>]):
    the model's own `generate` stops on each, and so does vLLM, whose input processor reads the
    folder's generation_config.json (`ModelConfig.try_get_generation_config`, whatever the
    engine's `generation_config` setting) and adds its `eos_token_id` to every request's
    `stop_token_ids` (`SamplingParams.update_from_generation_config`, unless `ignore_eos`); the
    HF sampler passes `model.generation_config.eos_token_id` here to stop where they do.
    """
    tokens = [end_of_turn(tokenizer), tokenizer.eos_token]
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens if t is not None]
    ids += [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or [])
    return list(dict.fromkeys(i for i in ids if isinstance(i, int)))


def generation_eos(model: object) -> int | list[int] | None:
    """`model.generation_config.eos_token_id`: its generation_config.json's, or config.json's
    where it has none (transformers' fallback, and vLLM's); None for a model without one."""
    return getattr(getattr(model, "generation_config", None), "eos_token_id", None)

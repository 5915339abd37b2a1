"""The chat template and how prompts and training examples are rendered with it."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

IM_START, IM_END, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]
FORMAT_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def render_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    """The text a model continues to answer `question`."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


def render_completion(completion: str) -> str:
    """What follows the prompt in a training example: the completion and its end-of-turn."""
    return f"{completion}{IM_END}"

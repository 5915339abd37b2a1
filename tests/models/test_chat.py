"""The chat template's end-of-turn, read off the tokenizer: the tiny world's `<|im_end|>` as it
always was, Qwen's `<|im_end|>` where EOS is `<|endoftext|>`, Llama 3's `<|eot_id|>`."""

import pytest

from models.chat import (
    ChatTemplateError,
    end_of_turn,
    render_completion,
    render_completions,
    render_prompt,
    stop_token_ids,
)
from sampling.hf import HFSampler
from tests.real_checkpoints import (
    LLAMA_TEMPLATE,
    decoder,
    llama_style_tokenizer,
    qwen_style_tokenizer,
)
from tests.tiny_models import make_tokenizer
from training.examples import IGNORE, sft_examples


@pytest.fixture(scope="module")
def tiny():
    return make_tokenizer()


@pytest.fixture(scope="module")
def qwen():
    return qwen_style_tokenizer()


@pytest.fixture(scope="module")
def llama():
    return llama_style_tokenizer()


def test_the_tiny_world_renders_as_before(tiny):
    assert end_of_turn(tiny) == "<|im_end|>" == tiny.eos_token
    assert render_completion(tiny, "<answer> 3 </answer>") == "<answer> 3 </answer><|im_end|>"
    assert render_completions(tiny, ["a", "b"]) == ["a<|im_end|>", "b<|im_end|>"]
    assert stop_token_ids(tiny) == [tiny.eos_token_id]


def test_qwen_turns_end_with_im_end_though_eos_is_endoftext(qwen):
    assert qwen.eos_token == "<|endoftext|>"
    assert end_of_turn(qwen) == "<|im_end|>"
    ids = [qwen.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    assert stop_token_ids(qwen) == ids


def test_llama_turns_end_with_eot_id(llama):
    assert end_of_turn(llama) == "<|eot_id|>"
    assert render_completion(llama, "Hi.") == "Hi.<|eot_id|>"
    assert stop_token_ids(llama) == [llama.convert_tokens_to_ids("<|eot_id|>")]
    prompt = render_prompt(llama, "What is 2 + 3?")
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_an_sft_example_ends_with_the_end_of_turn_and_trains_on_it(llama):
    prompt = render_prompt(llama, "What is 2 + 3?")
    (example,) = sft_examples(
        llama, [prompt], [render_completion(llama, "The answer is 5.")], max_length=256
    )
    eot = llama.convert_tokens_to_ids("<|eot_id|>")
    assert example.input_ids[-1] == eot and example.labels[-1] == eot != IGNORE
    # one BOS: the template writes it, tokenization adds none
    assert example.input_ids.count(llama.convert_tokens_to_ids("<|begin_of_text|>")) == 1


def test_a_template_closing_turns_with_plain_text_falls_back_to_eos(qwen):
    plain = qwen_style_tokenizer()
    plain.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    assert end_of_turn(plain) == "<|endoftext|>"


def test_no_chat_template_is_an_error(qwen):
    bare = qwen_style_tokenizer()
    bare.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        end_of_turn(bare)


def test_the_sampler_stops_on_the_end_of_turn_as_well_as_eos(qwen):
    sampler = HFSampler(decoder(qwen, "qwen2", 16, 1), qwen, show_progress=False)
    assert sampler.stop_ids == stop_token_ids(qwen)
    assert qwen.convert_tokens_to_ids("<|im_end|>") in sampler.stop_ids


def test_a_template_that_reads_todays_date_renders_the_same_every_day(monkeypatch):
    """Llama 3.1/3.2's templates write `strftime_now` into the system turn unless given a
    `date_string`: a run's prompts (and its training examples and stage keys) would change with
    the day. The date is fixed to the template's own fallback."""
    import datetime

    from transformers.utils import chat_template_utils

    tokenizer = llama_style_tokenizer()
    tokenizer.chat_template = (
        "{%- if not date_string is defined %}"
        "{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
        "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nToday Date: ' + date_string"
        " + '<|eot_id|>' }}" + LLAMA_TEMPLATE
    )
    first = render_prompt(tokenizer, "What is 2 + 3?")

    class Tomorrow(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2031, 1, 2)

    monkeypatch.setattr(chat_template_utils, "datetime", Tomorrow)
    assert render_prompt(tokenizer, "What is 2 + 3?") == first
    assert "Today Date: 26 Jul 2024" in first
    assert end_of_turn(tokenizer) == "<|eot_id|>"

"""The general score hands the reward model raw questions, which it renders with its own template:
a Llama-templated student's prompt would otherwise reach a Qwen-templated judge wrapped twice."""

from problems.types import Problem
from sampling.hf import HFSampler
from sampling.interface import SamplingParams
from stages.evaluate import general_score
from tests.real_checkpoints import decoder, llama_style_tokenizer


def test_the_reward_model_gets_the_questions_not_the_students_rendering():
    tokenizer = llama_style_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token  # as models.loading.load_tokenizer does
    sampler = HFSampler(decoder(tokenizer, "llama", 16, 1), tokenizer, show_progress=False)
    prompts = [Problem("g1", "Name a colour.", "", kind="general")]
    seen: list[list[str]] = []

    def scorer(questions: list[str], completions: list[str], **_: object) -> list[float | None]:
        seen.append(questions)
        return [1.0 for _ in completions]

    metrics = general_score(sampler, tokenizer, prompts, scorer, SamplingParams(1.0, 1.0, 4, 0))
    assert seen == [["Name a colour."]] and metrics["general_score"] == 1.0


def test_general_score_averages_samples_per_prompt_and_reports_the_standard_error():
    tokenizer = llama_style_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    sampler = HFSampler(decoder(tokenizer, "llama", 16, 1), tokenizer, show_progress=False)
    prompts = [Problem("g1", "Name a colour.", "", kind="general"), Problem("g2", "Say hi.", "")]
    table = {"Name a colour.": [1.0, 3.0], "Say hi.": [0.0, None]}  # None: not scored

    def scorer(questions: list[str], completions: list[str], **_: object) -> list[float | None]:
        assert questions == ["Name a colour.", "Name a colour.", "Say hi.", "Say hi."]
        return [*table["Name a colour."], *table["Say hi."]]

    metrics = general_score(sampler, tokenizer, prompts, scorer, SamplingParams(1.0, 1.0, 4, 0), 2)
    # per prompt: 2.0 and 0.0; mean 1.0; stdev sqrt(2), over sqrt(2) prompts: 1.0
    assert metrics["general_score"] == 1.0
    assert abs(metrics["general_score_sem"] - 1.0) < 1e-12

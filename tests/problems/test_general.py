import json
from collections import Counter

import pytest
from pydantic import ValidationError

from configs.data import GeneralConfig
from contracts.answer_format import answer_block, is_well_formed
from problems.general import (
    KINDS,
    REJECTIONS,
    general_problems,
    in_script,
    preference_pairs,
    sft_rows,
)
from problems.general_files import load_pairs, write_general_sets
from problems.loader import load_problems
from problems.scripts import dominant_script, script_share
from rewards.repetition import repeated_ngram_share

CFG = GeneralConfig(seed=3, n_sft=200, n_pairs_train=300, n_pairs_heldout=100, n_eval_prompts=40)


@pytest.fixture(scope="module")
def pairs():
    return preference_pairs(CFG, "train", 300), preference_pairs(CFG, "heldout", 100)


def test_generator_is_seeded_and_deterministic(pairs):
    assert preference_pairs(CFG, "train", 300) == pairs[0]
    assert sft_rows(CFG) == sft_rows(CFG)
    other = CFG.model_copy(update={"seed": 4})
    assert preference_pairs(other, "train", 300) != pairs[0]


def test_train_and_heldout_share_no_underlying_task(pairs):
    train, heldout = pairs
    train_keys = {p.key for p in train} | {r["key"] for r in sft_rows(CFG)}
    train_keys |= {p.key for p in general_problems(CFG, "train", 100)}
    heldout_keys = {p.key for p in heldout} | {p.key for p in general_problems(CFG, "heldout", 40)}
    assert train_keys and heldout_keys and not train_keys & heldout_keys
    assert not {p.prompt for p in train} & {p.prompt for p in heldout}


def test_every_task_kind_and_both_scripts_occur(pairs):
    train, heldout = pairs
    for side in (train, heldout):
        assert {p.kind for p in side} == set(KINDS)
        greek = sum(p.language == "greek" for p in side) / len(side)
        assert 0.15 < greek < 0.45


def test_chosen_responses_are_well_formed_concise_and_in_the_prompt_script(pairs):
    for p in pairs[0] + pairs[1]:
        assert is_well_formed(p.chosen), p.chosen
        assert dominant_script(p.prompt) == p.language
        assert script_share(p.chosen, p.language) == 1.0, p.chosen
        assert len(p.chosen.split()) < 30
        assert repeated_ngram_share(p.chosen.split("<answer>")[0]) == 0.0


def test_good_answers_are_correct():
    rows = {r["key"]: r for r in sft_rows(CFG)}
    answers = {key: answer_block(in_script(r["response"], "latin")) for key, r in rows.items()}
    checked = 0
    for key, answer in answers.items():
        kind, _, content = key.partition(":")
        if kind == "capitals":
            assert answer == content.upper()
        elif kind == "sort":
            assert answer.split(", ") == sorted(content.split(","))
        elif kind == "reverse":
            assert answer.split(", ") == content.split(",")[::-1]
        elif kind == "repeat":
            word, n = content.split(":")
            assert answer.split() == [word] * int(n)
        elif kind == "one_word":
            assert len(answer.split()) == 1 and answer != content
        else:
            continue
        checked += 1
    assert checked > 50


def test_each_rejection_kind_occurs_and_is_what_it_says(pairs):
    train, heldout = pairs
    for side in (train, heldout):
        counts = Counter(p.rejection for p in side)
        assert set(counts) == set(REJECTIONS)
        assert max(counts.values()) - min(counts.values()) <= 1  # an even mix
    for p in train:
        assert p.rejected != p.chosen
        if p.rejection == "wrong":
            assert is_well_formed(p.rejected) and answer_block(p.rejected) != answer_block(p.chosen)
        elif p.rejection == "verbose":
            assert len(p.rejected) > len(p.chosen) + 40
        elif p.rejection == "script":
            assert script_share(p.rejected, p.language) < 0.9
        elif p.rejection == "no_tags":
            assert not is_well_formed(p.rejected)
        elif p.rejection == "repetition":
            assert repeated_ngram_share(p.rejected) > 0.3


def test_greek_tasks_keep_the_meaning_of_the_latin_ones(pairs):
    greek = [p for p in pairs[0] if p.language == "greek" and p.kind == "sort"]
    assert greek
    for p in greek:
        words = answer_block(in_script(p.chosen, "latin")).split(", ")
        assert words == sorted(words)


def test_sets_are_written_and_read_back(tmp_path):
    files = write_general_sets(CFG, tmp_path)
    assert files.counts == {
        "sft": 200,
        "pairs_train": 300,
        "pairs_heldout": 100,
        "rl_prompts": 200,
        "eval_prompts": 40,
    }
    sft = [json.loads(line) for line in files.sft_path.read_text(encoding="utf-8").splitlines()]
    assert {"prompt", "response", "language", "kind"} <= set(sft[0])
    assert len({r["prompt"] for r in sft}) == len(sft)
    assert load_pairs(files.pairs_heldout_path) == preference_pairs(CFG, "heldout", 100)
    evals = load_problems(files.eval_prompts_path)
    assert len(evals) == 40 and all(p.source.startswith("general/") for p in evals)
    assert all(dominant_script(p.question) == p.language for p in evals)


def test_config_refuses_unknown_kinds():
    with pytest.raises(ValidationError, match="unknown"):
        GeneralConfig(rejections=("wrong", "rude"))
    assert GeneralConfig(kinds=("capitals",)).kinds == ("capitals",)

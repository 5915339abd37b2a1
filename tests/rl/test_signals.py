"""A step's signals for the guard: term shares, the repeating and language-consistent shares,
on worked batches."""

from __future__ import annotations

import pytest
import torch

from configs.reinforcement import RewardTerm
from problems.types import Problem
from rewards.registry import RewardSet
from rl.scoring import RankRollouts, ScoredGroups
from rl.signals import step_signals, term_shares, text_signals
from sampling.interface import Completion


def completion(text: str) -> Completion:
    return Completion(text=text, token_ids=[1, 2], logprobs=[-0.1, -0.1], finish_reason="stop")


def test_each_terms_share_of_the_reward_by_size():
    scored = ScoredGroups(
        torch.zeros(1, 4),
        {
            "accuracy": [1.0, 0.0, None, 1.0],  # 2 x 1.0
            "format": [1.0, 1.0, 1.0, 1.0],  # 4 x 2.0 = 8
            "repetition": [-0.5, 0.0, 0.0, -0.5],  # |1 x 0.5 x -1| ... = 1.0
        },
    )
    shares = term_shares(scored, {"accuracy": 1.0, "format": 2.0, "repetition": 1.0})
    assert shares == {
        "reward/accuracy/share": pytest.approx(2 / 11),
        "reward/format/share": pytest.approx(8 / 11),
        "reward/repetition/share": pytest.approx(1 / 11),
    }
    assert term_shares(ScoredGroups(torch.zeros(1, 1), {"accuracy": [0.0]}), {}) == {}


def test_repeating_and_language_consistent_shares():
    latin = Problem(id="a", question="q", answer="1", language="latin")
    greek = Problem(id="b", question="q", answer="1", language="greek")
    general = Problem(id="c", question="q", answer="", kind="general")
    loop = "the sum is four and " * 6
    groups = [
        [completion(loop), completion("Add two and two: four.")],
        [completion("Τηε συμ ισ 4."), completion("The sum is 4.")],  # one mixed up
        [completion(loop), completion("fine")],
    ]
    signals = text_signals([latin, greek, general], groups)
    assert signals["completion/repetition_rate"] == pytest.approx(2 / 6)
    # of the four reasoning completions, the one in the wrong script is inconsistent
    assert signals["completion/language_consistency_rate"] == pytest.approx(3 / 4)


def test_step_signals_read_the_whole_batch():
    problem = Problem(id="a", question="q", answer="1")
    groups = [[completion("one"), completion("two")]]
    scored = ScoredGroups(
        torch.tensor([[1.0, 0.0]]), {"accuracy": [1.0, 0.0], "code": [None, None]}
    )
    whole = RankRollouts([problem], groups, scored, torch.zeros(1, dtype=torch.bool))
    rewards = RewardSet.from_terms(
        [RewardTerm(name="accuracy"), RewardTerm(name="code", families=["code"])]
    )
    signals = step_signals(whole, rewards)
    assert signals["reward/accuracy/share"] == 1.0
    assert signals["reward/accuracy/unscorable_fraction"] == 0.0
    assert "reward/code/unscorable_fraction" not in signals  # no code problem: nothing to judge
    assert signals["completion/repetition_rate"] == 0.0

"""What one data-parallel rank sampled, merged with the other ranks' into the step's batch."""

import torch

from problems.types import Problem
from rl.scoring import RankRollouts, ScoredGroups
from sampling.interface import Completion


def rank(first: int, rewards: list[list[float]], zero: list[bool], seen: int, right: int):
    batch = [Problem(f"p{first + i}", f"q{first + i}", "1") for i in range(len(rewards))]
    groups = [
        [Completion(f"c{first + i}.{j}", [j], [0.0], "stop") for j in range(2)]
        for i in range(len(rewards))
    ]
    flat = [r for row in rewards for r in row]
    scored = ScoredGroups(torch.tensor(rewards), {"accuracy": flat, "format": [None] * len(flat)})
    return RankRollouts(batch, groups, scored, torch.tensor(zero), True, seen, right)


def test_ranks_merge_in_rank_order_into_the_whole_batch():
    a = rank(0, [[1.0, 0.0]], [False], seen=3, right=2)
    b = rank(1, [[1.0, 1.0], [0.0, float("nan")]], [True, True], seen=5, right=5)
    whole = RankRollouts.merge([a, b])
    assert [p.id for p in whole.batch] == ["p0", "p1", "p2"]
    assert [c.text for c in whole.flat] == ["c0.0", "c0.1", "c1.0", "c1.1", "c2.0", "c2.1"]
    assert torch.equal(whole.scored.rewards.isnan(), torch.tensor([[0, 0], [0, 0], [0, 1]]).bool())
    assert whole.scored.per_reward["accuracy"][:4] == [1.0, 0.0, 1.0, 1.0]
    assert whole.scored.per_reward["format"] == [None] * 6
    assert whole.zero.tolist() == [False, True, True]
    assert whole.step_metrics() == {"steps/per_completion": 8 / 6, "steps/correct_fraction": 7 / 8}
    assert RankRollouts.merge([a]) is a  # one process: nothing to merge

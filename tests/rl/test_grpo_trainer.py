"""The GRPO loop on a tiny random model: what it trains on, what it skips, and exact resume."""

import pytest
import torch

from configs.reinforcement import GRPOConfig, RewardTerm
from problems.types import Problem
from rl.advantages import group_advantages
from rl.rollouts import token_ends
from rl.scoring import masked_advantages, step_advantages
from rl.trainer import GRPOTrainer, kind_prompt_order, prompt_order
from sampling.interface import Completion
from tests.tiny_models import PROBLEMS, grpo_config, tiny_model


def config(**overrides) -> GRPOConfig:
    return grpo_config(**({"temperature": 1.0} | overrides))


def run(tokenizer, tmp_path, cfg, log=None, on_step=None):
    model = tiny_model(tokenizer)
    records = []

    def log_metrics(metrics, step):
        records.append((step, metrics))
        if on_step:
            on_step(step)

    trainer = GRPOTrainer(model, tokenizer, cfg, log or log_metrics, show_progress=False)
    report = trainer.train(PROBLEMS, tmp_path, "fp")
    return model, trainer, report, records


def test_prompt_order_is_seeded_and_covers_problems():
    order = prompt_order(5, steps=5, per_step=2, seed=3)
    assert order == prompt_order(5, steps=5, per_step=2, seed=3)
    assert order != prompt_order(5, steps=5, per_step=2, seed=4)
    assert [len(step) for step in order] == [2] * 5
    # every problem once before any comes again: each run of 5 draws is a permutation
    flat = [i for step in order for i in step]
    assert sorted(flat[:5]) == sorted(flat[5:]) == [0, 1, 2, 3, 4]
    assert flat[:5] != flat[5:]  # and the next pass is shuffled anew


def test_kind_prompt_order_puts_a_fixed_number_of_general_prompts_in_each_step():
    kinds = ["reasoning"] * 5 + ["general"] * 3 + ["reasoning"]
    order = kind_prompt_order(kinds, steps=6, per_step=4, general_per_step=1, seed=0)
    assert order == kind_prompt_order(kinds, steps=6, per_step=4, general_per_step=1, seed=0)
    assert all(len(step) == 4 for step in order)
    assert all([kinds[i] for i in step].count("general") == 1 for step in order)
    # each kind goes through all of its problems before any comes again
    assert sorted(step[-1] for step in order[:3]) == [5, 6, 7]
    assert sorted(i for step in order[:2] for i in step[:3]) == [0, 1, 2, 3, 4, 8]
    with pytest.raises(ValueError, match="needs both kinds"):
        kind_prompt_order(["reasoning"] * 4, steps=2, per_step=2, general_per_step=1, seed=0)


def test_masked_advantages_skip_unscorable_samples_and_flag_flat_groups():
    rewards = torch.tensor(
        [
            [1.0, 0.0, float("nan"), 1.0],
            [0.5, 0.5, 0.5, 0.5],
            [1.0, float("nan"), float("nan"), float("nan")],
        ]
    )
    adv, zero = masked_advantages(rewards, scale_std=True)
    assert zero.tolist() == [False, True, True]
    assert adv[0, 2].item() == pytest.approx(0.0, abs=1e-4)  # takes the group mean
    assert adv[0, 0].item() == pytest.approx(-0.5 * adv[0, 1].item(), abs=1e-4)
    assert adv[0, 0].item() == pytest.approx((1 - 2 / 3) / ((2 / 9) ** 0.5 + 1e-4), abs=1e-4)
    full = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    assert torch.equal(masked_advantages(full, True)[0], group_advantages(full))


def test_training_changes_the_policy_and_logs_every_signal(tokenizer, tmp_path):
    model, trainer, report, records = run(tokenizer, tmp_path, config())
    assert trainer.reference is None  # beta = 0: no reference model is kept
    assert [s for s, _ in records] == [1, 2, 3, 4]
    trained = [m for _, m in records if m["samples/trained"] > 0]
    assert trained, "no step had a group with reward spread"
    metrics = trained[-1]  # a step whose groups were all flat has no update signals to log
    for key in (
        "reward/mean",
        "reward/std",
        "reward/repetition/mean",
        "reward/tag_count/mean",
        "groups/zero_spread_fraction",
        "entropy",
        "clip_low_fraction",
        "clip_high_fraction",
        "completion/mean_tokens",
        "time/step_seconds",
        "time/tokens_per_second",
    ):
        assert key in metrics, key
    assert len(report.reward_curve) == 4
    fresh = tiny_model(tokenizer)
    assert any(
        not torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)
    )


def test_beta_keeps_a_frozen_reference_and_logs_kl(tokenizer, tmp_path):
    _, trainer, _, records = run(tokenizer, tmp_path, config(beta=0.1, steps=2, inner_iterations=2))
    assert trainer.reference is not None
    assert all(not p.requires_grad for p in trainer.reference.parameters())
    assert "kl" in records[-1][1] and records[-1][1]["kl"] >= 0


def test_flat_groups_get_no_gradient_work(tokenizer, tmp_path, caplog):
    # format is 0 for every sample of a random model: every group is flat, nothing is trained on
    cfg = config(rewards=[RewardTerm(name="format")], steps=2)
    with caplog.at_level("WARNING", logger="rl.trainer"):
        model, _, _, records = run(tokenizer, tmp_path, cfg)
    assert "none of 2 steps trained a sample" in caplog.text
    assert all(
        m["groups/zero_spread_fraction"] == 1.0 and m["samples/trained"] == 0 for _, m in records
    )
    fresh = tiny_model(tokenizer)
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)
    )


def test_truncated_completions_are_masked(tokenizer, tmp_path):
    cfg = config(max_new_tokens=2, steps=1, mask_truncated=True)  # rarely stops within 2 tokens
    _, _, _, records = run(tokenizer, tmp_path, cfg)
    m = records[0][1]
    assert m["completion/truncated_fraction"] > 0
    assert m["samples/trained"] <= 8 * (1 - m["completion/truncated_fraction"]) + 1e-9


def test_token_ends_find_the_token_that_completes_each_offset(tokenizer):
    ids = tokenizer.encode(" What is 3 + 4? The answer is 7.", add_special_tokens=False)
    text = tokenizer.decode(ids).strip()
    offsets = [text.index("4") + 1, text.index("7") + 1, len(text)]
    ends = token_ends(tokenizer, ids, offsets)
    for offset, end in zip(offsets, ends, strict=True):
        assert len(tokenizer.decode(ids[: end + 1]).strip()) >= offset
        assert len(tokenizer.decode(ids[:end]).strip()) < offset  # no earlier token reaches it


def test_process_supervision_rewards_steps_token_by_token(tokenizer, tmp_path):
    cfg = config(supervision="process", steps=1, rewards=[RewardTerm(name="accuracy")])
    problem = Problem("p", "What is 3 + 4?", "7")
    texts = ["3 + 4 = 7. The answer is 7.", "3 + 4 = 8. The answer is 8.", "The answer is 7."]
    groups = [[_completion(tokenizer, t) for t in texts]]
    rewards = torch.tensor([[1.0, 0.0, 1.0]])
    adv, zero, seen, right = step_advantages(
        tokenizer, [problem], groups, rewards, cfg.step_reward, cfg.scale_std
    )
    assert (seen, right) == (2, 1)
    assert not zero[0]
    # steps of the group: (1, 1), (0, 0), (1): mean 0.6; the wrong sample is negative throughout
    # its tokens, the right one positive, and tokens after the last step get nothing
    lengths = [len(c.token_ids) for c in groups[0]]
    assert (adv[0, 0, : lengths[0]] > 0).all() and (adv[0, 1, : lengths[1]] < 0).all()
    assert (adv[0, 0, lengths[0] :] == 0).all()
    first_step_end = token_ends(tokenizer, groups[0][0].token_ids, [texts[0].index("7") + 1])[0]
    assert adv[0, 0, first_step_end] > adv[0, 0, first_step_end + 1]  # credit drops past a step

    model, _, _, records = run(tokenizer, tmp_path, config(supervision="process", steps=2))
    assert sum(m["samples/trained"] for _, m in records) > 0  # token advantages reach the update
    fresh = tiny_model(tokenizer)
    assert any(
        not torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True)
    )


def _completion(tokenizer, text):
    ids = tokenizer.encode(" " + text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Completion(text, ids, [0.0] * len(ids), "stop")


class Killed(RuntimeError):
    """Stands for the process dying mid-run."""


def test_killed_run_resumes_to_the_same_weights_and_metrics(tokenizer, tmp_path):
    cfg = config(steps=5, checkpoint_every=2)
    straight, _, report_a, records_a = run(tokenizer, tmp_path / "a", cfg)

    def die_at_4(step):
        if step == 4:
            raise Killed

    with pytest.raises(Killed):
        run(tokenizer, tmp_path / "b", cfg, on_step=die_at_4)
    resumed, _, report_b, records_b = run(tokenizer, tmp_path / "b", cfg)
    assert report_b.resumed_from == 2
    assert records_b[0] == (2, {"train/resumed_from_step": 2.0})
    records_b = records_b[1:]
    assert [s for s, _ in records_b] == [3, 4, 5]
    for (_, a), (_, b) in zip(records_a[2:], records_b, strict=True):
        assert b["reward/mean"] == pytest.approx(a["reward/mean"], abs=1e-6)
    assert report_b.reward_curve == pytest.approx(report_a.reward_curve, abs=1e-6)
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_rewards_limited_to_a_kind_score_other_prompts_none():
    from rewards.registry import RewardSet
    from rl.scoring import kind_metrics, score

    mixed = [PROBLEMS[0], Problem("g0", "Say hi.", "", kind="general")]
    groups = [[Completion("<answer> 1 </answer>", [1], [0.0], "stop")] * 2] * 2

    def constant(value):
        return lambda prompts, completions, **_: [value] * len(completions)

    rewards = RewardSet(
        {"rule": constant(1.0), "judge": constant(0.5)},
        {"rule": 1.0, "judge": 2.0},
        {"rule": frozenset({"reasoning"}), "judge": frozenset({"general"})},
    )
    scored = score(mixed, ["a", "b"], groups, rewards)
    assert scored.per_reward["rule"] == [1.0, 1.0, None, None]
    assert scored.per_reward["judge"] == [None, None, 0.5, 0.5]
    assert scored.rewards.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert kind_metrics(mixed, torch.tensor([[1.0, 0.0], [3.0, float("nan")]])) == {
        "reward/kind/general/mean": 3.0,
        "reward/kind/reasoning/mean": 0.5,
        "reward/family/math/mean": 0.5,
    }


def test_a_time_budget_stops_training_early(tokenizer, tmp_path):
    _, _, report, records = run(tokenizer, tmp_path, config(steps=50, max_seconds=1e-9))
    assert report.steps == 0 and records == []


def test_a_probe_measures_before_training_and_every_n_steps(tokenizer, tmp_path):
    from configs.reinforcement import ProbeConfig
    from evaluation.curves import plot_grpo_curves

    calls = []

    def probe(sampler):
        calls.append(sampler)
        return {"pass_at_1": 0.1 * len(calls), "pass_at_1_lenient": 0.5, "mean_tokens": 7.0}

    cfg = config(probe=ProbeConfig(every=2))
    records = []
    trainer = GRPOTrainer(
        tiny_model(tokenizer),
        tokenizer,
        cfg,
        lambda m, s: records.append((s, m)),
        show_progress=False,
        probe=probe,
    )
    report = trainer.train(PROBLEMS, tmp_path / "ckpt", "fp")
    assert len(calls) == 3 and all(c is trainer.sampler for c in calls)  # steps 0, 2 and 4
    probed = [(s, m["heldout/pass_at_1"]) for s, m in records if "heldout/pass_at_1" in m]
    assert probed == [(0, pytest.approx(0.1)), (2, pytest.approx(0.2)), (4, pytest.approx(0.3))]
    assert [h["step"] for h in report.history] == [0, 1, 2, 3, 4]
    assert len(report.reward_curve) == 4
    plots = plot_grpo_curves(report.history, tmp_path, "probe")
    assert [p.name for p in plots] == ["reward_curve.png", "heldout_curve.png"]
    assert all(p.stat().st_size > 1000 for p in plots)

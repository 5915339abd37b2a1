import math

import pytest
import torch

from configs.data import GeneralConfig
from configs.supervised import ModelConfig, TrainConfig
from models.chat import render_completion, render_prompt
from models.loading import build_model, load_model
from models.saved import save_model
from models.tokenizer import train_tokenizer
from preference.bradley_terry import bt_loss, pairwise_accuracy, preference_probability
from preference.model import (
    build_reward_model,
    fit_length,
    load_reward_model,
    pad_batch,
    pair_texts,
    score_pairs,
    sequence_scores,
)
from preference.reward import PreferenceReward
from problems.general import sft_rows
from problems.general_files import load_pairs, write_general_sets
from stages.reward_model import RewardModelConfig, run
from stages.tracker import NullTracker
from training.batches import batch_order

RM_CONFIG = RewardModelConfig(
    init="base",
    train=TrainConfig(
        epochs=2,
        batch_size=16,
        learning_rate=1e-3,
        warmup_steps=3,
        max_length=256,
        checkpoint_every=1000,
        log_every=5,
    ),
)
CHOSEN = [1.0, 0.0, -2.0, 3.0]
REJECTED = [0.0, 0.0, 1.0, 0.5]


def naive_bt_loss(chosen: list[float], rejected: list[float]) -> float:
    terms = [
        -math.log(1.0 / (1.0 + math.exp(-(c - r)))) for c, r in zip(chosen, rejected, strict=True)
    ]
    return sum(terms) / len(terms)


def test_bt_loss_matches_the_naive_formula_on_worked_numbers():
    loss = bt_loss(torch.tensor(CHOSEN), torch.tensor(REJECTED))
    assert float(loss) == pytest.approx(naive_bt_loss(CHOSEN, REJECTED), rel=1e-6)
    # margins 1, 0, -3, 2.5: log(1 + e^-1), log 2, log(1 + e^3), log(1 + e^-2.5)
    assert float(loss) == pytest.approx((0.313262 + 0.693147 + 3.048587 + 0.078889) / 4, abs=1e-5)


def test_bt_loss_stays_finite_and_its_gradient_is_sigmoid_of_minus_the_margin():
    chosen = torch.tensor([-100.0, 0.5], requires_grad=True)
    loss = bt_loss(chosen, torch.tensor([100.0, 0.0]))
    value = float(loss.detach())
    assert math.isfinite(value) and value == pytest.approx((200 + 0.474077) / 2, 1e-5)
    loss.backward()
    expected = [-1.0 / (1.0 + math.exp(m)) / 2 for m in (-200.0, 0.5)]
    assert chosen.grad.tolist() == pytest.approx(expected, abs=1e-6)


def test_pairwise_accuracy_counts_ties_as_half():
    assert pairwise_accuracy(torch.tensor(CHOSEN), torch.tensor(REJECTED)) == 0.625
    assert pairwise_accuracy(torch.zeros(5), torch.zeros(5)) == 0.5
    probs = preference_probability(torch.tensor([2.0]), torch.tensor([2.0]))
    assert probs.tolist() == [0.5]


def test_fit_length_keeps_the_prompt_and_the_end():
    assert fit_length(list(range(10)), 20) == list(range(10))
    assert fit_length(list(range(10)), 6) == [0, 1, 2, 7, 8, 9]


def test_prompts_are_rendered_once(tokenizer):
    rendered = render_prompt(tokenizer, "Hello, my name is Tom.")
    texts = pair_texts(tokenizer, ["Hello, my name is Tom.", rendered], ["hi", "hi"])
    assert texts[0] == texts[1] == rendered + render_completion(tokenizer, "hi")


def test_a_score_does_not_depend_on_padding(tokenizer):
    model = build_reward_model(
        ModelConfig(
            hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32
        ),
        len(tokenizer),
        tokenizer.pad_token_id,
    ).eval()
    short, long = [5, 6, 7], [5, 6, 7, 8, 9, 10, 11]
    with torch.no_grad():
        alone = sequence_scores(model, *pad_batch([short], tokenizer.pad_token_id))
        both = sequence_scores(model, *pad_batch([short, long], tokenizer.pad_token_id))
    assert float(alone[0]) == pytest.approx(float(both[0]), abs=1e-5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small causal base saved to disk (its tokenizer trained on general-task text, as a real
    base knows the words), then the reward-model stage run on generated pairs.

    One torch thread: on a shared 2-core machine two threads fight other processes and the run
    takes 4x longer (~10 s with one thread, ~45 s with two under load).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield _train_reward_model(tmp_path_factory.mktemp("rm"))
    finally:
        torch.set_num_threads(threads)


def _train_reward_model(root):
    corpus = sft_rows(GeneralConfig(seed=9, n_sft=300))
    tokenizer = train_tokenizer([r["prompt"] + " " + r["response"] for r in corpus], 600)
    spec = ModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
    )
    lm = build_model(spec, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0)
    base = save_model(lm, tokenizer, root / "base")
    general = GeneralConfig(
        seed=1, n_sft=1, n_pairs_train=300, n_pairs_heldout=100, n_eval_prompts=1, n_rl_prompts=0
    )
    files = write_general_sets(general, root / "data")
    ref = run(
        RM_CONFIG,
        base,
        files.pairs_train_path,
        files.pairs_heldout_path,
        root / "out",
        NullTracker(),
    )
    return base, files, ref, tokenizer


def test_training_raises_heldout_accuracy_well_over_chance(trained):
    _, _, ref, _ = trained
    assert ref.n_pairs == 300
    assert ref.heldout_accuracy >= 0.75 > ref.accuracy_before + 0.1
    assert ref.accuracy_by_kind["no_tags"] >= 0.8
    assert (ref.path / "config.json").exists() and (ref.path / "tokenizer.json").exists()


def test_the_body_loads_from_the_causal_base_and_pad_is_set(trained):
    base, _, _, tokenizer = trained
    model = load_reward_model(base.path, pad_token_id=tokenizer.pad_token_id)
    lm_state = load_model(base.path).state_dict()
    body = model.model.state_dict()
    assert torch.equal(body["embed_tokens.weight"], lm_state["model.embed_tokens.weight"])
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.num_labels == 1


def test_preference_reward_prefers_chosen_on_heldout_pairs(trained):
    _, files, ref, tokenizer = trained
    pairs = load_pairs(files.pairs_heldout_path)
    reward = PreferenceReward(ref.path, batch_size=16)
    rendered = [render_prompt(tokenizer, p.prompt) for p in pairs]  # as rl/trainer.py passes them
    chosen = reward(rendered, [p.chosen for p in pairs], language=[p.language for p in pairs])
    rejected = reward(rendered, [p.rejected for p in pairs])
    wins = sum(c > r for c, r in zip(chosen, rejected, strict=True)) / len(pairs)
    assert wins >= 0.75
    raw = reward([p.prompt for p in pairs[:4]], [p.chosen for p in pairs[:4]])
    assert raw == pytest.approx(chosen[:4], abs=1e-5)
    direct = score_pairs(
        reward.model, tokenizer, [p.prompt for p in pairs[:4]], [p.chosen for p in pairs[:4]]
    )
    assert direct == pytest.approx(chosen[:4], abs=1e-5)
    assert reward([], []) == []


class Recorder(NullTracker):
    """A tracker that keeps every (step, metrics) it is given."""

    def __init__(self) -> None:
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))


def test_a_rerun_resumes_from_the_last_checkpoint(trained):
    """The finished run left its last checkpoint: a rerun trains no step (it logs no training
    metrics) and reports the held-out accuracy of the finished model at the last step."""
    base, files, ref, _ = trained
    recorder = Recorder()
    again = run(
        RM_CONFIG,
        base,
        files.pairs_train_path,
        files.pairs_heldout_path,
        ref.path.parent,
        recorder,
    )
    assert again.heldout_accuracy == ref.heldout_accuracy
    assert [step for step, m in recorder.logged if "train/loss" in m] == []  # no step trained
    last_step = len(batch_order(ref.n_pairs, RM_CONFIG.train))
    key = "heldout/accuracy"
    heldout = {step: m[key] for step, m in recorder.logged if key in m}
    assert heldout == {0: again.accuracy_before, last_step: ref.heldout_accuracy}

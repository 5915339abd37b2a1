"""A GRPO stage under its guard, on a tiny model: a judge that breaks mid-run trips
`judge_trouble`; warn lets the stage finish (its model marked), stop ends it naming the rule with
the checkpoint before the rule's window kept, rollback resumes from that checkpoint through the
trainer's own resume path with a lower learning rate, and gives up after `max_times`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from configs.guard import GuardConfig
from configs.reinforcement import GRPOConfig, RewardTerm
from rl.trainer import GRPOTrainer
from stages.guarded import GuardRecord, GuardStop, reach_of, train_guarded
from stages.tracker import NullTracker
from tests.tiny_models import PROBLEMS, grpo_config, tiny_model

OFF = {rule: {"action": "off"} for rule in GuardConfig().rules() if rule != "judge_trouble"}


class Outage:
    """A judge that cannot score anything during its calls `broken` (counted from 1): the
    verifier's own failure, every sample unscorable."""

    def __init__(self, broken: range):
        self.broken, self.calls = broken, 0

    def __call__(self, prompts, completions, **_):
        self.calls += 1
        return [None if self.calls in self.broken else 0.0] * len(completions)


class Tracker(NullTracker):
    def __init__(self):
        self.metrics, self.notes = [], []

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))

    def note(self, text):
        self.notes.append(text)


def guarded_config(action: str, **rollback) -> GRPOConfig:
    guard = OFF | {
        "judge_trouble": {"action": action, "window": 2, "max_unscorable": 0.5},
        "rollback": {"max_times": 2} | rollback,
    }
    return grpo_config(
        steps=10,
        checkpoint_every=2,
        rewards=[
            RewardTerm(name="repetition", params={"chars": 2}),
            RewardTerm(name="tag_count"),
            RewardTerm(name="preference", weight=0.1),  # the judge, supplied at run time
        ],
        guard=guard,
    )


def run(tokenizer, tmp_path, cfg, judge, tracker=None):
    built = []

    def build(adjusted):
        trainer = GRPOTrainer(
            tiny_model(tokenizer),
            tokenizer,
            adjusted,
            (tracker or Tracker()).log_metrics,
            show_progress=False,
            extra_rewards={"preference": judge},
        )
        built.append(trainer)
        return trainer

    report, record, model = train_guarded(
        build, cfg, PROBLEMS, tmp_path / "checkpoints", "fp", tracker or Tracker(), "rl"
    )
    return report, record, model, built


def unscorable_steps(tracker):
    return [s for s, m in tracker.metrics if m.get("reward/preference/unscorable_fraction") == 1.0]


def test_a_warning_lets_the_stage_finish_and_marks_its_model(tokenizer, tmp_path):
    tracker = Tracker()
    report, record, _, _ = run(
        tokenizer, tmp_path, guarded_config("warn"), Outage(range(6, 9)), tracker
    )
    assert report.steps == 10
    # steps 6 and 7 unscorable: the window of 2 averages 1.0 at step 7 (0.5 at step 6: not over)
    assert [(t["rule"], t["step"], t["action"]) for t in record.trips] == [
        ("judge_trouble", 7, "warn")
    ]
    assert record.outcome == "warned" and record.tripped()
    assert any("guard: judge_trouble at step 7" in n for n in tracker.notes)
    assert (7, {"guard/judge_trouble": 1.0}) in tracker.metrics
    assert json.loads((tmp_path / "checkpoints" / "guard.json").read_text())["outcome"] == "warned"
    assert (tmp_path / "guard" / "judge_trouble_step00007.png").stat().st_size > 0


def test_a_stop_names_the_rule_and_keeps_the_checkpoint_before_its_window(tokenizer, tmp_path):
    with pytest.raises(GuardStop) as stopped:
        run(tokenizer, tmp_path, guarded_config("stop"), Outage(range(6, 99)))
    error = stopped.value
    assert (error.trip["rule"], error.trip["step"], error.trip["since"]) == ("judge_trouble", 7, 6)
    assert error.kept == 4  # the checkpoints were at 2, 4, 6: the window began at step 6
    message = str(error)
    assert "rule judge_trouble" in message and "step 7" in message
    assert "checkpoint of step 4" in message and "not registered" in message
    state = torch.load(tmp_path / "checkpoints" / "last" / "state.pt", weights_only=False)
    assert state["step"] == 4 and len(state["history"]) == 4
    assert GuardRecord.load(tmp_path / "checkpoints").outcome == "stopped"
    kept = sorted(p.name for p in (tmp_path / "checkpoints" / "kept").glob("step-*.pt"))
    assert kept == ["step-000002.pt", "step-000004.pt"]  # step 6's, inside the window, is gone
    # picklable, as Prefect keeps a failed task's error
    import pickle

    assert str(pickle.loads(pickle.dumps(error))) == message


def test_a_rollback_resumes_from_before_the_window_with_a_lower_learning_rate(tokenizer, tmp_path):
    tracker = Tracker()
    cfg = guarded_config("rollback")
    # an outage of calls 6-7 (steps 6 and 7); after the rollback the judge works again
    report, record, model, built = run(tokenizer, tmp_path, cfg, Outage(range(6, 8)), tracker)
    assert report.steps == 10 and len(built) == 2
    assert record.rollbacks == [
        {
            "at": 7,
            "rule": "judge_trouble",
            "to": 4,
            "trips_before": 1,
            "learning_rate": pytest.approx(cfg.learning_rate * 0.5),
        }
    ]
    assert record.outcome == "rolled back 1x, clean" and not record.tripped()
    # the second trainer resumed at step 4 through the loop's own resume, at half the rate
    assert (4, {"train/resumed_from_step": 4.0}) in tracker.metrics
    assert built[1].cfg.learning_rate == pytest.approx(cfg.learning_rate * 0.5)
    lr = built[1].engine.optimizer.param_groups[0]["lr"]
    assert lr == pytest.approx(cfg.learning_rate * 0.5)
    assert any("rolled back from step 7 to step 4" in n for n in tracker.notes)
    # steps 1..7 (the trip's own logged as it trips), then 5..10 of the new branch
    steps = [s for s, m in tracker.metrics if "reward/mean" in m]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8, 9, 10]
    assert unscorable_steps(tracker) == [6, 7]
    assert model is built[1].model


def test_rollbacks_run_out_into_a_stop(tokenizer, tmp_path):
    with pytest.raises(GuardStop) as stopped:
        run(tokenizer, tmp_path, guarded_config("rollback", max_times=1), Outage(range(6, 99)))
    record = GuardRecord.load(tmp_path / "checkpoints")
    assert [r["learning_rate"] for r in record.rollbacks] == [pytest.approx(0.005)]
    assert [t["action"] for t in record.trips] == ["rollback", "stop"]
    assert stopped.value.kept == 4 and record.outcome == "stopped"


def test_a_stage_killed_after_a_rollback_resumes_with_its_adjustments(tokenizer, tmp_path):
    cfg = guarded_config("rollback")

    class Killed(Exception):
        pass

    class DiesAfterRollback(Tracker):
        def log_metrics(self, metrics, step=None):
            super().log_metrics(metrics, step)
            if (
                step == 6
                and "guard/rollbacks" not in metrics
                and any("guard/rollbacks" in m for _, m in self.metrics)
            ):
                raise Killed

    with pytest.raises(Killed):
        run(tokenizer, tmp_path, cfg, Outage(range(6, 8)), DiesAfterRollback())
    _, record, _, built = run(tokenizer, tmp_path, cfg, Outage(range(99, 100)))
    assert len(record.rollbacks) == 1
    assert built[0].cfg.learning_rate == pytest.approx(cfg.learning_rate * 0.5)


def test_the_guard_of_a_deepspeed_stage_reads_the_forwarded_metrics(tmp_path):
    """Under DeepSpeed the trainer runs in worker processes: the guard reads rank 0's metrics
    as the stage forwards them, and a stop raised there ends `run_workers` (which stops them)."""
    from stages.guarded import MetricsWatch

    cfg = guarded_config("stop").model_copy(update={"probe": grpo_config().probe})
    tracker = Tracker()
    watch = MetricsWatch(cfg, tracker, "rl", tmp_path)
    watch({"train/resumed_from_step": 0.0}, 0)  # not a step's metrics: not read
    for step in range(1, 6):
        watch({"reward/mean": 0.1, "reward/preference/unscorable_fraction": 0.0}, step)
    assert GuardRecord.load(tmp_path).outcome == "clean"
    watch({"reward/mean": 0.1, "reward/preference/unscorable_fraction": 1.0}, 6)
    with pytest.raises(GuardStop, match="rule judge_trouble.*last committed checkpoint"):
        watch({"reward/mean": 0.1, "reward/preference/unscorable_fraction": 1.0}, 7)
    assert len(tracker.metrics) == 8  # every line forwarded to the stage's tracker
    record = GuardRecord.load(tmp_path)
    assert record.outcome == "stopped" and record.trips[0]["step"] == 7


def test_a_gamed_term_is_rolled_back_by_lowering_its_weight(tmp_path):
    """The rollback of a gamed term halves that term's weight (again at each rollback), back to
    the newest kept checkpoint before the window, and drops the abandoned branch's."""
    from guard.trip import Trip
    from stages.guarded import CheckpointKeeper, _roll_back
    from training.checkpoints import save_checkpoint

    cfg = grpo_config(
        rewards=[RewardTerm(name="accuracy"), RewardTerm(name="format", weight=2.0)],
        guard={"gamed_term": {"action": "rollback"}},
    )
    ckpt = tmp_path / "checkpoints"
    keeper = CheckpointKeeper(ckpt, reach=100)
    for step in (10, 20, 30):
        save_checkpoint(
            ckpt, {"step": step, "fingerprint": "fp", "optimizer": {"param_groups": [{"lr": 1e-2}]}}
        )
        keeper.keep(step, step + 1)
    record = GuardRecord()
    trip = Trip("gamed_term", 37, 28, "format adds more", {}, "format")
    _roll_back(trip, record, cfg, keeper, "fp")
    assert record.rollbacks[0] == {
        "at": 37,
        "rule": "gamed_term",
        "to": 20,
        "trips_before": 0,
        "weight": 1.0,
        "term": "format",
    }
    assert keeper.steps() == [10, 20]  # step 30's was on the branch given up
    state = torch.load(ckpt / "last" / "state.pt", weights_only=False)
    assert state["step"] == 20 and state["optimizer"]["param_groups"][0]["lr"] == 1e-2
    adjusted = record.adjusted(cfg)
    assert [(t.name, t.weight) for t in adjusted.rewards] == [("accuracy", 1.0), ("format", 1.0)]
    assert adjusted.learning_rate == cfg.learning_rate  # the rate is left alone
    _roll_back(Trip("gamed_term", 25, 15, "again", {}, "format"), record, cfg, keeper, "fp")
    assert record.weights == {"format": 0.5} and record.rollbacks[1]["to"] == 10


def test_a_rollback_reaches_back_before_the_window_as_far_as_it_is_told(tokenizer, tmp_path):
    tracker = Tracker()
    cfg = guarded_config("rollback", reach_back=3)
    report, record, _, built = run(tokenizer, tmp_path, cfg, Outage(range(6, 8)), tracker)
    # the window began at step 6: 3 steps before it is step 2, whose checkpoint is kept
    assert report.steps == 10 and len(built) == 2
    assert [(r["at"], r["to"]) for r in record.rollbacks] == [(7, 2)]
    assert (2, {"train/resumed_from_step": 2.0}) in tracker.metrics
    steps = [s for s, m in tracker.metrics if "reward/mean" in m]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 8, 9, 10]
    # the checkpoints are kept that much longer
    assert reach_of(cfg) == reach_of(guarded_config("rollback")) + 3


class Replay:
    """A trainer that, instead of training, hands its guard a worked history step by step."""

    def __init__(self, history: list[dict[str, float]]):
        self.history, self.model, self.on_step = history, None, None
        self.guard = SimpleNamespace(checkpoint_step=0)  # no checkpoint written

    def train(self, problems, ckpt_dir, fingerprint):
        for end, row in enumerate(self.history, 1):
            if row["step"] >= 1:  # the probe before training is not a step
                self.on_step(int(row["step"]), self.history[:end])

    def close(self):
        """Nothing to release: it holds no model, sampler or worker."""


def test_a_stop_names_every_rule_that_tripped_at_its_step(tmp_path):
    """Two rules trip at one step (the format hole, where either may be checked first): the
    stop, the record and the curves name both, the first checked as the primary."""
    from tests.guard.test_watch import FORMAT_HOLE, FORMAT_HOLE_GUARD, format_hole_history

    cfg = grpo_config(rewards=FORMAT_HOLE, guard=FORMAT_HOLE_GUARD, probe={"every": 2})
    tracker, ckpt = Tracker(), tmp_path / "checkpoints"
    with pytest.raises(GuardStop) as stopped:
        train_guarded(
            lambda _: Replay(format_hole_history()), cfg, PROBLEMS, ckpt, "fp", tracker, "rl"
        )
    message = str(stopped.value)
    assert "at step 12: rule reward_without_skill: math: training pass rate" in message
    assert "; rule gamed_term: format adds 1.000 -> 1.800" in message
    assert "no checkpoint before the rules' windows" in message
    assert stopped.value.rules == ["reward_without_skill", "gamed_term"]
    assert stopped.value.trip["rule"] == "reward_without_skill"  # the primary: checked first
    record = GuardRecord.load(ckpt)
    assert record.outcome == "stopped"
    assert record.stop_rules == ["reward_without_skill", "gamed_term"]
    assert [(t["rule"], t["step"], t["action"]) for t in record.last_trips()] == [
        ("reward_without_skill", 12, "stop"),
        ("gamed_term", 12, "stop"),
    ]
    assert sum("guard: gamed_term at step 12" in n for n in tracker.notes) == 1
    assert (tmp_path / "guard" / "gamed_term_step00012.png").exists()
    import pickle

    assert pickle.loads(pickle.dumps(stopped.value)).rules == stopped.value.rules


def test_a_deepspeed_stop_names_every_rule_that_tripped_at_its_step(tmp_path):
    """The same under DeepSpeed, whose guard reads the forwarded metrics: repetition and the
    language-consistent share turn at step 11 and both rules (windows of 10) trip at step 20."""
    from stages.guarded import MetricsWatch

    watch = MetricsWatch(grpo_config(), Tracker(), "rl", tmp_path)
    for step in range(1, 20):
        late = step > 10
        watch(
            {
                "reward/mean": 0.5,
                "completion/repetition_rate": 0.9 if late else 0.1,
                "completion/language_consistency_rate": 0.5 if late else 1.0,
            },
            step,
        )
    assert GuardRecord.load(tmp_path).outcome == "clean"
    with pytest.raises(GuardStop) as stopped:
        watch(
            {
                "reward/mean": 0.5,
                "completion/repetition_rate": 0.9,
                "completion/language_consistency_rate": 0.5,
            },
            20,
        )
    message = str(stopped.value)
    assert "at step 20: rule repetition: " in message and "; rule language_mixing: " in message
    record = GuardRecord.load(tmp_path)
    assert record.stop_rules == stopped.value.rules == ["repetition", "language_mixing"]


def test_a_probing_deepspeed_stage_keeps_readings_and_items_for_the_guard(tmp_path):
    """Lines in the order one probing worker writes them: the reading before training, its
    items (sent after step 1), step 1's items, then step 1's metrics with its reading. Items
    join their step's entry in the guard's history; the tracker gets no item."""
    from stages.guarded import MetricsWatch

    cfg = grpo_config(
        rewards=[RewardTerm(name="accuracy", families=["math"])], probe={"every": 1}
    )  # fmt: skip
    tracker = Tracker()
    watch = MetricsWatch(cfg, tracker, "rl", tmp_path, probed=True)
    assert "reward_without_skill" not in watch.guard.idle()
    watch({"heldout/pass_at_1": 0.5}, 0)
    watch({"items/pass_at_1/0": 1.0, "items/pass_at_1/1": 0.0}, 0)
    watch({"items/pass_at_1/0": 0.0, "items/pass_at_1/1": 0.0}, 1)
    watch({"reward/mean": 0.2, "heldout/pass_at_1": 0.0}, 1)
    assert watch.history == [
        {"step": 0.0, "heldout/pass_at_1": 0.5, "items/pass_at_1/0": 1.0, "items/pass_at_1/1": 0.0},
        {"step": 1.0, "reward/mean": 0.2, "heldout/pass_at_1": 0.0,
         "items/pass_at_1/0": 0.0, "items/pass_at_1/1": 0.0},
    ]  # fmt: skip
    assert not any(k.startswith("items/") for _, m in tracker.metrics for k in m)

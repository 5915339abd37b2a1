"""Asynchronous GRPO's schedule and resume (rl/sources/pipelined.py), with its workers drawing in
this process: each step drawn from the policy max_staleness updates older, drawn ahead while
the trainer updates, versions handed over as files checked by digest, and a checkpoint that
carries the draws made ahead so that a resumed run ends as one never stopped. The same with
sampler processes killed for real: tests/rl/test_rollout_workers.py."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from configs.cluster import ClusterConfig
from configs.reinforcement import GRPOConfig
from rl.sources.pipelined import MissingRolloutsError, PipelinedSource
from rl.trainer import GRPOTrainer
from sampling.hf import HFSampler
from sampling.workers import DrawJob, DrawResult
from sampling.workers.versions import (
    PolicyVersion,
    VersionFolder,
    VersionMismatchError,
    read_version,
)
from sampling.workers.worker import RolloutWorker
from tests.rl.test_grpo_trainer import Killed
from tests.tiny_models import PROBLEMS, grpo_config, tiny_model


class InlineWorkers:
    """One RolloutWorker drawing in this process, a job at a time, when a result is asked for;
    it records what was submitted."""

    size = 1

    def __init__(self, tokenizer, seed: int = 7):
        # another initialisation than the trainer's: only the versions it loads make its samples
        sampler = HFSampler(tiny_model(tokenizer, seed=seed), tokenizer, 8, show_progress=False)
        self.worker = RolloutWorker(sampler)
        self.queue: deque[DrawJob] = deque()
        self.submitted: list[tuple[int, int]] = []  # (step, version) in submission order

    def submit(self, job: DrawJob) -> None:
        self.queue.append(job)
        self.submitted.append((job.step, job.version.number))

    def result(self) -> DrawResult:
        return self.worker.draw(self.queue.popleft())

    def close(self) -> None:
        self.queue.clear()


def cfg(k: int, **overrides) -> GRPOConfig:
    cap = 3.0 if k else None
    return grpo_config(max_staleness=k, importance_sampling_cap=cap, **overrides)


def train(tokenizer, tmp_path, config, workers=None, on_step=None):
    """GRPO on PROBLEMS with rollouts from `workers` (InlineWorkers by default); the model, the
    report, the metrics by step and the number of jobs submitted when each step was logged."""
    workers = workers or InlineWorkers(tokenizer)
    source = PipelinedSource(workers, tmp_path / "versions", config.max_staleness, config.steps)
    model, records, submitted = tiny_model(tokenizer), [], []

    def log(metrics, step):
        records.append((step, metrics))
        submitted.append(len(workers.submitted))
        if on_step:
            on_step(step)

    trainer = GRPOTrainer(model, tokenizer, config, log, show_progress=False, source=source)
    try:
        report = trainer.train(PROBLEMS, tmp_path / "ckpt", "fp")
    finally:
        trainer.close()
    return model, report, records, submitted


@pytest.mark.parametrize("k", [0, 1, 2])
def test_each_step_is_drawn_from_the_policy_k_updates_old_while_the_trainer_updates(
    tokenizer, tmp_path, k
):
    steps = 6
    workers = InlineWorkers(tokenizer)
    _, report, records, submitted = train(tokenizer, tmp_path, cfg(k, steps=steps), workers)
    assert report.steps == steps
    versions = [int(m["rollout/policy_version"]) for _, m in records]
    assert versions == [max(0, s - k) for s in range(steps)]
    assert [m["rollout/staleness"] for _, m in records] == [min(s, k) for s in range(steps)]
    assert workers.submitted == [(s, max(0, s - k)) for s in range(steps)]
    # once step s is trained (version s + 1 published), steps up to s + 1 + k are out
    assert submitted == [min(steps, s + 2 + k) for s in range(steps)]
    assert all(("tis/mean_ratio" in m) == (k > 0) for _, m in records)


def test_staleness_zero_on_a_worker_trains_as_the_colocated_sampler(tokenizer, tmp_path):
    config = cfg(0, steps=4)
    model, report, records, _ = train(tokenizer, tmp_path / "worker", config)
    colocated = tiny_model(tokenizer)
    straight = []
    GRPOTrainer(
        colocated, tokenizer, config, lambda m, s: straight.append((s, m)), show_progress=False
    ).train(PROBLEMS, tmp_path / "colocated", "fp")
    for (_, a), (_, b) in zip(straight, records, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
            k: v for k, v in b.items() if not k.startswith("time/")
        }
    for a, b in zip(colocated.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("k", [1, 2])
def test_a_checkpoint_carries_the_draws_made_ahead_and_a_resume_ends_alike(tokenizer, tmp_path, k):
    config = cfg(k, steps=7, checkpoint_every=3)
    straight, report, want, _ = train(tokenizer, tmp_path / "a", config)

    def die(step):
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        train(tokenizer, tmp_path / "b", config, on_step=die)
    state = torch.load(tmp_path / "b" / "ckpt" / "last" / "state.pt", weights_only=False)
    carried = state["rollouts"]
    assert [r["step"] for r in carried] == list(range(3, 3 + k))  # drawn from versions < 3
    assert [r["version"] for r in carried] == [max(0, s - k) for s in range(3, 3 + k)]
    resumed, report_b, got, _ = train(tokenizer, tmp_path / "b", config)
    assert report_b.resumed_from == 3
    assert [s for s, _ in got[1:]] == [4, 5, 6, 7]
    for (_, a), (_, b) in zip(want[3:], got[1:], strict=True):
        assert {x: v for x, v in a.items() if not x.startswith("time/")} == {
            x: v for x, v in b.items() if not x.startswith("time/")
        }
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_resume_without_the_draws_made_ahead_is_refused(tokenizer, tmp_path):
    config = cfg(2, steps=6, checkpoint_every=2)
    source = PipelinedSource(InlineWorkers(tokenizer), tmp_path / "v", 2, 6)
    plan = GRPOTrainer(tiny_model(tokenizer), tokenizer, config, lambda m, s: None)
    with pytest.raises(MissingRolloutsError, match=r"steps \[2, 3\].*max_staleness 2"):
        source.begin(2, plan._plan, tiny_model(tokenizer), carried=None)


def test_versions_are_files_checked_by_digest_and_released_when_no_step_needs_them(
    tokenizer, tmp_path
):
    model = tiny_model(tokenizer)
    folder = VersionFolder(tmp_path / "v")
    v0 = folder.publish(model, 0)
    v1 = folder.publish(model, 1, changed=False)  # no update: the same file
    assert v1.path == v0.path and v1.digest == v0.digest
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    v2 = folder.publish(model, 2)
    assert v2.path != v0.path
    state = read_version(v2)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    folder.release(2)
    assert not (tmp_path / "v" / "v000000.pt").exists() and (tmp_path / "v" / "v000002.pt").exists()
    with pytest.raises(VersionMismatchError, match="no file"):
        read_version(v0)
    forged = PolicyVersion(2, v2.path, "0" * 64)
    with pytest.raises(VersionMismatchError, match="has digest .* the trainer wrote 000000000000"):
        read_version(forged)
    assert VersionFolder(tmp_path / "v").versions == {}  # a new run starts from an empty folder
    assert not any((tmp_path / "v").iterdir())


def test_where_rollouts_come_from_and_the_settings_that_cannot_go_together():
    assert ClusterConfig().rollouts_for(0, "single") == "colocated"
    assert ClusterConfig().rollouts_for(1, "single") == "process"
    assert ClusterConfig(address="auto").rollouts_for(2, "single") == "workers"
    assert ClusterConfig(rollouts="process").rollouts_for(0, "single") == "process"
    assert ClusterConfig().active() is None and ClusterConfig(rollouts="process").active()
    with pytest.raises(ValueError, match="max_staleness 1 needs sampling workers"):
        ClusterConfig(rollouts="colocated").rollouts_for(1, "single")
    with pytest.raises(ValueError, match="DeepSpeed ranks sample"):
        ClusterConfig(rollouts="process").rollouts_for(0, "deepspeed")
    with pytest.raises(ValueError, match="workers are Ray actors; set address"):
        ClusterConfig(rollouts="workers")
    with pytest.raises(ValueError, match="set importance_sampling_cap"):
        grpo_config(max_staleness=1)
    with pytest.raises(ValueError, match="need engine.kind single"):
        grpo_config(
            max_staleness=1,
            importance_sampling_cap=2.0,
            engine={"kind": "deepspeed", "processes": 2},
        )

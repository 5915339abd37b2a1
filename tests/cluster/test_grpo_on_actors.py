"""A GRPO stage drawing its rollouts on the cluster's sampling actors (two, one per node of a
local two-node cluster), asynchronously: the same rows as on a sampler process of this machine,
and its curves and weights within rounding (placement is not identity); an actor killed
mid-stage is replaced by Ray and the steps it held are drawn again, from the versions they name,
with the same end; an actor that reads another policy version file than the trainer wrote
fails, naming both digests."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from configs.cluster import ClusterConfig
from models.saved import ModelRef, save_model
from problems.loader import write_problems
from problems.types import ProblemSet
from stages import reasoning_rl
from tests.cluster.test_sampling_on_actors import one_new_actor, sampling_actor_pids
from tests.tiny_models import PROBLEMS, grpo_config, make_tokenizer, tiny_model

pytestmark = [pytest.mark.cluster, pytest.mark.heavy]

# On actors and on a process the sampler's log-probabilities differ in their last bits; eight
# Adam steps carry them into the weights: 6.0e-6 apart at most on an AMD EPYC
# (the tied embedding), under 1e-6 on an Intel Xeon, measured; a wrong step moves weights by about
# the learning rate (1e-2).
WEIGHT_ATOL = 1e-4
CONFIG = grpo_config(steps=8, max_staleness=1, importance_sampling_cap=3.0, samples_every=1)


class Recorder:
    """The stage's metrics by step; `on_step` runs after each (the test's fault)."""

    def __init__(self, on_step=None):
        self.metrics: list[tuple[int | None, dict]] = []
        self.on_step = on_step

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, metrics))
        if self.on_step is not None and step is not None:
            self.on_step(step)

    def log_artifact(self, path, artifact_path=None):
        return None

    def untimed(self):
        return [
            (s, {k: v for k, v in m.items() if not k.startswith("time/")}) for s, m in self.metrics
        ]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[ModelRef, ProblemSet]:
    root = tmp_path_factory.mktemp("inputs")
    tokenizer = make_tokenizer()
    policy = save_model(tiny_model(tokenizer), tokenizer, root)
    path = write_problems(root / "train.jsonl", PROBLEMS)
    return policy, ProblemSet(path, path, len(PROBLEMS), len(PROBLEMS))


def stage(inputs, out: Path, cluster: ClusterConfig, tracker: Recorder) -> Path:
    policy, problems = inputs
    reasoning_rl.run(CONFIG, policy, problems, out, tracker, desc="rl", cluster=cluster)
    return out


def rows(out: Path) -> dict[str, list]:
    return {p.name: json.loads(p.read_text()) for p in sorted((out / "samples").glob("*.json"))}


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def on_process(inputs, tmp_path_factory) -> tuple[Path, Recorder]:
    tracker = Recorder()
    out = stage(inputs, tmp_path_factory.mktemp("process"), ClusterConfig(), tracker)
    return out, tracker


@pytest.fixture(scope="module")
def on_actors(inputs, ray_cluster, tmp_path_factory) -> tuple[Path, Recorder]:
    tracker = Recorder()
    cluster = ClusterConfig(address=ray_cluster, workers=2)
    out = stage(inputs, tmp_path_factory.mktemp("actors"), cluster, tracker)
    return out, tracker


def test_rollouts_on_two_actors_train_as_on_a_sampler_process(on_actors, on_process):
    """The same samples (each actor draws half of a step's prompts); the sampler's
    log-probabilities, which the loss's importance weights read, differ in their last bits
    with the batch a prompt is decoded in, and so do the losses after them."""
    (out, tracker), (want_out, want) = on_actors, on_process
    assert rows(out) == rows(want_out)
    assert [s for s, _ in tracker.metrics] == [s for s, _ in want.metrics]
    for (_, got), (step, expected) in zip(tracker.untimed(), want.untimed(), strict=True):
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-6), step
    assert [m["rollout/staleness"] for s, m in tracker.metrics if s] == [0.0] + [1.0] * 7
    got, expected = weights(out), weights(want_out)
    assert all(
        torch.allclose(got[name], value, atol=WEIGHT_ATOL) for name, value in expected.items()
    )


def test_an_actor_killed_mid_stage_is_replaced_and_its_steps_drawn_again(
    inputs, on_actors, ray_cluster, tmp_path, caplog
):
    want_out, want = on_actors
    killed: list[int] = []
    before = set(sampling_actor_pids())

    def kill(step: int) -> None:
        if step == 3:  # step 4 (maybe 3 too) is out on the actors
            killed.append(one_new_actor(before))
            os.kill(killed[0], signal.SIGKILL)

    tracker = Recorder(kill)
    cluster = ClusterConfig(address=ray_cluster, workers=2)
    with caplog.at_level(logging.WARNING, logger="cluster.actors"):
        out = stage(inputs, tmp_path, cluster, tracker)
    assert killed and "was replaced" in caplog.text and str(killed[0]) in caplog.text
    assert tracker.untimed() == want.untimed()
    assert rows(out) == rows(want_out)
    got, expected = weights(out), weights(want_out)
    assert all(torch.equal(got[name], value) for name, value in expected.items())


def test_an_actor_that_reads_another_version_file_fails_naming_both_digests(
    inputs, ray_cluster, tmp_path
):
    from cluster.rollout_actors import ActorWorkers
    from sampling.interface import SamplingParams
    from sampling.workers import DrawJob
    from sampling.workers.versions import VersionFolder, VersionMismatchError

    policy, _ = inputs
    cluster = ClusterConfig(address=ray_cluster, workers=1)
    workers = ActorWorkers.start(cluster, CONFIG.sampler, policy.path, 8)
    try:
        version = VersionFolder(tmp_path / "v").publish(tiny_model(make_tokenizer()), 0)
        Path(version.path).write_bytes(b"another file at that path")
        workers.submit(DrawJob(0, 0, ["What is 1 + 1?"], 2, SamplingParams(), version))
        with pytest.raises(VersionMismatchError, match="has digest .* the trainer wrote"):
            workers.result()
    finally:
        workers.close()

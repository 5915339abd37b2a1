"""The held-out probe drawn by the sampling workers (rl/probing.py, rl/sources/pipelined.py): a
job like any step's draw, naming the policy version it measures, read `every` steps later at a
step the schedule fixes, with the same figures the trainer's own sampler gives for that version;
a checkpoint keeps the probes drawn and not yet read, and a resumed run ends as one never
stopped."""

from __future__ import annotations

import pytest
import torch

from configs.reinforcement import ProbeConfig
from guard.history import PROBE_VERSION
from rl.probing import (
    MOST_PROBE_ROWS,
    HeldoutProbe,
    OffPathProbes,
    longest_probe_gap,
    probe_steps,
    sampler_rows,
)
from rl.sources import DrawRequest
from rl.sources.pipelined import PipelinedSource
from rl.trainer import GRPOTrainer
from sampling.hf import HFSampler
from sampling.interface import SamplingParams
from tests.rl.test_async_rollouts import InlineWorkers, cfg
from tests.rl.test_grpo_trainer import Killed
from tests.tiny_models import PROBLEMS, tiny_model


def probe(tokenizer) -> HeldoutProbe:
    """Three held-out prompts, two samples each, graded by what the samples are (their mean
    length, and the share that hold a digit), one value a prompt kept as an item."""
    prompts = [f"What is {i} + 2?" for i in range(3)]

    def grade(groups):
        flat = [c for g in groups for c in g]
        digits = [any(ch.isdigit() for ch in c.text) for c in flat]
        items = {f"items/pass_at_1/{i}": sum(digits[2 * i : 2 * i + 2]) / 2 for i in range(3)}
        mean = sum(len(c.token_ids) for c in flat) / len(flat)
        return {"mean_tokens": mean, "pass_at_1": sum(digits) / len(flat)} | items

    request = DrawRequest(prompts, 2, SamplingParams(1.0, 1.0, 8, seed=11))
    return HeldoutProbe(request, grade)


def probed(history) -> dict[int, dict[str, float]]:
    """Each probe reading by the policy version it measured."""
    readings = {}
    for h in history:
        if "heldout/pass_at_1" in h:
            figures = {k: v for k, v in h.items() if k.startswith(("heldout/", "items/"))}
            readings[int(h.get(PROBE_VERSION, h["step"]))] = figures
    return readings


class RecordingWorkers(InlineWorkers):
    """InlineWorkers that also record which jobs were probes: (step or version, version, probe)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.jobs: list[tuple[int, int, bool]] = []
        self.slices: list[tuple[int, int, int]] = []  # a probe job's version, part, prompts

    def submit(self, job) -> None:
        super().submit(job)
        self.jobs.append((job.step, job.version.number, job.probe))
        if job.probe:
            self.slices.append((job.step, job.chunk, len(job.prompts)))


def train_probed(tokenizer, tmp_path, config, workers=None, on_step=None):
    """GRPO on PROBLEMS with rollouts from `workers` and the probe above: the model, the report,
    the metrics by step, and the workers."""
    workers = workers or RecordingWorkers(tokenizer)
    source = PipelinedSource(workers, tmp_path / "versions", config.max_staleness, config.steps)
    model, records = tiny_model(tokenizer), []

    def log(metrics, step):
        records.append((step, metrics))
        if on_step and not any(k.startswith("heldout/") for k in metrics):
            on_step(step)

    trainer = GRPOTrainer(
        model, tokenizer, config, log, show_progress=False, source=source, probe=probe(tokenizer)
    )
    try:
        report = trainer.train(PROBLEMS, tmp_path / "ckpt", "fp")
    finally:
        trainer.close()
    return model, report, records, workers


def probe_steps_reference(every: int, steps: int) -> list[int]:
    """The schedule spelled out: 0, each multiple of `every` at least half an interval before
    the last step, and the last step."""
    kept = [0]
    for version in range(1, steps + 1):
        if version == steps or (version % every == 0 and steps - version >= every / 2):
            kept.append(version)
    return kept


def test_a_stage_probes_every_interval_and_at_its_end_but_not_twice_in_half_an_interval():
    assert probe_steps(20, 85) == [0, 20, 40, 60, 85]  # not 80 and 85
    assert probe_steps(20, 40) == [0, 20, 40]
    assert probe_steps(20, 90) == [0, 20, 40, 60, 80, 90]  # 80 is half an interval before
    assert probe_steps(20, 10) == [0, 10]
    assert longest_probe_gap(20, 85) == 25 and longest_probe_gap(20, 40) == 20
    assert longest_probe_gap(0, 85) == 0
    for every in range(1, 12):
        for steps in range(1, 60):
            versions = probe_steps(every, steps)
            assert versions == probe_steps_reference(every, steps), (every, steps)
            assert longest_probe_gap(every, steps) < 1.5 * every or steps < every


def test_the_schedule_reads_each_probe_every_steps_after_its_version_and_the_last_at_once():
    assert probe_steps(2, 7) == [0, 2, 4, 6, 7]
    runner = OffPathProbes(probe_stub(), None, every=2, steps=7, lag=2)  # type: ignore[arg-type]
    assert [runner.read_at(v) for v in runner.versions] == [2, 4, 6, 7, 7]


def probe_stub() -> HeldoutProbe:
    return HeldoutProbe(DrawRequest(["q"], 1, SamplingParams(1.0, 1.0, 4)), lambda groups: {})


def test_the_workers_draw_the_probe_and_it_reads_as_the_trainers_own(tokenizer, tmp_path):
    """At max_staleness 0 the workers' policy is the colocated trainer's, step by step: every
    probe they drew, read two steps after its version, holds the figures the trainer's own
    sampler gives at that version, and the trainer opened no sampler of its own."""
    config = cfg(0, steps=5, probe=ProbeConfig(every=2, on_workers=True))
    _, report, records, workers = train_probed(tokenizer, tmp_path / "workers", config)
    # each probe sent a slice a step until it is read (its 3 prompts in 1 and 2), each behind
    # that step's draw; the probes read at the last step whole
    assert workers.slices == [(0, 0, 1), (0, 1, 2), (2, 0, 1), (2, 1, 2), (4, 0, 3), (5, 0, 3)]
    probe_at = [i for i, (_, _, is_probe) in enumerate(workers.jobs) if is_probe]
    assert probe_at == [1, 3, 5, 7, 9, 10]  # draw, probe slice, draw, ..., the last two at the end
    read = [(h["step"], h[PROBE_VERSION]) for h in report.history if PROBE_VERSION in h]
    assert read == [(2, 0), (4, 2), (5, 4), (5, 5)]
    logged = [(s, m["heldout/pass_at_1"]) for s, m in records if "heldout/pass_at_1" in m]
    assert [s for s, _ in logged] == [0, 2, 4, 5]  # each at the version it measured

    colocated = GRPOTrainer(
        tiny_model(tokenizer),
        tokenizer,
        config,
        lambda m, s: None,
        show_progress=False,
        probe=probe(tokenizer),
    )
    straight = colocated.train(PROBLEMS, tmp_path / "colocated", "fp")
    colocated.close()
    assert probed(straight.history) == probed(report.history)
    assert len(probed(report.history)) == 4


@pytest.mark.parametrize(
    ("every", "steps", "die_at", "kept_probes"),
    [
        (2, 7, 5, [2]),  # the probe of version 2, both slices sent by step 3: drawn whole
        (4, 9, 7, [4]),  # version 4's fourth slice, due at step 7, sent ahead of the checkpoint
    ],
)
def test_a_checkpoint_keeps_the_probes_not_yet_read_and_a_resume_ends_alike(
    tokenizer, tmp_path, every, steps, die_at, kept_probes
):
    probe_on_workers = ProbeConfig(every=every, on_workers=True)
    config = cfg(1, steps=steps, checkpoint_every=3, probe=probe_on_workers)
    straight, want, _, _ = train_probed(tokenizer, tmp_path / "a", config)

    def die(step):
        if step == die_at:
            raise Killed

    with pytest.raises(Killed):
        train_probed(tokenizer, tmp_path / "b", config, on_step=die)
    state = torch.load(tmp_path / "b" / "ckpt" / "last" / "state.pt", weights_only=False)
    checkpoint = die_at - die_at % 3 if die_at % 3 else die_at - 3
    assert [r["version"] for r in state["rollouts"] if "probe" in r] == kept_probes
    assert [r["step"] for r in state["rollouts"] if "probe" not in r] == [checkpoint]
    resumed, got, _, workers = train_probed(tokenizer, tmp_path / "b", config)
    assert got.resumed_from == checkpoint
    assert not any(v in kept_probes for v, _, _ in workers.slices)  # not drawn again

    def plain(history):
        return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]

    assert plain(got.history) == plain(want.history)
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_by_default_the_trainer_probes_on_its_own_sampler_beside_workers(tokenizer, tmp_path):
    config = cfg(1, steps=4, probe=ProbeConfig(every=2))
    _, report, _, workers = train_probed(tokenizer, tmp_path, config)
    assert workers.jobs == [(s, max(0, s - 1), False) for s in range(4)]  # rollouts only
    assert sorted(probed(report.history)) == [0, 2, 4]
    assert not any(PROBE_VERSION in h for h in report.history)


def wide_probe(tokenizer) -> HeldoutProbe:
    """The probe above over six prompts of four samples: more rows than a step draws."""
    narrow = probe(tokenizer)
    prompts = [f"What is {i} + 2?" for i in range(6)]
    return HeldoutProbe(DrawRequest(prompts, 4, narrow.request.params), narrow.grade)


def test_on_the_cpu_the_trainers_sampler_decodes_the_whole_probe_together(tokenizer, tmp_path):
    """A probe of more rows than a step's is one batch of the trainer's own sampler (its cost
    is mostly per decode step), and reads as in a step's batches: each row draws from its own
    stream; the steps' draws, one batch either way, and the weights are the same."""
    config = cfg(0, steps=3, probe=ProbeConfig(every=2))
    step_rows = config.prompts_per_step * config.group_size
    assert wide_probe(tokenizer).rows == 24 > step_rows
    runs = {}
    for name, sampler in (("own", None), ("step's batch", step_rows)):
        model = tiny_model(tokenizer)
        given = None if sampler is None else HFSampler(model, tokenizer, sampler, False)
        trainer = GRPOTrainer(
            model, tokenizer, config, lambda m, s: None, show_progress=False,
            probe=wide_probe(tokenizer), sampler=given,
        )  # fmt: skip
        report = trainer.train(PROBLEMS, tmp_path / name, "fp")
        runs[name] = (model, report, trainer.sampler.batch_size)
        trainer.close()
    (own, mine, rows), (twin, theirs, _) = runs["own"], runs["step's batch"]
    assert rows == 24
    assert sorted(probed(mine.history)) == [0, 2, 3]
    assert probed(mine.history) == probed(theirs.history)
    for a, b in zip(own.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_large_probe_is_cut_into_batches_of_at_most_most_probe_rows():
    """A probe of many rows (problems x samples) is not held as one cache on the CPU; off the
    CPU a step's rows stay the batch; a probe that is only a function changes nothing."""
    from types import SimpleNamespace

    big = HeldoutProbe(DrawRequest(["q"] * 600, 4, SamplingParams(1.0, 1.0, 4)), lambda g: {})
    cpu = SimpleNamespace(device=torch.device("cpu"))  # what sampler_rows reads of a model
    device = SimpleNamespace(device=torch.device("meta"))
    assert sampler_rows(64, big, cpu) == MOST_PROBE_ROWS < big.rows
    assert sampler_rows(8, wide_probe(None), cpu) == 24
    assert sampler_rows(64, probe_stub(), cpu) == 64
    assert sampler_rows(64, big, device) == 64
    assert sampler_rows(64, lambda sampler: {}, cpu) == 64

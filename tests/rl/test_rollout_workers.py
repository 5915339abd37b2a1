"""GRPO drawing its rollouts from a sampler process of its own (sampling/workers/process.py),
for real: each step's samples are those the policy version it names produces, and a sampler
process killed with SIGKILL mid-stage is replaced, its jobs drawn again, and the stage ends with
the rows, curves and weights of a run where none died."""

from __future__ import annotations

import copy
import logging
import os
import signal

import pytest
import torch

from models.saved import save_model
from rl.sources.pipelined import PipelinedSource
from rl.trainer import GRPOTrainer
from sampling.hf import HFSampler
from sampling.workers import RolloutWorkerError
from sampling.workers.process import ProcessWorkers
from tests.tiny_models import PROBLEMS, grpo_config, tiny_model

pytestmark = pytest.mark.heavy  # sampler processes started, and killed


@pytest.fixture(scope="module")
def policy(tmp_path_factory, tokenizer):
    """The folder the sampler processes open (architecture, tokenizer; the weights each draw
    uses come from its policy version)."""
    return save_model(tiny_model(tokenizer), tokenizer, tmp_path_factory.mktemp("policy")).path


def run(tokenizer, policy, folder, config, on_step=None):
    """GRPO with rollouts from one sampler process: the model, its metrics, sample rows and
    draws by step, the pool."""
    workers = ProcessWorkers(config.sampler, policy, config.prompts_per_step * config.group_size)
    source = PipelinedSource(workers, folder / "versions", config.max_staleness, config.steps)
    model = tiny_model(tokenizer)
    out = {"metrics": [], "rows": {}, "draws": [], "weights": {0: copy.deepcopy(model)}}
    take = source.take

    def recorded_take(step, request):
        draw = take(step, request)
        out["draws"].append((request, draw))
        return draw

    source.take = recorded_take  # type: ignore[method-assign]

    def log(metrics, step):
        out["metrics"].append((step, metrics))
        out["weights"][step] = copy.deepcopy(model)  # version `step`: the policy after it
        if on_step:
            on_step(step, workers)

    trainer = GRPOTrainer(
        model,
        tokenizer,
        config,
        log,
        lambda step, rows: out["rows"].__setitem__(step, rows),
        show_progress=False,
        source=source,
    )
    try:
        trainer.train(PROBLEMS, folder / "ckpt", "fp")
    finally:
        trainer.close()
    return model, out, workers


def logprobs(groups) -> list[float]:
    return [x for group in groups for c in group for x in c.logprobs]


def untimed(metrics):
    return [(s, {k: v for k, v in m.items() if not k.startswith("time/")}) for s, m in metrics]


def test_every_step_is_sampled_by_the_policy_version_it_names(tokenizer, policy, tmp_path):
    k = 2
    config = grpo_config(steps=6, max_staleness=k, importance_sampling_cap=3.0, samples_every=1)
    _, out, _ = run(tokenizer, policy, tmp_path, config)
    assert [d.version for _, d in out["draws"]] == [max(0, s - k) for s in range(6)]
    for step, rows in out["rows"].items():
        assert {r["policy_version"] for r in rows} == {max(0, step - 1 - k)}
    for request, draw in out["draws"]:
        again = HFSampler(out["weights"][draw.version], tokenizer, 8, show_progress=False)
        with torch.no_grad():
            groups = again.generate(request.prompts, request.n, request.params)
        assert [[c.token_ids for c in g] for g in groups] == [
            [c.token_ids for c in g] for g in draw.groups
        ], draw.step
        assert logprobs(groups) == pytest.approx(logprobs(draw.groups), abs=1e-5)
    # a later version samples otherwise: the check above can tell versions apart
    last_request, last = out["draws"][-1]
    other = HFSampler(out["weights"][last.version + 1], tokenizer, 8, show_progress=False)
    with torch.no_grad():
        groups = other.generate(last_request.prompts, last_request.n, last_request.params)
    assert logprobs(groups) != pytest.approx(logprobs(last.groups), abs=1e-5)


def test_a_sampler_process_killed_mid_stage_is_replaced_and_its_jobs_drawn_again(
    tokenizer, policy, tmp_path, caplog
):
    config = grpo_config(steps=8, max_staleness=1, importance_sampling_cap=3.0, samples_every=1)
    straight, want, _ = run(tokenizer, policy, tmp_path / "straight", config)
    killed: list[int] = []

    def kill(step, workers):
        if step == 3:
            killed.append(workers.pids[0])
            os.kill(killed[0], signal.SIGKILL)

    with caplog.at_level(logging.WARNING, logger="sampling.workers.process"):
        model, got, workers = run(tokenizer, policy, tmp_path / "killed", config, on_step=kill)
    assert killed and workers.restarts == 1
    assert f"sampling process {killed[0]} died" in caplog.text
    assert "draws its 1 jobs again" in caplog.text or "draws its 2 jobs again" in caplog.text
    assert untimed(got["metrics"]) == untimed(want["metrics"])
    assert got["rows"] == want["rows"]
    for a, b in zip(straight.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_job_sent_to_a_dead_sampler_process_goes_to_its_replacement(tokenizer, policy, tmp_path):
    from sampling.interface import SamplingParams
    from sampling.workers import DrawJob
    from sampling.workers.versions import VersionFolder

    config = grpo_config()
    version = VersionFolder(tmp_path / "v").publish(tiny_model(tokenizer), 0)
    workers = ProcessWorkers(config.sampler, policy, 8, max_restarts=1)
    try:
        job = DrawJob(0, 0, ["What is 1 + 1?"], 2, SamplingParams(max_new_tokens=4), version)
        workers.submit(job)
        first = workers.result()
        dead = workers.processes[0].popen
        dead.kill()
        dead.wait()
        workers.submit(job)  # the socket is closed: replaced at once, the job sent again
        again = workers.result()
        assert workers.restarts == 1 and again.pid != first.pid == dead.pid
        assert again.groups == first.groups
        workers.processes[0].popen.kill()
        workers.processes[0].popen.wait()
        with pytest.raises(RolloutWorkerError, match="were replaced already"):
            workers.submit(job)
            workers.result()
    finally:
        workers.close()


def test_sampler_processes_open_their_models_on_the_trainer_s_device(tokenizer, policy, tmp_path):
    """A sampler process puts its model where the trainer's process puts its models (a GPU
    trainer's sampler samples on the GPU, not on the host): told cuda, it samples there on a
    machine with one, and on a machine without refuses with the device's error, where it
    would have sampled on the CPU."""
    from models.loading import model_device
    from sampling.interface import SamplingParams
    from sampling.workers import DrawJob
    from sampling.workers.versions import VersionFolder

    config = grpo_config()
    version = VersionFolder(tmp_path / "v").publish(tiny_model(tokenizer), 0)
    job = DrawJob(0, 0, ["What is 1 + 1?"], 2, SamplingParams(max_new_tokens=4), version)
    assert model_device().type == "cpu"
    workers = ProcessWorkers(config.sampler, policy, 8)  # this process's device: the CPU
    try:
        workers.submit(job)
        assert workers.result().groups
    finally:
        workers.close()
    workers = ProcessWorkers(config.sampler, policy, 8, device="cuda")
    try:
        workers.submit(job)
        if torch.cuda.is_available():  # there it samples on the GPU
            assert workers.result().groups
        else:  # here the process refuses: the device reached it
            with pytest.raises(RolloutWorkerError, match="device: cuda"):
                workers.result()
    finally:
        workers.close()

"""Rejection sampling and evaluation on two Ray actors (one per node of a local two-node
cluster) store the rows and give the figures of one process; an actor killed mid-run changes
nothing; an actor that sees another model, and a cluster that does not answer, fail at once."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs.cluster import ClusterConfig
from configs.reinforcement import EvalConfig
from models.saved import ModelRef, save_model
from problems.loader import write_problems
from problems.types import Problem, ProblemSet
from stages import evaluate, rejection
from stages.tracker import NullTracker
from storage import rollout_store
from tests.stages import test_rejection_stage as rejection_stage_test
from tests.tiny_models import make_tokenizer, tiny_model

pytestmark = [pytest.mark.cluster, pytest.mark.heavy]

G = rejection_stage_test.G
# the rejection stage test's settings, in chunks of two prompts so that both actors get several
CONFIG = rejection_stage_test.CONFIG.model_copy(update={"chunk_prompts": 2, "max_new_tokens": 16})
REASONING = [Problem(f"r{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(14)]
GENERAL = [Problem(f"g{i}", f"Say hello {i} times.", "", kind="general") for i in range(2)]
EVAL = EvalConfig(max_problems=None, n_samples=3, k=2, max_new_tokens=16, general_prompts=0)
ROW_COLUMNS = (
    "prompt_id, sample_index, model_id, kind, family, language, prompt, completion, "
    "prompt_tokens, completion_tokens, finish_reason, reward_total, reward_accuracy, "
    "reward_format, reward_tag_count"
)


class Sink:
    """The stage's DuckDB sink, recording the order chunks arrived in; `on_insert` runs after
    each insert (the test's fault)."""

    def __init__(self, db: Path, model_id: str, on_insert=None):
        self.db, self.model_id, self.on_insert, self.arrived = db, model_id, on_insert, []

    def stored(self):
        return rollout_store.existing_samples(self.db, self.model_id)

    def insert(self, rows: pa.Table) -> int:
        new = rollout_store.insert_rollouts(self.db, rows)
        self.arrived.append(rows.column("prompt_id")[0].as_py())
        if self.on_insert is not None:
            self.on_insert(len(self.arrived))
        return new


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> ModelRef:
    tokenizer = make_tokenizer()
    return save_model(tiny_model(tokenizer), tokenizer, tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def cluster(ray_cluster) -> ClusterConfig:
    return ClusterConfig(address=ray_cluster, workers=2, chunk_prompts=3)


@pytest.fixture(scope="module")
def one_process(model, tmp_path_factory) -> Path:
    """The rows of rejection sampling in this process."""
    db = tmp_path_factory.mktemp("local") / "r1.duckdb"
    prompts = rejection.select_prompts(CONFIG, REASONING, GENERAL)
    rejection.run(CONFIG, model, "m", prompts, Sink(db, "m"), NullTracker())
    return db


def stored_rows(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            f"SELECT {ROW_COLUMNS} FROM rollouts ORDER BY prompt_id, sample_index"
        ).fetchall()


def sampling_actor_pids(actor: str = "SamplerActor") -> list[int]:
    """This machine's processes that are sampling actors of class `actor` (Ray titles them by
    their class)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if title.startswith(f"ray::{actor}".encode()):
                pids.append(int(entry.name))
    return pids


def one_new_actor(before: set[int], actor: str = "SamplerActor") -> int:
    """A sampling actor's pid that is not in `before`: one of the run under test, never an
    earlier test's actor that Ray has been told to kill and that has not exited yet."""
    new = sorted(set(sampling_actor_pids(actor)) - before)
    assert new, f"no {actor} process started since the test began"
    return new[0]


def test_a_killed_actor_is_replaced_and_its_chunks_rerun(
    model, cluster, one_process, tmp_path, caplog
):
    killed: list[int] = []
    before = set(sampling_actor_pids())

    def kill_one_actor(inserts: int) -> None:
        if inserts == 1:  # chunks are still out on both actors
            pid = one_new_actor(before)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    db = tmp_path / "r1.duckdb"
    prompts = rejection.select_prompts(CONFIG, REASONING, GENERAL)
    sink = Sink(db, "m", kill_one_actor)
    with caplog.at_level(logging.WARNING, logger="cluster.actors"):
        report = rejection.run(CONFIG, model, "m", prompts, sink, NullTracker(), cluster=cluster)
    assert killed and report.inserted == 16 * G
    assert "was replaced" in caplog.text and str(killed[0]) in caplog.text
    assert stored_rows(db) == stored_rows(one_process)  # the same rows, none twice
    assert sorted(sink.arrived) == sorted(p.id for p in prompts[::2])  # each chunk once


def test_a_driver_killed_mid_stage_resumes_at_the_missing_chunks(
    model, cluster, one_process, tmp_path
):
    class Killed(RuntimeError):
        """The driver's end, raised where a SIGKILL would have stopped it."""

    def die(inserts: int) -> None:
        if inserts == 3:
            raise Killed

    db = tmp_path / "r1.duckdb"
    prompts = rejection.select_prompts(CONFIG, REASONING, GENERAL)
    with pytest.raises(Killed):
        rejection.run(
            CONFIG, model, "m", prompts, Sink(db, "m", die), NullTracker(), cluster=cluster
        )
    resumed = rejection.run(
        CONFIG, model, "m", prompts, Sink(db, "m"), NullTracker(), cluster=cluster
    )
    assert (resumed.chunks_skipped, resumed.inserted) == (3, 5 * 2 * G)
    assert stored_rows(db) == stored_rows(one_process)


def test_evaluation_on_two_actors_gives_one_process_figures(model, cluster, tmp_path):
    heldout = [Problem(f"h{i}", f"What is {i} + {i + 1}?", str(2 * i + 1)) for i in range(10)]
    path = write_problems(tmp_path / "heldout.jsonl", heldout)
    problems = ProblemSet(path, path, len(heldout), len(heldout))
    local = evaluate.run(EVAL, model, problems, tmp_path / "local", NullTracker())
    spread = evaluate.run(
        EVAL, model, problems, tmp_path / "cluster", NullTracker(), cluster=cluster
    )
    assert spread.metrics == local.metrics
    assert (
        pq.read_table(spread.samples_path).to_pylist()
        == pq.read_table(local.samples_path).to_pylist()
    )


@pytest.fixture(scope="module")
def heldout(tmp_path_factory) -> ProblemSet:
    problems = [Problem(f"h{i}", f"What is {i} + {i + 1}?", str(2 * i + 1)) for i in range(10)]
    path = write_problems(tmp_path_factory.mktemp("heldout") / "heldout.jsonl", problems)
    return ProblemSet(path, path, len(problems), len(problems))


@pytest.fixture(scope="module")
def other_model(tmp_path_factory) -> ModelRef:
    tokenizer = make_tokenizer()
    return save_model(tiny_model(tokenizer, seed=1), tokenizer, tmp_path_factory.mktemp("other"))


def evaluated(report) -> tuple[dict, list[dict]]:
    return report.metrics, pq.read_table(report.samples_path).to_pylist()


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


def wait_gone(pids: set[int], seconds: float = 30.0) -> set[int]:
    """The pids of `pids` still running after up to `seconds` (Ray's kill is asynchronous)."""
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def test_a_stage_in_a_kept_block_samples_its_own_model_on_the_actors_before_it(
    model, other_model, cluster, heldout, tmp_path
):
    """The second evaluation takes the first one's actors (the same processes, no new ones),
    unloads nothing of theirs into its figures: they are the second model's in one process.
    The block's end ends the actors; outside a block each stage starts its own."""
    from cluster.kept import kept_actors

    want = evaluated(evaluate.run(EVAL, other_model, heldout, tmp_path / "local", NullTracker()))
    first = evaluated(evaluate.run(EVAL, model, heldout, tmp_path / "first-local", NullTracker()))
    assert first != want  # two models that sample apart
    before = set(sampling_actor_pids())
    with kept_actors(cluster):
        a = evaluate.run(EVAL, model, heldout, tmp_path / "a", NullTracker(), cluster=cluster)
        kept = set(sampling_actor_pids()) - before
        b = evaluate.run(EVAL, other_model, heldout, tmp_path / "b", NullTracker(), cluster=cluster)
        assert set(sampling_actor_pids()) - before == kept and len(kept) == cluster.workers
    assert evaluated(a) == first and evaluated(b) == want
    assert wait_gone(kept) == set()
    evaluate.run(EVAL, model, heldout, tmp_path / "c", NullTracker(), cluster=cluster)
    third = set(sampling_actor_pids()) - before
    evaluate.run(EVAL, model, heldout, tmp_path / "d", NullTracker(), cluster=cluster)
    assert not third & (set(sampling_actor_pids()) - before)  # the third's were ended


@pytest.mark.parametrize("restarts", [3, 0])
def test_a_kept_actor_that_died_between_stages_is_replaced(
    model, other_model, cluster, heldout, tmp_path, restarts
):
    """Ray restarts it (`cluster.max_restarts`), or, where it may not, the stage starts new
    actors; either way the stage samples its own model."""
    from cluster.kept import kept_actors

    cluster = cluster.model_copy(update={"max_restarts": restarts})
    want = evaluated(evaluate.run(EVAL, other_model, heldout, tmp_path / "local", NullTracker()))
    before = set(sampling_actor_pids())
    with kept_actors(cluster):
        evaluate.run(EVAL, model, heldout, tmp_path / "a", NullTracker(), cluster=cluster)
        victim = one_new_actor(before)
        os.kill(victim, signal.SIGKILL)
        b = evaluate.run(EVAL, other_model, heldout, tmp_path / "b", NullTracker(), cluster=cluster)
        assert victim not in sampling_actor_pids()
    assert evaluated(b) == want


def test_an_actor_that_sees_another_model_fails_at_once_saying_so(model, cluster):
    from cluster.actors import ActorSampler, ModelMismatchError

    one = cluster.model_copy(update={"workers": 1})
    with pytest.raises(ModelMismatchError, match="has digest .* the stage's process has"):
        ActorSampler.start(one, EVAL.sampler, model.path, 8, digest="0" * 64)
    with pytest.raises(ModelMismatchError, match="no model folder at .*shared"):
        ActorSampler.start(one, EVAL.sampler, model.path / "elsewhere", 8)


def test_an_actor_samples_on_the_gpu_ray_gives_it_and_on_cpu_without_one(model, cluster):
    """An actor given a GPU opens its model on cuda: the test cluster's joined node only declares
    one, so here the actor finds no CUDA device and refuses, saying so (on a machine with a GPU
    it samples on it); an actor given none samples on its node's CPU."""
    import torch

    from cluster.actors import ActorSampler
    from models.loading import DeviceError

    one = cluster.model_copy(update={"workers": 1})
    on_cpu = ActorSampler.start(one, EVAL.sampler, model.path, 8)
    try:
        assert [s["device"] for s in on_cpu.startup] == ["cpu"]
    finally:
        on_cpu.close()
    on_gpu = one.model_copy(update={"gpus_per_worker": 1.0})
    if torch.cuda.is_available():
        sampler = ActorSampler.start(on_gpu, EVAL.sampler, model.path, 8)
        try:
            assert [s["device"] for s in sampler.startup] == ["cuda"]
        finally:
            sampler.close()
    else:
        with pytest.raises(DeviceError, match="torch sees no CUDA device"):
            ActorSampler.start(on_gpu, EVAL.sampler, model.path, 8)


def test_a_gpu_run_whose_actors_have_no_gpu_is_warned(monkeypatch, caplog):
    from cluster.actors import _warn_if_gpus_idle
    from models import loading

    config = ClusterConfig(address="auto", workers=3)
    _warn_if_gpus_idle(config)  # trains on cpu: nothing to say
    assert not caplog.records
    monkeypatch.setitem(loading._DEVICE, "name", "cuda")
    with caplog.at_level(logging.WARNING):
        _warn_if_gpus_idle(config)
        _warn_if_gpus_idle(config.model_copy(update={"gpus_per_worker": 1.0}))
    (record,) = caplog.records
    assert "the 3 sampling actors sample on their nodes' CPUs" in record.getMessage()


def test_an_unreachable_cluster_is_a_clear_error_before_anything_runs(tmp_path, monkeypatch):
    from cluster.connect import ClusterUnreachableError
    from configs import load_profile
    from tasks.pipeline import open_state

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = tmp_path / "state"
    monkeypatch.setenv("R1_STATE_DIR", str(state))
    config = load_profile("micro", [f"cluster.address=127.0.0.1:{port}"])
    with pytest.raises(ClusterUnreachableError, match=f"cannot reach the Ray cluster.*{port}"):
        open_state(config, "r1_pipeline")
    assert not state.exists()  # nothing ran, no store was made


def test_sampling_actors_wait_passively_with_their_own_thread_count(model, cluster, monkeypatch):
    """Set in each actor's environment from its start (Ray's runtime environment), before its
    worker loaded torch; the driver's shell set no wait policy."""
    from cluster.actors import ActorSampler

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    sampler = ActorSampler.start(cluster, EVAL.sampler, model.path, 8)
    try:
        threads = cluster.threads_per_worker
        wanted = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}
        wanted |= {"OMP_NUM_THREADS": str(threads)}
        for ready in sampler.startup:
            assert ready["threads"] == wanted | {"torch_threads": threads}
            environ = Path(f"/proc/{ready['pid']}/environ").read_bytes().split(b"\0")
            assert {f"{k}={v}".encode() for k, v in wanted.items()} <= set(environ)
    finally:
        sampler.close()

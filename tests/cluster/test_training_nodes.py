"""A DeepSpeed SFT stage over two torchrun "nodes" on loopback (gloo, DeepSpeed on CPU, one rank
each, static rendezvous with node 0 the master) ends with the weights of one node running two
processes, whether Ray places the nodes or a host list names them; a node whose rank dies is
named in the stage's error, and the retry resumes from the last committed checkpoint."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from configs.cluster import ClusterConfig
from configs.supervised import EngineConfig, SFTConfig
from models.loading import load_model
from models.saved import ModelRef, save_model
from stages import sft
from tests.training.test_deepspeed import (  # noqa: F401 (world: a fixture)
    TRAIN,
    WEIGHT_ATOL,
    Recorder,
    needs_deepspeed,
    world,
)
from training.distributed import WorkerFailedError

pytestmark = [pytest.mark.cluster, pytest.mark.heavy, needs_deepspeed]

CONFIG = SFTConfig(train=TRAIN, engine=EngineConfig(kind="deepspeed", processes=2))
# 24 steps with a checkpoint every 2: the workers are still running when rank 1 is killed
LONG = SFTConfig(
    train=TRAIN.model_copy(update={"epochs": 6, "checkpoint_every": 2}), engine=CONFIG.engine
)
# Node 1 (127.0.0.2, not this machine's name) is started through the remote shell: here bash on
# this machine in place of ssh, which first writes down the launch command it was given.
REMOTE_SHELL = 'printf "%s\\n" "$1" >> "$R1_TEST_REMOTE_LOG" && exec bash -c "$1"'
HOSTS = ClusterConfig(
    nodes=2, hosts=["127.0.0.1", "127.0.0.2"], remote_shell=["bash", "-c", REMOTE_SHELL, "{host}"]
)


@pytest.fixture
def remote_log(tmp_path, monkeypatch) -> Path:
    """Where the remote shell writes each launch command it was given."""
    log = tmp_path / "remote-launches.txt"
    monkeypatch.setenv("R1_TEST_REMOTE_LOG", str(log))
    return log


def assert_two_nodes_ran(remote_log: Path) -> None:
    """Node 1's torchrun went through the remote shell, as one of two nodes: the stage did not
    run both ranks on this machine."""
    (launch,) = remote_log.read_text().splitlines()
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 1" in launch, launch


def weights(ref: ModelRef) -> dict[str, torch.Tensor]:
    return load_model(ref.path).state_dict()


def assert_same_weights(ours: ModelRef, theirs: ModelRef) -> None:
    """Bit for bit: two ranks all-reduce the same gradients over gloo wherever they run."""
    mine, reference = weights(ours), weights(theirs)
    assert mine.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(mine[name], tensor), name


@pytest.fixture(scope="module")
def one_node(world, tmp_path_factory) -> ModelRef:  # noqa: F811
    """The reference: both ranks on this machine under one torchrun."""
    out = tmp_path_factory.mktemp("one-node")
    return sft.run(CONFIG, ModelRef(world["base"]), world["data"], out, Recorder())


def test_two_listed_hosts_train_the_weights_of_one_node(
    world,  # noqa: F811
    one_node,
    tmp_path,
    remote_log,
):
    """Node 1 is started through the remote shell with the environment a rank needs; node 0
    runs directly."""
    recorder = Recorder()
    ref = sft.run(CONFIG, ModelRef(world["base"]), world["data"], tmp_path, recorder, cluster=HOSTS)
    assert sorted(recorder.steps) == list(range(1, 9))
    assert_same_weights(ref, one_node)
    assert_two_nodes_ran(remote_log)


def test_two_ray_nodes_train_the_weights_of_one_node(
    world,  # noqa: F811
    one_node,
    ray_cluster,
    tmp_path,
    caplog,
):
    cluster = ClusterConfig(address=ray_cluster, nodes=2)
    recorder = Recorder()
    with caplog.at_level(logging.INFO, logger="cluster.ray_nodes"):
        ref = sft.run(
            CONFIG, ModelRef(world["base"]), world["data"], tmp_path, recorder, cluster=cluster
        )
    assert sorted(recorder.steps) == list(range(1, 9))
    assert_same_weights(ref, one_node)
    assert "--master_addr 127.0.0.1" in caplog.text  # node 0's address in the cluster
    for rank in (0, 1):  # each node's torchrun, placed by Ray, one rank each
        assert f"node {rank} on " in caplog.text and f"--node_rank {rank} --nproc_per_node 1" in (
            caplog.text
        ), caplog.text


def rank_pid(spec: Path, rank: int) -> int | None:
    """The worker process of global rank `rank` of the launch whose spec is `spec`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = str(spec).encode() in command and b"training.sft_worker" in command
        if ours and f"RANK={rank}".encode() in environ and b"LOCAL_RANK=0" in environ:
            return int(entry.name)
    return None


class KillRankOne(Recorder):
    """Kills rank 1 (node 1's only rank) once rank 0 has logged step 3."""

    def __init__(self, spec: Path):
        super().__init__()
        self.spec, self.killed = spec, 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        if step is not None and step >= 3 and not self.killed:
            pid = rank_pid(self.spec, 1)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                self.killed = pid


def test_a_dead_node_is_named_and_the_retry_resumes(world, ray_cluster, tmp_path):  # noqa: F811
    cluster = ClusterConfig(address=ray_cluster, nodes=2)
    base, data = ModelRef(world["base"]), world["data"]
    straight = sft.run(LONG, base, data, tmp_path / "straight", Recorder())
    killer = KillRankOne(tmp_path / "spread" / "deepspeed" / "spec.json")
    with pytest.raises(WorkerFailedError) as failed:
        sft.run(LONG, base, data, tmp_path / "spread", killer, cluster=cluster)
    assert killer.killed
    message = str(failed.value)
    assert "node 1 failed: node 1 (" in message and "rank 1)" in message
    assert "killed by signal 9" in message
    recorder = Recorder()
    resumed = sft.run(LONG, base, data, tmp_path / "spread", recorder, cluster=cluster)
    first = min(recorder.steps)
    assert 3 <= first <= 24 and first % 2 == 1  # after an even, committed step
    assert max(recorder.steps) == 24
    trained = weights(resumed)  # resuming from a checkpoint: within the suite's tolerance
    for name, tensor in weights(straight).items():
        assert torch.allclose(trained[name], tensor, atol=WEIGHT_ATOL), name


def test_grpo_on_two_listed_hosts_trains_the_weights_of_one_node(tmp_path, remote_log):
    """GRPO's ranks each sample their share of a step with a colocated sampler, on whichever
    node they run: two nodes of one rank end where one node of two ranks ends."""
    from problems.loader import write_problems
    from problems.types import ProblemSet
    from stages import reasoning_rl
    from tests.rl.test_deepspeed_grpo import config as grpo_config
    from tests.tiny_models import PROBLEMS, make_tokenizer, tiny_model

    tokenizer = make_tokenizer()
    base = save_model(tiny_model(tokenizer), tokenizer, tmp_path / "base")
    train = write_problems(tmp_path / "train.jsonl", PROBLEMS)
    problems = ProblemSet(train, train, len(PROBLEMS), 0)
    cfg = grpo_config(2, steps=2)
    one = reasoning_rl.run(cfg, base, problems, tmp_path / "one", Recorder(), "grpo")
    two = reasoning_rl.run(cfg, base, problems, tmp_path / "two", Recorder(), "grpo", cluster=HOSTS)
    assert_same_weights(two, one)
    assert_two_nodes_ran(remote_log)

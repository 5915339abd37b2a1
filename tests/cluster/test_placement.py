"""The cluster section without a cluster: its checks, the launch commands it makes, the failing
node it names, and what it leaves alone (Ray never imported, every stage key unchanged)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from cluster import connect
from cluster.placement import stage_sampler, training_nodes
from configs import ConfigError, load_profile
from configs.cluster import ClusterConfig
from configs.profiles import validate
from configs.reinforcement import EvalConfig
from configs.supervised import EngineConfig
from tasks.context import RunContext
from tasks.stage_cache import stage_key
from training.distributed import Rendezvous, WorkerSpec, launch_command
from training.nodes import HostNodes, NodesGroup, remote_command

ROOT = Path(__file__).resolve().parents[2]


def test_nodes_need_a_launcher_and_ranks_split_evenly():
    with pytest.raises(ValueError, match="set address .* or list one host per node"):
        ClusterConfig(nodes=2)
    with pytest.raises(ValueError, match="not both"):
        ClusterConfig(address="auto", hosts=["a"])
    ClusterConfig(nodes=2, hosts=["a", "b"])
    with pytest.raises(ValueError, match=r"mixed_sft \(3 processes\) do not split evenly"):
        load_profile(
            "micro",
            [
                "cluster.address=auto",
                "cluster.nodes=2",
                "mixed_sft.engine.kind=deepspeed",
                "mixed_sft.engine.processes=3",
                "mixed_sft.train.batch_size=9",
            ],
        )
    with pytest.raises(ValueError, match="set engine.launcher: torchrun for cold_start_sft"):
        load_profile(
            "micro",
            [
                "cluster.address=auto",
                "cluster.nodes=2",
                "cold_start_sft.engine.kind=deepspeed",
                "cold_start_sft.engine.launcher=deepspeed",
            ],
        )


def test_a_ray_setting_without_an_address_is_refused_naming_it():
    """`r1 config --set cluster.workers=8` without cluster.address would change nothing."""
    with pytest.raises(ConfigError, match=r"cluster.workers: only a Ray cluster reads it"):
        load_profile("micro", ["cluster.workers=8"])
    with pytest.raises(ConfigError, match=r"cluster.cpus_per_worker, cluster.workers: .* them"):
        load_profile("micro", ["cluster.workers=8", "cluster.cpus_per_worker=2"])
    assert load_profile("micro", ["cluster.workers=8", "cluster.address=auto"]).cluster.workers == 8
    assert load_profile("micro").cluster.active() is None  # the defaults alone: no cluster
    written = load_profile("micro").model_dump(mode="json")  # every setting named, at its default
    assert validate(written, source="written").cluster == load_profile("micro").cluster


def test_without_a_cluster_the_stage_keys_and_samplers_are_one_machines(tmp_path):
    plain = RunContext(tmp_path, "parent", "flow", "r1-micro")
    placed = RunContext(
        tmp_path, "parent", "flow", "r1-micro", cluster=ClusterConfig(address="h:1", nodes=2)
    )
    parameters = {"config": EvalConfig(), "stage": "bootstrap"}
    assert stage_key("evaluate-model", parameters | {"ctx": plain}) == stage_key(
        "evaluate-model", parameters | {"ctx": placed}
    )
    assert ClusterConfig().active() is None and training_nodes(None) is None
    assert training_nodes(ClusterConfig(address="auto")) is None  # one node: this machine
    assert isinstance(training_nodes(ClusterConfig(nodes=2, hosts=["a", "b"])), HostNodes)


def test_the_default_path_never_imports_ray(tmp_path):
    """A fresh interpreter runs an evaluation's sampler choice and imports every flow: no Ray."""
    script = f"""
import sys
import flows.r1_pipeline, flows.distill, flows.evaluate_registered, flows.r1_zero
from cluster.placement import stage_sampler, training_nodes
from configs import ConfigError, load_profile
from configs.profiles import validate
from configs.reinforcement import SamplerConfig
from models.saved import save_model
from tests.tiny_models import make_tokenizer, tiny_model
tokenizer = make_tokenizer()
ref = save_model(tiny_model(tokenizer), tokenizer, __import__("pathlib").Path({str(tmp_path)!r}))
config = load_profile("tiny", [])
sampler = stage_sampler(SamplerConfig(), ref.path, tokenizer, 8, config.cluster.active())
assert type(sampler).__name__ == "HFSampler", sampler
assert training_nodes(config.cluster.active()) is None
assert "ray" not in sys.modules, "ray was imported"
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_node_launch_is_torchruns_static_rendezvous(tmp_path):
    engine = EngineConfig(kind="deepspeed", processes=4)
    spec = tmp_path / "spec.json"
    one = launch_command(engine, spec, 29555)
    assert one[3:9] == ["--nnodes", "1", "--nproc_per_node", "4", "--master_addr", "127.0.0.1"]
    node = launch_command(engine, spec, 0, "rl.grpo_worker", Rendezvous(2, 1, "10.0.0.5", 29600))
    assert node[:3] == [sys.executable, "-m", "torch.distributed.run"]
    args = dict(zip(node[3:-3:2], node[4:-3:2], strict=True))
    assert args == {
        "--nnodes": "2",
        "--node_rank": "1",
        "--nproc_per_node": "2",
        "--master_addr": "10.0.0.5",
        "--master_port": "29600",
    }
    assert node[-3:] == ["-m", "rl.grpo_worker", str(spec)]


def test_a_remote_node_gets_the_ranks_environment_through_the_shell():
    env = {"PYTHONPATH": "/r1", "OMP_NUM_THREADS": "4", "HOME": "/root", "DS_ACCELERATOR": "cpu"}
    command = remote_command(["python", "-m", "x"], env, "gpu7", ["ssh", "-tt", "{host}"])
    assert command[:3] == ["ssh", "-tt", "gpu7"] and len(command) == 4
    line = command[3]
    assert line.startswith(f"cd {ROOT} && exec env ")
    assert "PYTHONPATH=/r1" in line and "OMP_NUM_THREADS=4" in line and "DS_ACCELERATOR" in line
    assert "HOME" not in line and line.endswith("python -m x")


class FakeNode:
    def __init__(self, rank: int, host: str, statuses: list[int | None], output: str = ""):
        self.rank, self.host, self.statuses = rank, host, statuses
        self.tail = deque(output.splitlines(keepends=True))
        self.stopped = False

    def poll(self) -> int | None:
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def stop(self) -> None:
        self.stopped = True


def test_the_node_whose_rank_died_is_named_before_the_one_that_lost_its_peer(tmp_path):
    spec = WorkerSpec("mixed_sft", "b", "d", {}, str(tmp_path), str(tmp_path), "fp")
    # node 0's rank saw its peer go (a traceback); node 1's rank was killed (torchrun's report)
    spec.error_path(0).write_text("Traceback ...\nRuntimeError: Connection closed by peer\n")
    killed = "torch.distributed.elastic...ChildFailedError\n  exitcode  : -9 (pid: 4242)\n"
    nodes = [
        FakeNode(0, "head", [None, 1]),
        FakeNode(1, "worker-b", [None, None, 1], killed),
    ]
    group = NodesGroup(nodes, ranks_per_node=1)
    assert group.poll() is None  # both still running
    assert group.poll() is None  # node 0 failed: node 1 gets its grace to fail too
    assert group.poll() == 1  # both ended
    message = group.failure(spec)
    assert message.startswith("node 1 failed: node 1 (worker-b, rank 1): a rank was killed by")
    assert "node 0 (head, rank 0): rank 0: " in message and "closed by peer" in message
    group.stop()
    assert all(node.stopped for node in nodes)


def test_every_node_finishing_is_success():
    group = NodesGroup([FakeNode(0, "a", [None, 0]), FakeNode(1, "b", [0])], ranks_per_node=2)
    assert group.poll() is None and group.poll() == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_address_where_nothing_answers_fails_at_once():
    port = free_port()
    with pytest.raises(connect.ClusterUnreachableError, match=f"cannot reach .*127.0.0.1:{port}"):
        connect.check_reachable(f"127.0.0.1:{port}", timeout_s=5)
    with pytest.raises(connect.ClusterUnreachableError, match="not HOST:PORT"):
        connect.check_reachable("nowhere", timeout_s=5)


def test_auto_without_a_joined_cluster_says_how_to_join(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(connect.ClusterUnreachableError, match="ray start --head"):
        connect.head_address("auto")
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert connect.head_address("auto") == "10.1.2.3:6379"


def test_auto_finds_a_cluster_started_under_ray_tmpdir(monkeypatch, tmp_path):
    """`RAY_TMPDIR=/x ray start --head` records the cluster in /x/ray/ray_current_cluster, where
    Ray itself looks for it (read here without Ray when it is not installed)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.9.8.7:6380\n")
    assert connect.head_address("auto") == "10.9.8.7:6380"
    monkeypatch.setitem(sys.modules, "ray._common.utils", None)  # as without Ray: same rule
    assert connect.head_address("auto") == "10.9.8.7:6380"


def test_a_cluster_without_ray_installed_names_the_extra(monkeypatch):
    monkeypatch.setattr(connect.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(connect.RayMissingError, match=r"\.\[cluster\]"):
        connect.connect(ClusterConfig(address="127.0.0.1:1"))


def test_stage_sampler_without_a_cluster_is_the_configured_sampler(tmp_path):
    from configs.reinforcement import SamplerConfig
    from models.saved import save_model
    from sampling.hf import HFSampler
    from tests.tiny_models import make_tokenizer, tiny_model

    tokenizer = make_tokenizer()
    ref = save_model(tiny_model(tokenizer), tokenizer, tmp_path)
    assert isinstance(stage_sampler(SamplerConfig(), ref.path, tokenizer, 8), HFSampler)


def test_where_rollouts_are_drawn_is_no_part_of_a_grpo_key_and_the_staleness_is(tmp_path):
    from tests.tiny_models import grpo_config

    def key(cluster: ClusterConfig | None, **grpo) -> str:
        ctx = RunContext(tmp_path, "parent", "flow", "r1-micro", cluster=cluster)
        return stage_key("grpo", {"config": grpo_config(**grpo), "ctx": ctx, "stage": "rl"})

    stale = {"max_staleness": 1, "importance_sampling_cap": 3.0}
    assert key(None) == key(ClusterConfig(rollouts="process"))
    assert key(None, **stale) == key(ClusterConfig(address="h:1", rollouts="workers"), **stale)
    assert key(None) != key(None, **stale) != key(None, **stale | {"max_staleness": 2})

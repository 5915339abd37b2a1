"""A Ray cluster of two nodes on loopback, started and stopped by the tests that use it.

Two raylets (a head and one joined node, one CPU each, the joined node declaring one GPU, object
stores capped at 100 MiB, usage statistics off) in a temporary folder of their own. The fixture
shuts down exactly the cluster it started (`Cluster.shutdown`), never `ray stop`, which would end
every Ray process on the machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

OBJECT_STORE = 100 * 2**20
# Read when Ray is imported, so set before any test imports it: every address of the test
# cluster (its nodes', and so the training rendezvous's) on 127.0.0.1, no usage statistics.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"


@pytest.fixture(scope="package")
def ray_cluster():
    """The two-node cluster's address ('127.0.0.1:PORT'), shared by this folder's tests and
    shut down when they are done, before any other test (tests/reliability/test_sandbox.py
    checks that the test process has no child left)."""
    pytest.importorskip("ray", reason="the cluster extra is not installed (scripts/setup.sh)")
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="r1ray-", dir="/tmp")  # short: Ray's socket paths are capped
    # Ray writes the cluster's address into its default temp folder whatever temp_dir says
    # (ray_current_cluster): that folder is ours too, so nothing outside it is touched, and a
    # fresh machine without /tmp/ray works
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    os.makedirs(os.path.join(temp, "ray"), exist_ok=True)
    node = {"num_cpus": 1, "object_store_memory": OBJECT_STORE}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "include_dashboard": False, "temp_dir": temp},
    )
    try:
        # the joined node declares one GPU (none is there): an actor that asks for it is
        # placed and then finds no CUDA device (test_sampling_on_actors.py)
        cluster.add_node(**node, num_gpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        from cluster.connect import disconnect

        disconnect()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before

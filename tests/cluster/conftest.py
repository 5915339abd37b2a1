"""A Ray cluster of two nodes on loopback, started and stopped by the tests that use it.

Two raylets (a head and one joined node, one CPU each, object stores capped at 100 MiB, usage
statistics off) in a temporary folder of their own. The fixture shuts down exactly the cluster
it started (`Cluster.shutdown`), never `ray stop`, which would end every Ray process on the
machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

OBJECT_STORE = 100 * 2**20
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # read on Linux too: every address on 127.0.0.1
    "RAY_USAGE_STATS_ENABLED": "0",
    "TQDM_DISABLE": "1",
}


@pytest.fixture(scope="session")
def ray_cluster():
    """The two-node cluster's address ('127.0.0.1:PORT'); this process is not joined to it."""
    pytest.importorskip("ray", reason="the cluster extra is not installed (scripts/setup.sh)")
    from ray.cluster_utils import Cluster

    saved = {key: os.environ.get(key) for key in RAY_ENV}
    os.environ.update(RAY_ENV)
    temp = tempfile.mkdtemp(prefix="r1ray-", dir="/tmp")  # short: Ray's socket paths are capped
    node = {"num_cpus": 1, "object_store_memory": OBJECT_STORE}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "include_dashboard": False, "temp_dir": temp},
    )
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        from cluster.connect import disconnect

        disconnect()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

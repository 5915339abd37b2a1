"""Joining the Ray cluster a profile names, once per process, and checking before anything runs
that it answers and has room for what the profile asks.

`ray.init` on an address where nothing answers does not fail: it retries for minutes. So the
head's port is tried first with a plain TCP connection under `cluster.connect_timeout_s`, and
`ray.init` itself runs under that limit too.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

from configs.cluster import ClusterConfig

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install the cluster extra: `pip install -c constraints/cpu.lock -e '.[cluster]'` "
    "(scripts/setup.sh installs it), on every machine of the cluster"
)
NAMESPACE = "r1-pipeline"

_joined: dict[str, str] = {}  # the address this process's Ray connection was made to


class RayMissingError(ImportError):
    """A cluster is configured but the ray package is not installed."""


class ClusterUnreachableError(ConnectionError):
    """The configured Ray cluster does not answer, or lacks room for what the profile asks."""


def require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise RayMissingError(f"cluster.address is set but Ray is not installed: {INSTALL_HINT}")


def current_cluster_file() -> Path:
    """Ray's own record of the cluster this machine started or joined (`ray start`), where Ray
    itself looks for it: under `$RAY_TMPDIR/ray/`, else `$TMPDIR/ray/` (Linux), else /tmp/ray/
    (`ray._common.utils.get_ray_address_file`, read through Ray when it is installed)."""
    try:
        from ray._common.utils import get_ray_address_file
    except ImportError:
        base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
        return Path(base) / "ray" / "ray_current_cluster"
    return Path(get_ray_address_file(None))


def head_address(address: str) -> str:
    """HOST:PORT of the head: `address` itself, or for 'auto' what RAY_ADDRESS or Ray's record
    of the cluster this machine joined says."""
    if address != "auto":
        return address.removeprefix("ray://")
    record = current_cluster_file()
    found = os.environ.get("RAY_ADDRESS") or (record.read_text().strip() if record.exists() else "")
    if not found or found == "auto":
        raise ClusterUnreachableError(
            "cluster.address is 'auto' but this machine has not joined a Ray cluster (no "
            f"RAY_ADDRESS, no {record}): run `ray start --head` here, or "
            "`ray start --address HEAD:6379` to join one, or set cluster.address=HOST:PORT"
        )
    return found


def check_reachable(address: str, timeout_s: float) -> str:
    """The head's HOST:PORT, after a TCP connection to it succeeded within `timeout_s`."""
    head = head_address(address)
    host, _, port = head.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterUnreachableError(f"cluster.address {address!r} is not HOST:PORT or 'auto'")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ClusterUnreachableError(
            f"cannot reach the Ray cluster's head at {head} (cluster.address {address!r}): "
            f"{error}. Start one with `ray start --head --port {port}` on that machine, or fix "
            "cluster.address; nothing has run"
        ) from error
    return head


def connect(cluster: ClusterConfig) -> Any:
    """Ray, joined to `cluster.address` (once per process; a different address reconnects)."""
    require_ray()
    import ray

    assert cluster.address is not None
    head = check_reachable(cluster.address, cluster.connect_timeout_s)
    if ray.is_initialized():
        if _joined.get("address") == head:
            return ray
        ray.shutdown()
    outcome: dict[str, BaseException | None] = {"error": None}

    def join() -> None:
        try:
            ray.init(
                address=head,
                namespace=NAMESPACE,
                log_to_driver=False,  # actors' logs stay in each node's Ray session folder
                logging_level=logging.WARNING,
                configure_logging=False,
            )
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=join, name="ray-init", daemon=True)
    thread.start()
    thread.join(cluster.connect_timeout_s)
    if thread.is_alive() or outcome["error"] is not None:
        why = outcome["error"] or f"no answer within {cluster.connect_timeout_s:g} s"
        raise ClusterUnreachableError(
            f"joining the Ray cluster at {head} failed: {why} (cluster.connect_timeout_s)"
        )
    _joined["address"] = head
    log.info("joined the Ray cluster at %s: %s", head, ray.cluster_resources())
    return ray


def check_room(cluster: ClusterConfig) -> dict[str, float]:
    """Fail, naming what is missing, when the cluster's nodes cannot hold the sampling actors or
    the training nodes the profile asks for; returns the cluster's resources."""
    ray = connect(cluster)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    wanted_cpus = cluster.workers * cluster.cpus_per_worker
    wanted_gpus = cluster.workers * cluster.gpus_per_worker
    problems = []
    if total.get("CPU", 0) < wanted_cpus:
        problems.append(f"{wanted_cpus:g} CPUs for {cluster.workers} sampling actors")
    if total.get("GPU", 0) < wanted_gpus:
        problems.append(f"{wanted_gpus:g} GPUs for {cluster.workers} sampling actors")
    if len(nodes) < cluster.nodes:
        problems.append(f"{cluster.nodes} nodes for training")
    if problems:
        raise ClusterUnreachableError(
            f"the Ray cluster at {_joined['address']} has {len(nodes)} nodes and "
            f"{ {k: v for k, v in total.items() if k in ('CPU', 'GPU')} }, not "
            f"{' and '.join(problems)} (cluster.workers, cpus_per_worker, gpus_per_worker, "
            "nodes): add nodes or ask for less; nothing has run"
        )
    return total


def disconnect() -> None:
    """Leave the cluster (the cluster itself keeps running)."""
    if importlib.util.find_spec("ray") is None:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _joined.clear()

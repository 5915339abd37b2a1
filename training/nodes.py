"""A DeepSpeed stage's ranks over several machines: one torchrun per node under a static
rendezvous whose master is node 0 (training.distributed `launch_command`), each node running
`engine.processes / nodes` ranks; global rank r runs on node r // (processes / nodes).

Two ways to start the nodes: Ray places them (cluster.nodes, a placement group with one bundle
per node), or a fixed list of hosts, each reached through a remote shell (`HostNodes`, ssh by
default; this machine's own host names run directly). Either way the nodes' launchers are
watched together here: the first node that fails ends the launch, the others are stopped, and
the error names that node (its host and ranks) and its error. A node whose ranks only saw a
peer go away (a closed connection in a collective) is named after the one that caused it.

The run folder (spec, metrics, result, checkpoints) must be on a filesystem every node sees at
the same path: rank 0 writes the result and the ranks their checkpoint shards there.
"""

from __future__ import annotations

import logging
import re
import shlex
import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from configs.supervised import EngineConfig
from training.distributed import (
    ERROR_LINES,
    ProcessGroup,
    Rendezvous,
    WorkerSpec,
    free_port,
    launch_command,
    worker_env,
)

log = logging.getLogger(__name__)

FAILURE_GRACE_S = 5.0  # after a node fails, how long the others get to leave their own errors
DEFAULT_MASTER_PORT = 29500  # torchrun's default, when node 0 is not this machine
# what a rank raises when a peer went away: a consequence of another node's failure
PEER_LOST = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Connection refused|"
    r"NCCL (error|communicator)|ProcessGroup\w* .*(abort|timeout)|timed out|Socket Timeout",
    re.IGNORECASE,
)
EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
# Variables a rank needs from worker_env on a host reached by a remote shell
FORWARDED_PREFIXES = (
    "PYTHONPATH", "DS_", "OMP_", "TOKENIZERS_", "HF_", "TRANSFORMERS_", "NCCL_", "GLOO_",
)  # fmt: skip


class Node(Protocol):
    """One node's launcher, wherever it runs."""

    rank: int
    host: str
    tail: deque[str]

    def poll(self) -> int | None: ...

    def stop(self) -> None: ...


@dataclass
class NodesGroup:
    """Every node's launcher of one launch, watched as one (a WorkerGroup)."""

    nodes: Sequence[Node]
    ranks_per_node: int
    failed_at: dict[int, float] = field(default_factory=dict)  # node rank -> when seen failing

    def poll(self) -> int | None:
        statuses = [node.poll() for node in self.nodes]
        now = time.monotonic()
        for node, status in zip(self.nodes, statuses, strict=True):
            if status not in (None, 0) and node.rank not in self.failed_at:
                self.failed_at[node.rank] = now
                log.error("node %d (%s) failed with status %s", node.rank, node.host, status)
        if not self.failed_at:
            return 0 if all(s == 0 for s in statuses) else None
        settled = all(s is not None for s in statuses)
        if settled or now - min(self.failed_at.values()) > FAILURE_GRACE_S:
            status = statuses[self.first_failed()]
            return status if status else 1
        return None

    def first_failed(self) -> int:
        return min(self.failed_at, key=self.failed_at.__getitem__)

    @property
    def tail(self) -> deque[str]:
        """The output of the node that failed first, else of node 0."""
        return self.nodes[self.first_failed() if self.failed_at else 0].tail

    def failure(self, spec: WorkerSpec) -> str:
        """The failing node first (one whose ranks did not merely lose a peer), then the rest."""
        reasons = {rank: self.reason(rank, spec) for rank in self.failed_at}
        order = sorted(
            reasons,
            key=lambda r: (bool(PEER_LOST.search(reasons[r])), self.failed_at[r]),
        )
        lines = [self.describe(rank, reasons[rank]) for rank in order]
        head = f"node {order[0]} failed" if order else "a node failed"
        return head + ": " + "\n".join(lines)

    def describe(self, rank: int, reason: str) -> str:
        node = self.nodes[rank]
        first = rank * self.ranks_per_node
        ranks = (
            f"rank {first}"
            if self.ranks_per_node == 1
            else (f"ranks {first}-{first + self.ranks_per_node - 1}")
        )
        return f"node {rank} ({node.host}, {ranks}): {reason}"

    def reason(self, rank: int, spec: WorkerSpec) -> str:
        """A node's error: its ranks' tracebacks, else how torchrun saw them end."""
        first = rank * self.ranks_per_node
        for r in range(first, first + self.ranks_per_node):
            path = spec.error_path(r)
            if path.exists():
                lines = path.read_text().rstrip().splitlines()[-ERROR_LINES:]
                return f"rank {r}: " + "\n".join(lines)
        output = "".join(self.nodes[rank].tail)
        codes = [int(c) for c in EXITCODE.findall(output)]
        signalled = [c for c in codes if c < 0]
        if signalled:
            code = signalled[0]
            return f"a rank was killed by signal {-code} (torchrun: exitcode {code})"
        last = [line.rstrip() for line in self.nodes[rank].tail if line.strip()][-ERROR_LINES:]
        return "its launcher ended with no rank error; its last output:\n" + "\n".join(last)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@dataclass
class HostProcess:
    """A node's torchrun started from this machine, directly or through a remote shell."""

    rank: int
    host: str
    group: ProcessGroup

    @property
    def tail(self) -> deque[str]:
        return self.group.tail

    def poll(self) -> int | None:
        return self.group.poll()

    def stop(self) -> None:
        self.group.stop()


def is_this_machine(host: str) -> bool:
    return host in {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}


def remote_command(
    command: list[str], env: dict[str, str], host: str, shell: Sequence[str]
) -> list[str]:
    """`command` run on `host` through `shell` (`{host}` replaced), with the variables a rank
    needs from `env` set in front, and started in this checkout's folder."""
    forwarded = [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(FORWARDED_PREFIXES)]
    root = Path(__file__).resolve().parents[1]
    line = f"cd {shlex.quote(str(root))} && exec " + shlex.join(["env", *forwarded, *command])
    return [part.replace("{host}", host) for part in shell] + [line]


class HostNodes:
    """Nodes on a fixed list of hosts (node 0, the master, first), without Ray."""

    def __init__(self, hosts: Sequence[str], shell: Sequence[str]):
        self.hosts, self.shell = list(hosts), list(shell)

    def start(self, spec: WorkerSpec, spec_path: Path, engine: EngineConfig) -> NodesGroup:
        master = self.hosts[0]
        port = engine.master_port or (
            free_port() if is_this_machine(master) else DEFAULT_MASTER_PORT
        )
        env = worker_env(engine)
        nodes: list[Node] = []
        try:
            for rank, host in enumerate(self.hosts):
                rendezvous = Rendezvous(len(self.hosts), rank, master, port)
                command = launch_command(engine, spec_path, port, spec.module, rendezvous)
                if not is_this_machine(host):
                    command = remote_command(command, env, host, self.shell)
                log.info("%s: node %d on %s: %s", spec.desc, rank, host, shlex.join(command))
                group = ProcessGroup(command, env, spec.desc, f"node {rank}")
                nodes.append(HostProcess(rank, host, group))
        except BaseException:
            for node in nodes:
                node.stop()
            raise
        return NodesGroup(nodes, engine.processes // len(self.hosts))

"""Training nodes placed by Ray: a placement group with one bundle per node (STRICT_SPREAD: no
two on one machine), each bundle holding the node's ranks' CPUs and GPUs, and in each bundle an
agent actor that starts that node's torchrun (training.distributed `launch_command`, static
rendezvous) and reports its output. Node 0's agent names the master: its machine's address and
a free port there. The stage's process watches the agents as it watches local workers
(training.nodes `NodesGroup`): a failing node is named; an agent that dies (its machine lost)
is a failed node. The torchrun an agent started dies with the agent (parent-death signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import shlex
import signal
import socket
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.actors import actor_env
from configs.cluster import ClusterConfig
from configs.supervised import EngineConfig
from training.distributed import (
    TAIL_LINES,
    ProcessGroup,
    Rendezvous,
    WorkerSpec,
    launch_command,
    worker_env,
)
from training.nodes import NodesGroup

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 60.0  # one call to a node's agent (start, poll, stop)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the launched torchrun, before exec: SIGTERM when the agent that started it dies."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class NodeAgent:
    """A node's torchrun launcher (a Ray actor in the node's bundle)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.group: ProcessGroup | None = None
        self.fresh: deque[str] = deque()  # filled by the output reader, drained by poll

    def address(self, port: int | None) -> tuple[str, int, str]:
        """The address this node has in the cluster (the one its raylet registered, which the
        other nodes reach it by), a free port on it, and its host name."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        (address,) = [n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id]
        if port is None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((address, 0))
                port = int(sock.getsockname()[1])
        return address, port, socket.gethostname()

    def start(
        self,
        spec_path: str,
        engine: EngineConfig,
        module: str,
        rendezvous: Rendezvous,
        desc: str,
        threads: int,
    ) -> list[str]:
        port = rendezvous.master_port
        command = launch_command(engine, Path(spec_path), port, module, rendezvous)
        env = worker_env(engine)  # this node's checkout and interpreter
        env["OMP_NUM_THREADS"] = str(threads)  # Ray set the agent's to its whole bundle
        self.group = ProcessGroup(
            command,
            env,
            desc,
            f"node {self.rank}",
            on_line=self.fresh.append,
            preexec_fn=_die_with_parent,
        )
        return command

    def poll(self) -> tuple[int | None, list[str]]:
        """The launcher's status (None: running) and the lines it wrote since the last poll."""
        assert self.group is not None
        status = self.group.poll()
        if status is not None:
            self.group.reader.join(timeout=10)  # its last lines
        lines = []
        while self.fresh:
            lines.append(self.fresh.popleft())
        return status, lines

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()


@dataclass
class RayNode:
    """The stage's handle on one node's agent (a training.nodes Node)."""

    ray: Any
    rank: int
    host: str
    agent: Any
    tail: deque[str]
    desc: str
    lost: str = ""

    def poll(self) -> int | None:
        from ray.exceptions import GetTimeoutError, RayActorError

        if self.lost:
            return 1
        try:
            status, lines = self.ray.get(self.agent.poll.remote(), timeout=RPC_TIMEOUT_S)
        except (RayActorError, GetTimeoutError) as error:
            self.lost = f"its Ray agent is gone (the machine left the cluster?): {error}"
            self.tail.append(self.lost + "\n")
            return 1
        for line in lines:
            self.tail.append(line)
            log.info("%s [node %d] %s", self.desc, self.rank, line.rstrip())
        return status

    def stop(self) -> None:
        from ray.exceptions import GetTimeoutError, RayActorError

        with contextlib.suppress(RayActorError, GetTimeoutError):
            self.ray.get(self.agent.stop.remote(), timeout=RPC_TIMEOUT_S)
        self.ray.kill(self.agent, no_restart=True)


@dataclass
class RayGroup(NodesGroup):
    """The nodes' launchers, and the placement group that holds them until they stop."""

    ray: Any = None
    group: Any = None

    def stop(self) -> None:
        super().stop()
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None


class RayNodes:
    """Places a stage's `engine.processes` ranks on `cluster.nodes` machines of the cluster."""

    def __init__(self, cluster: ClusterConfig):
        self.cluster = cluster

    def bundle(self, engine: EngineConfig) -> dict[str, float]:
        per_node = engine.processes // self.cluster.nodes
        bundle = {"CPU": per_node * self.cluster.cpus_per_rank}
        if self.cluster.gpus_per_rank:
            bundle["GPU"] = per_node * self.cluster.gpus_per_rank
        return bundle

    def start(self, spec: WorkerSpec, spec_path: Path, engine: EngineConfig) -> RayGroup:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from cluster import kept
        from cluster.connect import ClusterUnreachableError, connect

        ray = connect(self.cluster)
        kept.release(f"{spec.desc} places its training nodes")  # their CPUs and GPUs
        n, bundle = self.cluster.nodes, self.bundle(engine)
        group = placement_group([dict(bundle) for _ in range(n)], strategy="STRICT_SPREAD")
        if not group.wait(timeout_seconds=self.cluster.place_timeout_s):
            remove_placement_group(group)
            raise ClusterUnreachableError(
                f"{spec.desc}: the Ray cluster has no room for {n} training nodes of {bundle} "
                f"each on distinct machines within {self.cluster.place_timeout_s:g} s "
                "(cluster.nodes, cpus_per_rank, gpus_per_rank, place_timeout_s)"
            )
        # each agent takes its whole bundle: Ray then hands its processes the bundle's GPUs
        remote = ray.remote(max_restarts=0)(NodeAgent)
        agents = [
            remote.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, i),
                runtime_env=actor_env(1),  # the agent waits; its ranks get their own threads
            ).remote(i)
            for i in range(n)
        ]
        try:
            return self._launch(ray, agents, group, spec, spec_path, engine)
        except BaseException:
            for agent in agents:
                ray.kill(agent, no_restart=True)
            remove_placement_group(group)
            raise

    def _launch(
        self,
        ray: Any,
        agents: list[Any],
        group: Any,
        spec: WorkerSpec,
        spec_path: Path,
        engine: EngineConfig,
    ) -> RayGroup:
        places = ray.get(
            [
                agent.address.remote(engine.master_port if i == 0 else None)
                for i, agent in enumerate(agents)
            ],
            timeout=RPC_TIMEOUT_S + self.cluster.place_timeout_s,
        )
        master, port, _ = places[0]
        threads = max(1, int(self.cluster.cpus_per_rank))
        nodes = []
        for rank, (agent, (address, _, host)) in enumerate(zip(agents, places, strict=True)):
            rendezvous = Rendezvous(len(agents), rank, master, port)
            command = ray.get(
                agent.start.remote(
                    str(spec_path), engine, spec.module, rendezvous, spec.desc, threads
                ),
                timeout=RPC_TIMEOUT_S,
            )
            launch = shlex.join(command)
            log.info("%s: node %d on %s (%s): %s", spec.desc, rank, host, address, launch)
            nodes.append(
                RayNode(ray, rank, f"{host} {address}", agent, deque(maxlen=TAIL_LINES), spec.desc)
            )
        per_node = engine.processes // len(agents)
        return RayGroup(nodes, per_node, ray=ray, group=group)

"""DeepSpeed ZeRO training for a stage (`engine.kind: deepspeed`): the launch of the worker
processes from the stage's own process, and what the two sides share.

The stage writes a spec file into a run folder and launches `training.sft_worker` under
torchrun (or the DeepSpeed launcher) as a child process, or, over several machines, one torchrun
per node that a `NodeLauncher` starts (training.nodes, cluster.ray_nodes). Rank 0 of the
workers appends each logged step to `metrics.jsonl`, which the stage forwards to its tracker
while the workers run, and writes `result.json` at the end (or the non-finite value that stopped
it). The workers' output is logged here, and its tail goes into the error when they fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from configs.supervised import EngineConfig
from host.threads import child_env, share
from training.examples import IGNORE, Example
from training.finite import NonFiniteLossError

log = logging.getLogger(__name__)

WORKER_MODULE = "training.sft_worker"
ROOT = Path(__file__).resolve().parents[1]
INSTALL_HINT = (
    "install it with the dev extra (`pip install -c constraints/cpu.lock -e '.[dev]'`, which "
    "scripts/setup.sh runs) or alone (`pip install -c constraints/cpu.lock deepspeed`)"
)
TAIL_LINES = 60
ERROR_LINES = 12
STOP_GRACE_S = 15.0


class DeepSpeedMissingError(ImportError):
    """`engine.kind: deepspeed` was asked for but the deepspeed package is not installed."""


class WorkerFailedError(RuntimeError):
    """The DeepSpeed worker processes exited with an error or ran past the engine's timeout."""


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker rank needs to rebuild the stage's training run; written as JSON."""

    desc: str
    base: str  # the model folder to start from
    dataset: str  # the saved dataset with `question` and `completion` columns
    config: dict[str, Any]  # the stage config, `model_dump(mode="json")`
    out_dir: str  # the stage folder; the model goes to `out_dir/model`
    run_dir: str  # spec, metrics and result files of this launch
    fingerprint: str
    module: str = WORKER_MODULE  # the worker's entry point: `python -m MODULE SPEC`
    extras: dict[str, str] = field(default_factory=dict)  # what a particular worker also needs

    @property
    def metrics_path(self) -> Path:
        return Path(self.run_dir) / "metrics.jsonl"

    @property
    def result_path(self) -> Path:
        return Path(self.run_dir) / "result.json"

    def error_path(self, rank: int) -> Path:
        """Where rank `rank` leaves the traceback of the error that stopped it."""
        return Path(self.run_dir) / f"error-rank{rank}.txt"

    def write(self) -> Path:
        path = Path(self.run_dir) / "spec.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: Path) -> WorkerSpec:
        return cls(**json.loads(Path(path).read_text()))


# --- the stage's side: launch, watch, forward ---------------------------------------------------


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def require_deepspeed() -> None:
    """Fail at once, naming the install, when deepspeed is not importable here."""
    if not deepspeed_installed():
        raise DeepSpeedMissingError(
            f"engine.kind 'deepspeed' needs the deepspeed package: {INSTALL_HINT}"
        )


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Rendezvous:
    """One node's place in a launch over several machines: torchrun's static rendezvous, whose
    master (the TCP store, and global rank 0) is node 0 at `master_addr:master_port`."""

    nodes: int
    node_rank: int
    master_addr: str
    master_port: int


def launch_command(
    engine: EngineConfig,
    spec_path: Path,
    port: int,
    module: str = WORKER_MODULE,
    node: Rendezvous | None = None,
) -> list[str]:
    """The launcher command line for `engine.processes` workers of `module` on this machine, or,
    with `node`, for that node's share of them (ranks `node_rank * share` on), under torchrun."""
    if node is not None:
        share = str(engine.processes // node.nodes)
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(node.nodes)]
        launcher += ["--node_rank", str(node.node_rank), "--nproc_per_node", share]
        launcher += ["--master_addr", node.master_addr, "--master_port", str(node.master_port)]
        return [*launcher, "-m", module, str(spec_path)]
    n = str(engine.processes)
    if engine.launcher == "deepspeed":
        launcher = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", n]
        launcher += ["--master_addr", "127.0.0.1", "--master_port", str(port)]
        launcher += ["--log_level", "warning", "--no_local_rank", "--module"]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
        launcher += ["--nproc_per_node", n, "--master_addr", "127.0.0.1"]
        launcher += ["--master_port", str(port), "-m"]
    return [*launcher, module, str(spec_path)]


# A process's place in a launch (torch.distributed's and torchelastic's variables, and vLLM's
# in-process switch, which an in-process engine writes): a launcher sets its workers' own, and
# an inherited one would make them join the wrong group or run a later engine in-process.
LAUNCH_VARIABLES = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"}
    | {"ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"}
    | {"VLLM_ENABLE_V1_MULTIPROCESSING", "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE"}
)
LAUNCH_PREFIXES = ("TORCHELASTIC_",)


def clean_environment(environ: dict[str, str]) -> dict[str, str]:
    """`environ` without a launch's variables (LAUNCH_VARIABLES, LAUNCH_PREFIXES)."""
    return {
        key: value
        for key, value in environ.items()
        if key not in LAUNCH_VARIABLES and not key.startswith(LAUNCH_PREFIXES)
    }


def worker_env(engine: EngineConfig) -> dict[str, str]:
    """The workers' environment: this process's, without the variables of a launch it may be
    part of; this checkout importable, the CPU accelerator named when there is no GPU
    (DeepSpeed otherwise warns that it guessed), this machine's CPUs shared out between the
    ranks, each waiting passively (host/threads.py)."""
    env = clean_environment(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return child_env(share(engine.processes), env)


class MetricsTail:
    """Reads the lines rank 0 has appended to `metrics.jsonl` since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def new_records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        self.offset += len(complete)
        return [json.loads(line) for line in complete.decode().splitlines() if line.strip()]


class WorkerGroup(Protocol):
    """The launched workers of one stage, on this machine or over several nodes."""

    tail: deque[str]  # their last lines of output

    def poll(self) -> int | None:
        """None while they run; then 0 if every worker finished, else a failing status."""
        ...

    def failure(self, spec: WorkerSpec) -> str:
        """What failed, naming where ('' when the rank error files say it all)."""
        ...

    def stop(self) -> None:
        """Stop whatever still runs (nothing when all have ended)."""
        ...


class NodeLauncher(Protocol):
    """Starts a stage's workers across nodes (training.nodes, cluster.nodes)."""

    def start(self, spec: WorkerSpec, spec_path: Path, engine: EngineConfig) -> WorkerGroup: ...


class LocalLauncher:
    """`engine.processes` workers on this machine under one launcher process."""

    def start(self, spec: WorkerSpec, spec_path: Path, engine: EngineConfig) -> WorkerGroup:
        port = engine.master_port or free_port()
        command = launch_command(engine, spec_path, port, spec.module)
        log.info("%s: launching %d DeepSpeed workers: %s", spec.desc, engine.processes, command)
        return ProcessGroup(command, worker_env(engine), spec.desc)


def run_workers(
    spec: WorkerSpec,
    engine: EngineConfig,
    log_metrics: Callable[[dict[str, float], int], None],
    nodes: NodeLauncher | None = None,
) -> dict[str, Any]:
    """Launch the workers for `spec` (on this machine, or across the nodes that `nodes` starts),
    forward their metrics while they run and return rank 0's result. A non-finite loss in the
    workers raises NonFiniteLossError here; any other failure (or the timeout) raises
    WorkerFailedError with the tail of their output and, over nodes, the node that failed."""
    require_deepspeed()
    spec_path = spec.write()
    for stale in (spec.metrics_path, spec.result_path, *Path(spec.run_dir).glob("error-*")):
        stale.unlink(missing_ok=True)
    metrics = MetricsTail(spec.metrics_path)
    group = (nodes or LocalLauncher()).start(spec, spec_path, engine)
    try:
        deadline = time.monotonic() + engine.timeout_s
        while (status := group.poll()) is None:
            _forward(metrics, log_metrics)
            if time.monotonic() > deadline:
                raise WorkerFailedError(
                    f"{spec.desc}: the DeepSpeed workers ran past engine.timeout_s "
                    f"({engine.timeout_s:g} s) and were stopped (raise it and run again: the "
                    "stage resumes from its last checkpoint); their last output:\n"
                    + "".join(group.tail)
                )
            time.sleep(0.2)
        _forward(metrics, log_metrics)
    finally:
        group.stop()
    return _result(spec, status, group.tail, group.failure(spec) if status else "")


class ProcessGroup:
    """A launcher process on this machine, in its own process group, its output logged (or
    handed to `on_line`) and kept in `tail`."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        desc: str,
        label: str = "workers",
        on_line: Callable[[str], None] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ):
        self.desc, self.label = desc, label
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.on_line = on_line or self._log
        self.process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, so a stop reaches every worker
            preexec_fn=preexec_fn,
        )
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def poll(self) -> int | None:
        return self.process.poll()

    def failure(self, spec: WorkerSpec) -> str:
        return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            _stop(self.process)
        self.reader.join(timeout=10)

    def _log(self, line: str) -> None:
        log.info("%s [%s] %s", self.desc, self.label, line.rstrip())

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.tail.append(line)
            self.on_line(line)


def _stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the launcher's process group, then SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _forward(metrics: MetricsTail, log_metrics: Callable[[dict[str, float], int], None]) -> None:
    for record in metrics.new_records():
        log_metrics(record["metrics"], record["step"])


def _result(spec: WorkerSpec, returncode: int, tail: deque[str], where: str = "") -> dict[str, Any]:
    result = json.loads(spec.result_path.read_text()) if spec.result_path.exists() else {}
    if result.get("non_finite"):
        bad = result["non_finite"]
        raise NonFiniteLossError(spec.desc, bad["step"], bad["what"], bad["value"])
    if returncode != 0 or result.get("fingerprint") != spec.fingerprint:
        cause = f"; {where}" if where else _first_error(spec)
        raise WorkerFailedError(
            f"{spec.desc}: the DeepSpeed workers exited with status {returncode} "
            f"(spec {Path(spec.run_dir) / 'spec.json'}){cause}\n"
            "their last output:\n" + "".join(tail)
        )
    return result


def _first_error(spec: WorkerSpec) -> str:
    """The last lines of the traceback a worker rank left, lowest rank first; '' if none."""
    errors = sorted(Path(spec.run_dir).glob("error-rank*.txt"))
    if not errors:
        return ""
    lines = errors[0].read_text().rstrip().splitlines()[-ERROR_LINES:]
    return f"; {errors[0].stem}:\n" + "\n".join(lines)


# --- what the workers share with the stage ------------------------------------------------------


def rank_share(batch: list[Example], rank: int, world: int) -> list[Example]:
    """Rank `rank`'s contiguous share of a global batch (its size divides evenly)."""
    size = len(batch) // world
    return batch[rank * size : (rank + 1) * size]


def target_count(batch: list[Example]) -> int:
    """Tokens the causal-LM loss averages over in `batch`: labels after the first that are not
    IGNORE (the model predicts token t+1 from position t)."""
    return sum(sum(label != IGNORE for label in e.labels[1:]) for e in batch)

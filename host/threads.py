"""How the project's processes use the CPU: how many threads each runs, and how they wait.

torch's CPU build runs its parallel regions on OpenMP (GNU libgomp). By default a libgomp thread
that waits for the others spins for a while before it sleeps. Alone on its cores that costs
little; beside any other busy process it is a collapse, not a slowdown: a spinning thread holds
a core that the thread it waits for needs (on 2 shared cores a 2-thread torch loop ran at 1.2
steps/s with the defaults, 139 with passive waiting). So every process the project starts waits
passively after a short spin, and runs as many threads as the CPUs it may really use (DeepSpeed
ranks share them out).

Why a short spin and not none: on these machines a sleeping thread takes long to wake, and a
step's many parallel regions each pay it. Alone, the base's pretraining took 10-13 s with the
default spin, 12-15 s passive, 10-12 s after 1,000 polls; two at once, 1.4x (passive), 1.7x
(1,000 polls), 2.1x (3,000) each their time alone, and 4.4x with the default spin
(docs/sharing.md, `python -m benchmarks.sharing`).

libgomp reads `OMP_WAIT_POLICY` and `GOMP_SPINCOUNT` once, when it loads (with `import torch`):
they must be in a process's environment before it imports torch. An entry point calls
`settle_process()` first thing; a process the project starts gets `child_env(threads)` as its
environment. A wait policy or spin count the user set is kept.

This module imports nothing heavy (no torch at module level): it runs before torch is loaded.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_ENV = "GOMP_SPINCOUNT"  # libgomp's polls before it sleeps; it takes this over the policy's
THREADS_ENV = "OMP_NUM_THREADS"
PASSIVE = "PASSIVE"
SHORT_SPIN = "1000"  # a few microseconds: alone, a partner thread is often there by then
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def affinity_cpus() -> int:
    """The CPUs this process may be scheduled on (its affinity mask; all of them where the
    platform has no such call)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup and its ancestors, in CPUs (the tightest one),
    or None where there is none. cgroup v2 (`cpu.max`: "QUOTA PERIOD" or "max PERIOD") and v1
    (`cpu.cfs_quota_us` / `cpu.cfs_period_us`, -1 for none) are both read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and not controllers:  # v2: one hierarchy, `cpu.max` in each folder
            limits += _v2_limits(root, path)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own mount
            for mount in dict.fromkeys((root / controllers, root / "cpu")):
                limits += _v1_limits(mount, path)
    return min(limits) if limits else None


def _ancestors(base: Path, path: str) -> list[Path]:
    """`base/path` and each folder above it up to `base`."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_limits(root: Path, path: str) -> list[float]:
    found = []
    for folder in _ancestors(root, path):
        try:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max" and float(period) > 0:
            found.append(float(quota) / float(period))
    return found


def _v1_limits(base: Path, path: str) -> list[float]:
    found = []
    for folder in _ancestors(base, path):
        try:
            quota = float((folder / "cpu.cfs_quota_us").read_text())
            period = float((folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if quota > 0 and period > 0:
            found.append(quota / period)
    return found


def usable_cpus() -> int:
    """The CPUs this process may really use: its affinity mask, cut to its cgroup's quota
    (rounded up: a quota of 1.5 CPUs runs two threads half the time each)."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota - 1e-9)))
    return cpus


def share(processes: int, cpus: int | None = None) -> int:
    """Threads for each of `processes` processes of the project that run side by side on
    `cpus` CPUs (default: the ones this process may use); at least one each."""
    return max(1, (cpus or usable_cpus()) // max(1, processes))


def default_threads() -> int:
    """Threads for a process that runs alone: `OMP_NUM_THREADS` where the user set one, else
    the CPUs it may use."""
    given = os.environ.get(THREADS_ENV, "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return usable_cpus()


def process_threads(most: int | None = None) -> int:
    """Threads for a stage's own process: `default_threads()`, at most `most` (a profile's
    `torch_threads`: small models gain nothing from more, and a fixed count keeps their
    arithmetic the same on any machine with that many CPUs)."""
    return min(most, default_threads()) if most else default_threads()


def wait_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """How a process started with `environ` (default: this process's) waits: a wait policy or
    spin count already there (the user's, or set by `settle_process`) is kept as it is; else
    passive, after a short spin."""
    environ = os.environ if environ is None else environ
    chosen = {key: environ[key] for key in (WAIT_POLICY_ENV, SPIN_ENV) if environ.get(key)}
    return chosen or {WAIT_POLICY_ENV: PASSIVE, SPIN_ENV: SHORT_SPIN}


def thread_vars(threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a process that runs `threads` torch threads starts with: how it waits
    (`wait_vars` of `environ`, default this process's) and its thread count (which the child's
    OpenMP runtime and torch take as their default)."""
    return wait_vars(environ) | {THREADS_ENV: str(max(1, threads))}


def child_env(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a process the project starts that runs `threads` torch threads:
    `base` (default: this process's) with `thread_vars`."""
    env = dict(os.environ if base is None else base)
    return env | thread_vars(threads, env)


def settle_process() -> dict[str, str]:
    """How this process waits (`wait_vars`), set before torch loads: call first thing in an
    entry point. Returns the settings in force. Where torch is loaded already, its OpenMP
    runtime has read the environment: said in the log, as this process then waits as it
    started."""
    wanted = wait_vars()
    if any(os.environ.get(key) != value for key, value in wanted.items()):
        if "torch" in sys.modules:
            log.warning(
                "torch was imported before the OpenMP wait settings were made: this process "
                "keeps the runtime's defaults (set %s before starting it)",
                " ".join(f"{key}={value}" for key, value in wanted.items()),
            )
        os.environ.update(wanted)
    return wanted


def runtime_threads() -> dict[str, str | int]:
    """What this process runs with, as a child reports it: the wait policy in its environment
    and torch's thread count (torch is imported here if it was not)."""
    import torch

    return {
        WAIT_POLICY_ENV: os.environ.get(WAIT_POLICY_ENV, ""),
        SPIN_ENV: os.environ.get(SPIN_ENV, ""),
        THREADS_ENV: os.environ.get(THREADS_ENV, ""),
        "torch_threads": torch.get_num_threads(),
    }

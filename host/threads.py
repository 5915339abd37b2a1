"""How the project's processes use the CPU: how many threads each runs, and how they wait.

torch's CPU build runs its parallel regions on OpenMP (GNU libgomp). By default a libgomp thread
that waits for the others spins for a while before it sleeps. Alone on its cores that is what a
step of small ops wants; beside any other busy process it is a collapse, not a slowdown: a
spinning thread holds a core that the thread it waits for needs (on 2 shared cores a 2-thread
torch loop ran at 1.2 steps/s with the defaults, 139 with passive waiting).

So an entry point of the project (`settle_process()`, first thing) keeps libgomp's long spin and
starts a governor (host/waiting.py) that switches it to libgomp's short spin while other work
keeps the process's CPUs busy, and back when they are its own again. A process the project
starts beside another of its own by design (a sampler process, Ray actors, DeepSpeed ranks) gets
`child_env(threads)`: passive waiting after a short spin, fixed, and its thread count. Thread
counts are the CPUs a process may really use (DeepSpeed ranks share them out); they never change
with load, so no arithmetic does.

Why a short spin for the fixed setting and not none: on these machines a sleeping thread takes
long to wake, and a step's many parallel regions each pay it. Alone, the base's pretraining took
10-13 s with the default spin, 12-15 s passive, 10-12 s after 1,000 polls; two at once, 1.4x
(passive), 1.7x (1,000 polls), 2.1x (3,000) each their time alone, and 4.4x with the default spin
(docs/sharing.md, `python -m benchmarks.sharing`).

libgomp reads `OMP_WAIT_POLICY` and `GOMP_SPINCOUNT` once, when it loads (with `import torch`):
they must be in a process's environment before it imports torch. A wait policy or spin count the
user set is kept, and then nothing is governed.

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
# Beside the wait variables when the project, not the user, put them there (their values, as
# `fallback_mark` writes them): the fixed setting for processes that do not govern their own
# waiting; one that does may take them off. Values that differ from the mark are the user's.
FALLBACK_ENV = "R1_WAIT_FALLBACK"
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


def user_wait_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The wait policy and spin count the user chose in `environ` (default: this process's):
    none where the project put them there (`FALLBACK_ENV`)."""
    environ = os.environ if environ is None else environ
    found = {key: environ[key] for key in (WAIT_POLICY_ENV, SPIN_ENV) if environ.get(key)}
    return {} if environ.get(FALLBACK_ENV) == fallback_mark(found) else found


def fallback_mark(wait: Mapping[str, str]) -> str:
    """The value of `FALLBACK_ENV` that says `wait` (the wait variables) are the project's."""
    return f"{wait.get(WAIT_POLICY_ENV, '')}/{wait.get(SPIN_ENV, '')}"


def wait_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """How a process started with `environ` (default: this process's) waits when it does not
    govern its own waiting: the user's choice kept as it is; else passive, after a short
    spin."""
    return user_wait_vars(environ) or {WAIT_POLICY_ENV: PASSIVE, SPIN_ENV: SHORT_SPIN}


def thread_vars(threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a process that runs `threads` torch threads starts with: how it waits
    (`wait_vars` of `environ`, default this process's) and its thread count (which the child's
    OpenMP runtime and torch take as their default)."""
    return wait_vars(environ) | {THREADS_ENV: str(max(1, threads))}


def child_env(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a process the project starts beside others of its own, that runs
    `threads` torch threads: `base` (default: this process's) with `thread_vars`, fixed (not
    to be governed)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != FALLBACK_ENV}
    return env | thread_vars(threads, env)


def settle_process() -> dict[str, str]:
    """How this process waits, settled before torch loads: call first thing in an entry point.

    Where the user chose how threads wait, that is kept. Else, where torch's libgomp can be
    loaded with its defaults (before torch is imported) and this process's CPUs read, it is
    loaded now and a governor switches its spin with the load (host/waiting.py); otherwise the
    process waits passively after a short spin. Either way the processes it starts inherit the
    fixed setting, marked as the project's (`FALLBACK_ENV`), so that one that settles itself
    may govern too. Returns the variables a child inherits."""
    chosen = user_wait_vars()
    if chosen:
        return chosen
    wait = {WAIT_POLICY_ENV: PASSIVE, SPIN_ENV: SHORT_SPIN}
    fixed = wait | {FALLBACK_ENV: fallback_mark(wait)}
    loaded_unsettled = "torch" in sys.modules and os.environ.get(WAIT_POLICY_ENV) != PASSIVE
    if not _govern_openmp() and loaded_unsettled:
        log.warning(
            "torch was imported before the OpenMP wait settings were made: this process "
            "keeps the runtime's defaults, ungoverned (set %s=%s before starting it)",
            WAIT_POLICY_ENV,
            PASSIVE,
        )
    os.environ.update(fixed)
    return fixed


def governable() -> bool:
    """Whether this machine lets a process govern its waiting: an affinity mask that is all
    the CPUs it may use (a cgroup quota below it makes the kernel's readings speak of CPUs it
    does not share), and torch's own libgomp to load."""
    from host import waiting

    if not hasattr(os, "sched_getaffinity") or usable_cpus() < affinity_cpus():
        return False
    return waiting.loaded_openmp() is not None or waiting.torch_openmp_path() is not None


def _govern_openmp() -> bool:
    """Load libgomp with its defaults and start the governor; False where this process cannot
    be governed (another OpenMP runtime, no /proc, a CPU quota below its affinity mask, or
    torch loaded with the fixed setting already)."""
    from host import waiting

    if waiting.governor() is not None:
        return True
    if not governable():
        return False
    gauge = waiting.gauge_for(frozenset(os.sched_getaffinity(0)), default_threads())
    if gauge is None:
        return False  # nothing tells how busy the CPUs are
    if "torch" in sys.modules:
        if os.environ.get(WAIT_POLICY_ENV) or os.environ.get(SPIN_ENV):
            return False  # its libgomp read the fixed setting when it loaded
        path = waiting.loaded_openmp()
    else:
        path = waiting.torch_openmp_path()
        for key in (WAIT_POLICY_ENV, SPIN_ENV, FALLBACK_ENV):
            os.environ.pop(key, None)  # libgomp reads them as it loads, next line
    if path is None:
        return False
    import ctypes

    try:
        library = ctypes.CDLL(str(path))
    except OSError:
        return False
    waiting.govern(library, gauge)
    return True


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

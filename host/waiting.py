"""Spin while the cores are this process's own; wait without spinning while others need them.

libgomp, torch's OpenMP runtime on Linux, reads its spin count once, when it loads. Alone on its
cores a long spin (libgomp's default, 300,000 polls) is what a decode loop of small ops wants: a
sleeping thread is slow to wake, and each op's parallel region would pay for it (alone, 128 rows
decoded at 10,400 tokens/s on two spinning threads, 5,000 on two that sleep). Beside any other busy
process the same spin collapses (1,500 tokens/s each for two such processes side by side).

libgomp has one rule that changes its spin at run time (its manual, `GOMP_SPINCOUNT`): while it
manages more threads than the process may use CPUs, it polls only 100 times before it sleeps
(`do_spin` in libgomp's config/linux/wait.h reads the thread count at every wait). So a
`Governor` thread reads, four times a second, how much runnable work waited for a CPU (the
kernel's pressure stall information; where there is none, the CPUs others used, from /proc/stat
less this process's own time). While that is high, `Ballast` parks a team of spare OpenMP threads
(asleep on a futex, using nothing), which tips libgomp into its short spin; when the CPUs are
this process's own again, the team is let go and the long spin is back. Thread counts never
change, so neither does any arithmetic: how threads wait is all that moves.

Only for a process whose libgomp loaded with its defaults (no wait setting in the environment);
host/threads.py `settle_process` decides, and loads libgomp itself before torch does.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROC_STAT = Path("/proc/stat")
PROC_MAPS = Path("/proc/self/maps")
INTERVAL_S = 0.25  # between two readings of the CPUs
CALM_READINGS = 2  # quiet readings in a row before the long spin comes back (half a second)
# CPUs this process's threads were on or waited for, under which a reading counts as calm
OWN_BUSY = 0.5
PROC_TASKS = Path("/proc/self/task")
# /proc/stat's columns after the CPU's name: user nice system idle iowait irq softirq steal ...
IDLE_COLUMNS = (3, 4)  # idle, iowait: the rest (steal included: another machine's) is busy
BUSY_COLUMNS = 8  # user .. steal; guest time is counted inside user already


def busy_ticks(stat: str, cpus: Iterable[int]) -> int:
    """Clock ticks the CPUs `cpus` spent busy, from the text of /proc/stat."""
    wanted = {f"cpu{c}" for c in cpus}
    total = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            columns = [int(x) for x in rest.split()[:BUSY_COLUMNS]]
            total += sum(v for i, v in enumerate(columns) if i not in IDLE_COLUMNS)
    return total


@dataclass(frozen=True)
class Reading:
    """One look at the CPUs: when, their busy ticks, and this process's own CPU seconds."""

    wall: float
    busy_ticks: int
    own_seconds: float


def others_cpus(before: Reading, after: Reading, hz: float) -> float:
    """How many CPUs other work kept busy between two readings (never below 0: the readings'
    tick resolution can make it slightly negative on a quiet machine)."""
    span = after.wall - before.wall
    if span <= 0:
        return 0.0
    busy = (after.busy_ticks - before.busy_ticks) / hz
    return max(0.0, (busy - (after.own_seconds - before.own_seconds)) / span)


@dataclass
class Hysteresis:
    """Throttle at once on a reading over `limit` (CPU pressure, or the CPUs others use); spin
    again only after `calm` readings in a row under half of it."""

    limit: float
    calm: int = CALM_READINGS
    throttled: bool = False
    quiet: int = 0

    def update(self, others: float) -> bool:
        """Whether to throttle, given the latest reading."""
        if others > self.limit:
            self.throttled, self.quiet = True, 0
        elif self.throttled:
            self.quiet = self.quiet + 1 if others < self.limit / 2 else 0
            if self.quiet >= self.calm:
                self.throttled, self.quiet = False, 0
        return self.throttled


def spare_cpus_limit(cpus: int, threads: int) -> float:
    """Others may use the CPUs this process's `threads` leave, and half a CPU more, before its
    threads would wait for a core while spinning."""
    return max(0.5, cpus - threads + 0.5)


def torch_openmp_path() -> Path | None:
    """The libgomp that torch's wheel carries (torch/lib or torch.libs), found without importing
    torch; None where there is none (another OpenMP runtime, or no torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    for folder in (package / "lib", package.parent / "torch.libs"):
        found = sorted(folder.glob("libgomp*.so*"))
        if found:
            return found[0]
    return None


def loaded_openmp() -> Path | None:
    """The libgomp this process has loaded, if any."""
    try:
        maps = PROC_MAPS.read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "libgomp" in Path(path).name:
            return Path(path)
    return None


PROCESS_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def keep_signals_off_this_thread() -> None:
    """Block Ctrl-C, SIGTERM and SIGHUP in the calling thread (and the threads it starts), so
    that the kernel hands them to the process's own threads, never to the governor's: Python
    handles a signal in its main thread, which a signal delivered elsewhere may not wake."""
    signal.pthread_sigmask(signal.SIG_BLOCK, PROCESS_SIGNALS)


class Ballast:
    """A parked team of OpenMP threads that puts libgomp over its CPU count while held.

    A Python thread opens one parallel region of `threads` threads (each calls `free(NULL)`,
    which does nothing) and stays alive: libgomp keeps the team's threads docked, asleep, and
    counts them as managed. Letting go ends the Python thread, whose exit frees the team
    (libgomp's thread destructor) and takes them off the count.
    """

    def __init__(self, library: ctypes.CDLL, threads: int):
        self.parallel = library.GOMP_parallel
        self.parallel.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
        self.parallel.restype = None
        self.noop = ctypes.cast(ctypes.CDLL(None).free, ctypes.c_void_p)
        self.threads = threads
        self.holder: threading.Thread | None = None
        self.release = threading.Event()

    @property
    def held(self) -> bool:
        return self.holder is not None

    def hold(self) -> None:
        if self.holder is not None:
            return
        self.release = threading.Event()
        ready = threading.Event()

        def park(release: threading.Event = self.release) -> None:
            keep_signals_off_this_thread()  # and off the team's threads, which inherit its mask
            self.parallel(self.noop, None, self.threads, 0)
            ready.set()
            release.wait()

        self.holder = threading.Thread(target=park, name="openmp-ballast", daemon=True)
        self.holder.start()
        ready.wait()

    def let_go(self) -> None:
        if self.holder is None:
            return
        self.release.set()
        self.holder.join()
        self.holder = None


PROC_PRESSURE = Path("/proc/pressure/cpu")
PRESSURE_LIMIT = 0.35  # share of the time some runnable task waited for a CPU (see PressureGauge)


def stalled_microseconds(text: str) -> int:
    """The `some` line's `total` of /proc/pressure/cpu: microseconds in which at least one
    runnable task waited for a CPU."""
    for line in text.splitlines():
        if line.startswith("some "):
            return int(line.rsplit("total=", 1)[1])
    raise ValueError("no `some` line in the CPU pressure file")


class PressureGauge:
    """The share of the time since the last reading that some runnable task waited for a CPU
    (the kernel's pressure stall information): what spinning threads cost others, and others
    cost them. Measured on 2 cores over the sharing benchmark's GRPO job (0.25 s readings while
    the job worked): alone, median 0.01, 95th percentile 0.24 (the machine's own services, the
    job's children); two such jobs at once, median 0.50 and 0.75 of the readings over 0.4. A
    spinning two-thread loop alone: 0.003."""

    limit = PRESSURE_LIMIT

    def __init__(self, read: Callable[[], tuple[float, int]] | None = None):
        self.read_now = read or (
            lambda: (time.monotonic(), stalled_microseconds(PROC_PRESSURE.read_text()))
        )
        self.before = self.read_now()

    def __call__(self) -> float:
        after = self.read_now()
        (t0, s0), (t1, s1) = self.before, after
        self.before = after
        return max(0.0, (s1 - s0) / ((t1 - t0) * 1e6)) if t1 > t0 else 0.0


class CpuGauge:
    """How many CPUs other work used since the last reading (`others_cpus`), where the kernel
    gives no pressure information. Coarser: a process's own children count as others."""

    def __init__(
        self, cpus: frozenset[int], threads: int, read: Callable[[], Reading] | None = None
    ):
        self.limit = spare_cpus_limit(len(cpus), threads)
        self.read_now = read or (lambda: read_cpus(cpus))
        self.hz = os.sysconf("SC_CLK_TCK")
        self.before = self.read_now()

    def __call__(self) -> float:
        after = self.read_now()
        value, self.before = others_cpus(self.before, after, self.hz), after
        return value


def read_cpus(cpus: frozenset[int]) -> Reading:
    """This moment's reading of `cpus` (busy ticks) and of this process's CPU time."""
    return Reading(time.monotonic(), busy_ticks(PROC_STAT.read_text(), cpus), time.process_time())


def thread_demand_seconds(schedstat: str | bytes) -> float:
    """A thread's seconds on a CPU plus its seconds runnable in a run queue, waiting for one
    (`/proc/<pid>/task/<tid>/schedstat`: nanoseconds on the CPU, nanoseconds waiting, slices)."""
    on_cpu, waiting, _ = schedstat.split()
    return (int(on_cpu) + int(waiting)) / 1e9


def demand_seconds(tasks: Path = PROC_TASKS) -> float:
    """Seconds this process's threads were on a CPU or runnable waiting for one: what it asked
    of the CPUs, which its CPU time alone under-reads on a crowded machine (two threads at work
    among eight runnable tasks on two cores got 0.2 CPUs of time). Its CPU time where the kernel
    keeps no schedstat. A thread that ended takes its seconds with it: readings are compared
    clamped at zero. About 0.5 ms for 60 threads (plain reads: a reading comes four times a
    second)."""
    try:
        tids = os.listdir(tasks)
    except OSError:
        return time.process_time()
    total = 0.0
    for tid in tids:
        try:
            fd = os.open(f"{tasks}/{tid}/schedstat", os.O_RDONLY)
        except OSError:  # the thread ended meanwhile, or the kernel keeps no schedstat
            continue
        try:
            total += thread_demand_seconds(os.read(fd, 128))
        except (OSError, ValueError):  # ended while read
            continue
        finally:
            os.close(fd)
    return total if total or not tids else time.process_time()


def demand_clocks() -> tuple[float, float]:
    return time.monotonic(), demand_seconds()


class Governor(threading.Thread):
    """Every `interval` seconds a reading of `gauge` (against `limit`); holds the ballast while
    `Hysteresis` says to. A reading taken while this process hardly asked for a CPU (its
    threads on one or runnable waiting for one, `demand_seconds`, under `OWN_BUSY` CPUs: it was
    waiting on its children, say, a GRPO step's sandboxed programs) counts as calm: its threads
    were not there to spin. `changes` counts the switches (both ways) and
    `throttled` says where it stands, for logs and tests."""

    def __init__(
        self,
        ballast: Ballast,
        gauge: Callable[[], float],
        limit: float,
        interval: float = INTERVAL_S,
        clocks: Callable[[], tuple[float, float]] = demand_clocks,
    ):
        super().__init__(name="openmp-governor", daemon=True)
        self.ballast, self.gauge, self.interval, self.clocks = ballast, gauge, interval, clocks
        self.rule = Hysteresis(limit)
        self.changes = 0
        self.stopped = threading.Event()

    @property
    def throttled(self) -> bool:
        return self.ballast.held

    def run(self) -> None:
        keep_signals_off_this_thread()
        before = self.clocks()
        while not self.stopped.wait(self.interval):
            value, after = self.gauge(), self.clocks()
            wall, own = after[0] - before[0], max(0.0, after[1] - before[1])
            before = after
            throttle = self.rule.update(value if wall > 0 and own >= OWN_BUSY * wall else 0.0)
            if throttle != self.ballast.held:
                (self.ballast.hold if throttle else self.ballast.let_go)()
                self.changes += 1
                log.debug("OpenMP threads %s", "throttled" if throttle else "spinning again")

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.ballast.let_go()


_governor: Governor | None = None


def governor() -> Governor | None:
    """This process's governor, when one runs."""
    return _governor


def gauge_for(cpus: frozenset[int], threads: int) -> PressureGauge | CpuGauge | None:
    """The kernel's CPU pressure where it gives it, else the CPUs others use; None where
    neither can be read."""
    for make in (PressureGauge, lambda: CpuGauge(cpus, threads)):
        try:
            return make()
        except (OSError, ValueError):
            continue
    return None


def govern(library: ctypes.CDLL, gauge: PressureGauge | CpuGauge) -> Governor:
    """Start this process's governor (once), reading `gauge`, over the libgomp `library`."""
    global _governor
    if _governor is None:
        cpus = len(os.sched_getaffinity(0))
        ballast = Ballast(library, cpus + 1)  # libgomp counts 1 + the spare threads > CPUs
        _governor = Governor(ballast, gauge, gauge.limit)
        _governor.start()
    return _governor

"""The governor of OpenMP waiting (host/waiting.py): its readings and rule as worked cases, and in
fresh processes whose libgomp loaded with its defaults, that parking a team of spare threads
really stops the idle threads' spinning, that a process beside a busy neighbour switches to the
short spin by itself, and that an entry point's `settle_process` sets it all up."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from host.threads import governable
from host.waiting import (
    Governor,
    Hysteresis,
    PressureGauge,
    Reading,
    busy_ticks,
    demand_seconds,
    others_cpus,
    spare_cpus_limit,
    stalled_microseconds,
    thread_demand_seconds,
)

ROOT = Path(__file__).resolve().parents[2]
STAT = """cpu  500 0 100 900 10 0 0 5 0 0
cpu0 200 0 50 400 5 0 0 2 0 0
cpu1 300 0 50 500 5 0 0 3 0 0
intr 12345
"""

linux_only = pytest.mark.skipif(
    not Path("/proc/stat").exists() or not hasattr(os, "sched_getaffinity"),
    reason="reads /proc/stat and the affinity mask (Linux)",
)
governed_here = pytest.mark.skipif(
    not governable(), reason="a CPU quota below the affinity mask, or no torch libgomp: fixed"
)


def test_busy_ticks_count_user_system_and_steal_of_the_cpus_asked_for_not_idle_or_iowait():
    assert busy_ticks(STAT, [0]) == 200 + 50 + 2
    assert busy_ticks(STAT, [1]) == 300 + 50 + 3
    assert busy_ticks(STAT, [0, 1]) == 252 + 353
    assert busy_ticks(STAT, [7]) == 0  # not on this machine: nothing


def test_others_cpus_are_the_busy_cpus_less_this_process_own_time():
    before = Reading(wall=10.0, busy_ticks=1000, own_seconds=3.0)
    after = Reading(wall=12.0, busy_ticks=1400, own_seconds=5.0)  # 4 s busy, 2 s of them ours
    assert others_cpus(before, after, hz=100) == pytest.approx(1.0)
    alone = Reading(wall=12.0, busy_ticks=1199, own_seconds=5.0)  # tick rounding below ours
    assert others_cpus(before, alone, hz=100) == 0.0
    assert others_cpus(after, after, hz=100) == 0.0


def test_pressure_is_the_share_of_the_time_some_task_waited_for_a_cpu():
    text = "some avg10=1.10 avg60=7.68 avg300=16.68 total=8826004539\nfull avg10=0 total=0\n"
    assert stalled_microseconds(text) == 8826004539
    readings = iter([(10.0, 1_000_000), (10.5, 1_250_000), (11.0, 1_250_000), (11.0, 1_250_000)])
    gauge = PressureGauge(lambda: next(readings))
    assert gauge() == pytest.approx(0.5)  # 0.25 s of stall in 0.5 s
    assert gauge() == 0.0
    assert gauge() == 0.0  # no time passed: nothing to say


def test_the_rule_throttles_at_once_and_spins_again_only_after_calm_readings():
    rule = Hysteresis(limit=0.5, calm=3)
    assert [rule.update(x) for x in (0.1, 0.4, 0.6)] == [False, False, True]
    # under the limit but not under half of it: no calm reading; then three calm ones
    assert [rule.update(x) for x in (0.3, 0.1, 0.1, 0.9, 0.1, 0.1, 0.1)] == [
        True, True, True, True, True, True, False,
    ]  # fmt: skip


def test_the_limit_leaves_others_the_cpus_this_process_does_not_use():
    assert spare_cpus_limit(cpus=2, threads=2) == 0.5
    assert spare_cpus_limit(cpus=16, threads=2) == 14.5
    assert spare_cpus_limit(cpus=2, threads=4) == 0.5


class FakeBallast:
    """Records each change of state, as `Ballast` holds and lets go."""

    def __init__(self) -> None:
        self.held = False
        self.seen: list[bool] = []

    def hold(self) -> None:
        self.seen += [] if self.held else [True]
        self.held = True

    def let_go(self) -> None:
        self.seen += [False] if self.held else []
        self.held = False


def test_demand_is_each_threads_time_on_a_cpu_and_waiting_for_one(tmp_path):
    assert thread_demand_seconds("433063502 166382251 159\n") == pytest.approx(0.599445753)
    for tid, stat in (("11", "1000000000 500000000 9"), ("12", "250000000 0 3")):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "schedstat").write_text(stat)
    (tmp_path / "13").mkdir()  # a thread that ended between the listing and the read
    assert demand_seconds(tmp_path) == pytest.approx(1.75)


@linux_only
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc/self/task")
def test_a_busy_thread_is_demand_and_a_sleeping_one_is_not():
    """A second of a thread at work is a second of demand, on a CPU or waiting for one (on a
    crowded machine mostly waiting); a second asleep adds almost nothing."""
    before = demand_seconds()
    time.sleep(0.5)
    slept = demand_seconds() - before
    stop, spins = time.monotonic() + 0.5, 0
    while time.monotonic() < stop:  # at work, never asleep
        spins += 1
    worked = demand_seconds() - before - slept
    assert slept < 0.05 and 0.45 < worked < 0.6, (slept, worked)


def test_the_governor_holds_the_ballast_while_the_cpus_are_contended_and_lets_go_when_calm():
    """Readings of pressure while the process works (one CPU of its own time a second): the
    ballast is held at the first contended one and let go after two calm ones; contention
    while the process hardly works (a tenth of a CPU) counts as calm, and nothing changes
    after."""
    pressure = itertools.chain([0.0, 0.6, 0.4, 0.05, 0.0, 0.9, 0.9, 0.9], itertools.repeat(0.0))
    own = itertools.chain([1.0] * 6, [0.1] * 3, itertools.repeat(1.0))  # CPUs of its own
    clock = {"wall": 0.0, "cpu": 0.0}

    def clocks() -> tuple[float, float]:
        clock["cpu"] += next(own) if clock["wall"] else 0.0
        clock["wall"] += 1.0
        return clock["wall"], clock["cpu"]

    ballast = FakeBallast()
    governor = Governor(ballast, lambda: next(pressure), 0.2, 0.001, clocks)  # type: ignore[arg-type]
    governor.start()
    while governor.is_alive() and governor.changes < 4:
        governor.stopped.wait(0.01)
    governor.stop()
    # held at 0.6, let go after 0.05 and 0.0; held at 0.9, let go after two idle readings
    assert ballast.seen == [True, False, True, False] and governor.changes == 4


def fresh(code: str, extra: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run `code` in a fresh interpreter at the project's root whose environment has no OpenMP
    wait setting (libgomp's defaults, as a user's shell) but `extra`; its standard output."""
    base = dict(os.environ)
    for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "R1_WAIT_FALLBACK"):
        base.pop(key, None)
    base |= extra or {}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


IDLE_SPIN = """
    import ctypes, time
    import torch
    from host import waiting
    torch.set_num_threads(2)
    x = torch.ones(200_000)  # big enough for a parallel region of two threads
    def idle_cpu_ms(n=30):
        began = time.process_time()
        for _ in range(n):
            x.add_(1.0)
            time.sleep(0.01)  # the partner thread idles here: spinning or asleep
        return (time.process_time() - began) / n * 1000
    ballast = waiting.Ballast(ctypes.CDLL(str(waiting.loaded_openmp())), 3)
    idle_cpu_ms(5)
    spinning = idle_cpu_ms()
    ballast.hold()
    held = idle_cpu_ms()
    ballast.let_go()
    print(spinning, held, idle_cpu_ms())
"""


@linux_only
@pytest.mark.heavy  # a fresh process loads torch
@pytest.mark.alone  # the CPU time a spinning thread takes: less where another test takes a core
def test_a_parked_team_stops_idle_threads_spinning_and_letting_it_go_brings_the_spin_back():
    """CPU time a gap of 10 ms costs the process after a two-thread op: libgomp's default spin
    (several ms of polling), then with the ballast held (the short spin: next to nothing), then
    after it is let go (the long spin again)."""
    spinning, held, again = map(float, fresh(IDLE_SPIN).split())
    assert held < spinning / 3, (spinning, held)
    assert again > 3 * held, (again, held)


GOVERNED = """
    import os, subprocess, sys, time
    cpus = sorted(os.sched_getaffinity(0))[:2]  # two CPUs, whatever the machine has
    os.sched_setaffinity(0, cpus)  # and the busy processes below inherit them
    from host.threads import settle_process
    settle_process()
    import torch
    from host import waiting
    governor = waiting.governor()
    torch.set_num_threads(2)
    x, w = torch.randn(64, 256), torch.randn(256, 256)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in cpus]
    try:
        deadline = time.monotonic() + 20
        while not governor.throttled and time.monotonic() < deadline:
            (x @ w).relu().sum()  # two threads at work beside two busy processes
        print(governor is not None, governor.throttled)
    finally:
        for p in busy:
            p.kill()
            p.wait()
"""


@linux_only
@governed_here
@pytest.mark.heavy  # fresh processes load torch; two of them spin for a few seconds
def test_a_settled_process_is_governed_and_throttles_at_work_beside_busy_neighbours():
    """`settle_process` in a fresh process loads libgomp with its defaults and starts the
    governor; its two threads at work beside two processes that keep the cores busy tip it
    into the short spin."""
    assert fresh(GOVERNED).split() == ["True", "True"]


def test_a_user_choice_of_waiting_is_kept_and_nothing_is_governed():
    code = """
        from host.threads import settle_process
        import os
        from host import waiting
        print(settle_process(), waiting.governor(), os.environ.get("R1_WAIT_FALLBACK"))
    """
    out = fresh(code, {"OMP_WAIT_POLICY": "ACTIVE"})
    assert out.strip() == "{'OMP_WAIT_POLICY': 'ACTIVE'} None None"


SIGNAL_MASKS = """
    import os, signal
    from host.threads import settle_process
    settle_process()
    import torch
    from host import waiting

    def tasks():
        return set(os.listdir("/proc/self/task"))

    def blocks_sigint(tid):
        status = open(f"/proc/self/task/{tid}/status").read()
        mask = int(status.split("SigBlk:")[1].split()[0], 16)
        return bool(mask & (1 << (signal.SIGINT - 1)))

    governor = waiting.governor()
    governor.stop()  # the team let go, whatever the load did, and nothing held on its own
    before = tasks()
    governor.ballast.hold()  # the parking thread and its team
    added = tasks() - before
    print(len(added), all(blocks_sigint(t) for t in added), blocks_sigint(os.getpid()))
    governor.ballast.let_go()
"""


@linux_only
@governed_here
@pytest.mark.heavy  # a fresh process loads torch
def test_the_governors_threads_never_take_the_processs_signals():
    """Ctrl-C, SIGTERM and SIGHUP are blocked in the governor's threads and the parked team, so
    the kernel hands them to the process's own threads (Python handles them in its main one)."""
    added, all_blocked, main_blocked = fresh(SIGNAL_MASKS).split()
    assert int(added) >= 2 and all_blocked == "True" and main_blocked == "False"

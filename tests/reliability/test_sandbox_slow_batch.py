"""A batch of slow and looping programs, as early RL samples them: every sample is scored by
what its own programs did, never None because its siblings were slow; and what a program did is
kept even when its session ends before the rest of its job.

The programs are real and run in the real sandbox: most load for nearly the whole wall clock
and then sleep in every call (each test costs a load, a call at the wall clock, ending the
timed-out process and spawning a fresh one); some loop on the CPU; some are slow to load but
right; the correct ones come last, when the session has been busy longest.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from rewards.code import CodeReward
from sandbox import Job, Limits, capabilities, run_jobs

from .test_sandbox import nothing_left_behind  # noqa: F401 - the same checks after each test
from .test_sandbox_siblings import GOOD, TESTS, reasons

CAPS = capabilities()
pytestmark = pytest.mark.skipif(
    not (CAPS.runs_programs and (CAPS.namespaces or CAPS.uid_drop)),
    reason=f"the sandbox refuses or cannot run programs here: {CAPS.reason}",
)

WALL = 5.0
STUCK = (  # loads in just under the wall clock, then every call sleeps past it
    f"import time\ntime.sleep({WALL - 0.5})\n\n"
    "def double(x):\n    time.sleep(60)\n    return 2 * x\n"
)
SLOW_BUT_RIGHT = f"import time\ntime.sleep({WALL - 1.0})\n\n" + GOOD  # a second to spare
LOOPING = "def double(x):\n    while True:\n        pass\n"
LOOPING_AT_LOAD = "while True:\n    pass\n\n" + GOOD


@pytest.mark.slow  # a minute of programs at their wall clock: python -m pytest -m slow
@pytest.mark.alone  # a second to spare at the wall clock: no other test's load beside it
def test_slow_and_looping_siblings_never_leave_a_sample_unscored() -> None:
    """Through the code reward, as GRPO calls it: 0 for each stuck or looping sample, 1 for
    each right one, slow or not, however long it waited; nothing unscorable. With a budget for
    the whole session (each test at its wall clock and a grace, spread over the workers), the
    stuck ones ran it out and the right ones at the end of the batch scored None."""
    programs = [STUCK] * 32 + [LOOPING, LOOPING_AT_LOAD, SLOW_BUT_RIGHT, GOOD]
    completions = [f"<answer>\n```python\n{code}```\n</answer>" for code in programs]
    reward = CodeReward(cpu_seconds=1, wall_seconds=WALL, workers=6)  # they mostly sleep
    scores = reward(["q"] * len(programs), completions, [list(TESTS[:1])] * len(programs))
    assert scores == [0.0] * 34 + [1.0] * 2
    metrics = reward.pop_metrics()
    # each stuck call at the wall clock, the looping call at its CPU limit, each right test
    assert metrics["wall_time"] == 32 and metrics["passed"] == 2, metrics
    assert "unscorable" not in metrics and "sandbox_failed" not in metrics, metrics


def test_a_test_that_finished_keeps_its_verdict_when_the_session_then_dies() -> None:
    """The first test passes, the second sleeps in the program; the session is killed (its
    whole process group, as an out-of-memory kill or a crash of the sandbox would end it) while
    the second runs. The first keeps its verdict; only the second cannot be judged."""
    program = "def double(x):\n    if x < 0:\n        import time\n        time.sleep(60)\n"
    program += "    return 2 * x\n"
    killer = threading.Thread(target=kill_the_session_after, args=(4.0,), daemon=True)
    killer.start()
    (outcome,) = run_jobs([Job(program, tests=TESTS, limits=Limits(wall_seconds=30))], workers=1)
    killer.join()
    assert reasons(outcome) == [(True, "passed"), (None, "sandbox_failed")], outcome


def kill_the_session_after(seconds: float) -> None:
    """Kill the sandbox's session `seconds` after the call, or once it has started; a session
    that never starts is left alone (the test's verdicts then say so)."""
    time.sleep(seconds)
    for _ in range(600):
        launchers = [p for p in psutil.Process().children() if is_launcher(p)]
        if launchers:
            (launcher,) = launchers
            os.killpg(launcher.pid, signal.SIGKILL)
            return
        time.sleep(0.1)


def is_launcher(process: psutil.Process) -> bool:
    """Whether `process` is the sandbox's session; False for one gone or a zombie (an earlier
    test's child in the same worker, not yet reaped, whose command line cannot be read)."""
    try:
        return any("launcher.py" in a for a in process.cmdline())
    except psutil.Error:
        return False

"""One program, one sandbox: a hostile program in a batch with correct siblings.

Each test runs a hostile program in one session with correct programs (its siblings) and checks
that the hostile one scores what it deserves (a failure, with its true reason) and that every
sibling scores as if it ran alone. Never None: only the sandbox's own failure to start is
unscorable. The classes: replies that would be expensive to decode or to use, what a program could
leave behind or share with another, limits a program could lift, and the reasons a run ends.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys

import pytest

import sandbox.runner as runner
from rewards.code import CodeReward
from sandbox import Job, Limits, SandboxResult, Verdict, capabilities, run_jobs
from sandbox.inner import cgroups, seccomp

from .test_sandbox import nothing_left_behind  # noqa: F401 - the same checks after each test

CAPS = capabilities()
pytestmark = pytest.mark.skipif(
    not (CAPS.runs_programs and (CAPS.namespaces or CAPS.uid_drop)),
    reason=f"the sandbox refuses or cannot run programs here: {CAPS.reason}",
)
needs_namespaces = pytest.mark.skipif(not CAPS.namespaces, reason=f"no namespaces: {CAPS.reason}")
needs_seccomp = pytest.mark.skipif(not CAPS.seccomp, reason="no seccomp filter here")
needs_cgroup = pytest.mark.skipif(not CAPS.cgroup, reason="no memory cgroup here")

GOOD = "def double(x):\n    return 2 * x\n\ndef double_all(xs):\n    return [2 * x for x in xs]\n"
TESTS = ("assert double(2) == 4", "assert double(-3) == -6")
GOOD_STDIO = "print(2 * int(input()))\n"
INPUTS = ("2\n", "-3\n")
P = (1 << 61) - 1  # every multiple of it hashes to 0 as a plain int
LIMITS = Limits(cpu_seconds=1, wall_seconds=3)


def with_siblings(hostile: Job, siblings: int = 4, workers: int = 3) -> tuple[list, list[list]]:
    """Run `hostile` in the middle of a batch of correct programs of its kind; its outcome and
    theirs, once it is known that every sibling scored as if it ran alone."""
    if hostile.tests is not None:
        good = Job(GOOD, tests=TESTS, limits=hostile.limits)
    else:
        good = Job(GOOD_STDIO, INPUTS, limits=hostile.limits)
    jobs = [good] * (siblings // 2) + [hostile] + [good] * (siblings - siblings // 2)
    outcomes = run_jobs(jobs, workers=workers)
    mine = outcomes.pop(siblings // 2)
    for outcome in outcomes:
        assert_correct(outcome)
    return mine, outcomes


def assert_correct(outcome: list) -> None:
    for item in outcome:
        if isinstance(item, Verdict):
            assert (item.passed, item.reason) == (True, "passed"), item
        else:
            assert item.status == "ok" and item.stdout in ("4\n", "-6\n"), item


def reasons(outcome: list) -> list[tuple[object, str]]:
    if outcome and isinstance(outcome[0], SandboxResult):
        return [(r.status, r.reason) for r in outcome]
    return [(v.passed, v.reason) for v in outcome]


# ---- replies that would cost the judge more than a bounded amount ------------------------------


def test_the_issues_set_of_identity_hashed_ints_scores_0_and_its_siblings_1() -> None:
    """120,000 int subclass instances with identity hashes: cheap in the program, quadratic to
    rebuild as plain ints that all hash alike. Refused (its members hash in their own way)."""
    hostile = (
        "class I(int):\n    __hash__ = object.__hash__\n    __eq__ = object.__eq__\n"
        f"def double(x):\n    return {{I(k * {P}) for k in range(1, 120_001)}}\n"
    )
    reward = CodeReward(cpu_seconds=2, wall_seconds=3, workers=3)
    completions = [f"<answer>\n```python\n{code}```\n</answer>" for code in [GOOD, hostile] * 3]
    scores = reward(["q"] * 6, completions, [list(TESTS)] * 6)
    assert scores == [1.0, 0.0] * 3
    # refused while decoding, not frozen in it: a judge stuck decoding is killed at the wall
    # clock, and the reason would be wall_time
    assert reward.pop_metrics() == {"passed": 6.0, "reply": 6.0}


FORGED = {  # what a program that replaced its own encoder sends, and the judge refuses
    "a set of ints of one hash": f"{{'$': 'set', 'v': [k * {P} for k in range(1, 120_001)]}}",
    "dict keys of one hash": f"{{'$': 'dict', 'v': [[k * {P}, 0] for k in range(1, 120_001)]}}",
    "a set of tuples of one hash": (
        f"{{'$': 'set', 'v': [{{'$': 'tuple', 'v': [k * {P}]}} for k in range(1, 60_001)]}}"
    ),
    "a frozenset inside a list": f"[{{'$': 'frozenset', 'v': [k * {P} for k in range(1, 200)]}}]",
    "a value nested 150 deep": "functools.reduce(lambda v, _: [v], range(150), 0)",
    "more than a million values": "[0] * 1_100_000",
    "an int of 1.2 million bits": "{'$': 'int', 'v': 'f' * 300_000}",
    "a tag that is not plain data": "{'$': 'object', 'v': []}",
    "a reply over 16 MB": "'x' * (17 << 20)",
}  # fmt: skip


@pytest.mark.parametrize("forged", sorted(FORGED))
def test_a_forged_reply_over_the_judges_bounds_fails_with_reason_reply(forged: str) -> None:
    hostile = (
        "import functools, sys\n"
        "wire = sys.modules['sandbox.inner.wire']\n"
        f"wire.encode = lambda value, handle=None: {FORGED[forged]}\n" + GOOD
    )
    mine, _ = with_siblings(Job(hostile, tests=TESTS, limits=LIMITS))
    assert reasons(mine) == [(False, "reply")] * 2, mine  # refused, not killed at the wall clock


def test_values_a_test_makes_expensive_end_at_the_wall_clock_and_no_sibling_waits() -> None:
    """Plain data within every bound (a list), which the test turns into a set: 300,000 ints
    that share one hash take the judge hours, in C. The judge's worker is killed past the wall
    clock: that test fails (wall_time), the next runs in a fresh worker, siblings never wait."""
    hostile = GOOD + f"\ndef double_all(xs):\n    return [k * {P} for k in range(1, 300_001)]\n"
    tests = ("assert double(2) == 4", "assert sorted(set(double_all([1, 2, 2]))) == [2, 4]")
    limits = Limits(cpu_seconds=1, wall_seconds=2)
    outcomes = run_jobs(
        [Job(hostile, tests=tests, limits=limits), *[Job(GOOD, tests=tests, limits=limits)] * 6],
        workers=3,
    )
    assert reasons(outcomes[0]) == [(True, "passed"), (False, "wall_time")]
    for outcome in outcomes[1:]:  # a sibling that waited behind it would end at its own clock
        assert_correct(outcome)


def test_an_int_too_long_to_print_in_a_failed_assertion_is_a_failure() -> None:
    hostile = "def double(x):\n    return 10 ** 5000\n"
    tests = ("assert double(2) == 4, double(2)", "assert double(-3) == -6, double(-3)")
    mine, _ = with_siblings(Job(hostile, tests=tests, limits=LIMITS))
    assert reasons(mine) == [(False, "assertion")] * 2


# ---- what a program could leave behind or share with another -----------------------------------

WRITER = """
import ctypes, os, socket, time, _multiprocessing, _posixshmem
token = {token!r}
libc = ctypes.CDLL(None, use_errno=True)
note = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
note.bind(b'\\0' + token.encode())
fd = _posixshmem.shm_open('/' + token, os.O_CREAT | os.O_RDWR, 0o666)
os.write(fd, b'note')
sem = _multiprocessing.SemLock(1, 1, 1, '/' + token + '-sem', False)
os.mkfifo('/tmp/' + token + '.fifo')
open('/tmp/' + token, 'w').write('note')
open('/work/' + token, 'w').write('note')
shm = libc.shmget(0x5eed, 4096, 0o1666)
queue = libc.msgget(0x5eed, 0o1666)
print('sysv', shm >= 0, queue >= 0, flush=True)
time.sleep(1.5)
"""

READER = """
import ctypes, os, socket, time, _posixshmem
token = {token!r}
libc = ctypes.CDLL(None, use_errno=True)
time.sleep(0.5)
probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    probe.sendto(b'hi', b'\\0' + token.encode())
    print('abstract socket reached')
except OSError:
    print('abstract socket: none')
try:
    _posixshmem.shm_open('/' + token, os.O_RDWR, 0)
    print('POSIX shm reached')
except OSError:
    print('POSIX shm: none')
print('sysv shm', libc.shmget(0x5eed, 0, 0) >= 0, 'queue', libc.msgget(0x5eed, 0) >= 0)
print(sorted(os.listdir('/dev/shm')), sorted(os.listdir('/tmp')), sorted(os.listdir('/work')))
"""


@needs_namespaces
@pytest.mark.parametrize("filtered", [True, False], ids=["with-filter", "without-filter"])
def test_programs_of_a_batch_share_nothing_they_could_leave_behind(
    filtered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program leaves a note everywhere it could (an abstract socket, POSIX shared memory and
    a semaphore, a fifo and files in /tmp and /work, System V shared memory and a message
    queue); programs running beside it and after it find none. Without the seccomp filter the
    System V objects are made, in the program's own IPC namespace."""
    if filtered and not CAPS.seccomp:
        pytest.skip("no seccomp filter here")
    if not filtered:
        monkeypatch.setattr(seccomp, "supported", lambda: False)
    token = "r1-" + secrets.token_hex(6)
    limits = Limits(cpu_seconds=2, wall_seconds=5)
    writer = Job(WRITER.format(token=token), limits=limits)
    reader = Job(READER.format(token=token), limits=limits)
    outcomes = run_jobs([writer, reader, reader, writer, reader], workers=3)
    assert outcomes[0][0].stdout == f"sysv {not filtered} {not filtered}\n", outcomes[0][0]
    for (result,) in (outcomes[1], outcomes[2], outcomes[4]):
        assert result.status == "ok", result
        assert result.stdout.splitlines() == [
            "abstract socket: none",
            "POSIX shm: none",
            "sysv shm False queue False",
            "[] [] ['main.py']",
        ]


LEAVES_SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range(4):  # 4 x 50 MB, detached and never removed
    segment = libc.shmget(0, 50 << 20, 0o1600)
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 50 << 20)
    libc.shmdt(ctypes.c_void_p(address))
print('left 200 MB')
"""
LEAVES_TMPFS = """
for path in ('/tmp/a', '/tmp/b', '/dev/shm/c', '/dev/shm/d', '/work/a', '/work/b', '/work/c'):
    with open(path, 'wb') as f:  # 7 x 7 MB in tmpfs files (/dev/shm is in /tmp)
        f.write(b'x' * (7 << 20))
print('left tmpfs files')
"""
NEEDS_200_MB = "data = bytearray(200 << 20)\nprint(len(data) >> 20)\n"


@needs_cgroup
@needs_namespaces
@pytest.mark.parametrize("leaves", ["sysv", "tmpfs"])
def test_memory_a_program_leaves_behind_never_reaches_the_next(
    leaves: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker, so that each program gets the cgroup of the one before it when it may:
    memory still charged to a cgroup after its program ended (System V segments, tmpfs files,
    freed only once the kernel tears their namespace down) makes the next program get a fresh
    cgroup, not an OOM kill. System V segments need the filter off (it refuses them)."""
    if leaves == "sysv":
        monkeypatch.setattr(seccomp, "supported", lambda: False)
    limits = Limits(cpu_seconds=2, wall_seconds=10, memory_mb=256)
    code = LEAVES_SYSV if leaves == "sysv" else LEAVES_TMPFS
    jobs = [Job(code, limits=limits), *[Job(NEEDS_200_MB, limits=limits)] * 3]
    outcomes = run_jobs(jobs, workers=1)
    assert outcomes[0][0].status == "ok", outcomes[0][0]
    assert [(r.status, r.stdout) for (r,) in outcomes[1:]] == [("ok", "200\n")] * 3


@needs_cgroup
def test_memory_left_outside_a_programs_namespaces_never_reaches_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where namespaces are off, what a program leaves in the host's /dev/shm (120 MB in
    tmpfs files) stays charged to its cgroup after it ends, until the files go. The next
    program (200 MB of a 256 MB limit) must not get that cgroup: before a cgroup is reused, the
    memory it holds is checked, not only its processes; without that check the next program is
    killed by the cgroup's OOM killer. (With namespaces, a program's tmpfs and IPC go with its
    namespaces, and the test above passes either way.)"""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    monkeypatch.setenv("R1_SANDBOX_NO_NAMESPACES", "1")
    monkeypatch.setenv("R1_SANDBOX_UNISOLATED", "1")  # without root: one uid, no namespaces
    monkeypatch.setattr(runner, "_capabilities", None)  # found again, without namespaces
    tag = secrets.token_hex(4)
    leaves = (
        "for i in range(8):\n"
        f"    with open(f'/dev/shm/r1-left-{tag}-{{i}}', 'wb') as f:\n"
        "        f.write(b'x' * (15 << 20))\n"
        "print('left 120 MB')\n"
    )
    limits = Limits(cpu_seconds=2, wall_seconds=10, memory_mb=256, file_size_mb=16)
    try:
        outcomes = run_jobs([Job(leaves, limits=limits), *[Job(NEEDS_200_MB, limits=limits)] * 3],
                            workers=1)  # fmt: skip
    finally:
        for i in range(8):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/r1-left-{tag}-{i}")
    assert outcomes[0][0].stdout == "left 120 MB\n", outcomes[0][0]
    assert [(r.status, r.stdout) for (r,) in outcomes[1:]] == [("ok", "200\n")] * 3


@needs_cgroup
def test_a_cgroup_holding_memory_is_not_empty_without_a_process() -> None:
    """The check before a cgroup is reused covers memory, not only processes: a tmpfs file
    charged to it keeps it from being reused until the file is gone."""
    if os.geteuid() != 0:
        pytest.skip("joining a cgroup of our own needs root here")
    session = cgroups.make_session_dir(runner._cgroup, f"r1-sandbox-check-{os.getpid()}")
    dir_fd = os.open(session, os.O_RDONLY | os.O_DIRECTORY)
    groups = cgroups.RunCgroups(dir_fd, runner._cgroup.version)
    path = f"/dev/shm/r1-left-{secrets.token_hex(4)}"
    try:
        groups.create("run", 64 << 20)
        pid = os.fork()
        if pid == 0:  # in the cgroup, leave 8 MB in a tmpfs file, and go
            groups.join("run")
            with open(path, "wb") as f:
                f.write(b"x" * (8 << 20))
            os._exit(0)
        os.waitpid(pid, 0)
        assert groups.empty("run") is False
        os.unlink(path)
        assert groups.empty("run") is True
    finally:
        if os.path.exists(path):
            os.unlink(path)
        os.close(dir_fd)
        cgroups.remove_tree(session)


def test_held_memory_counts_what_reclaim_cannot_free() -> None:
    v1 = "cache 692224\nrss 0\nshmem 20971520\nunevictable 0\ntotal_rss 5\n"
    assert cgroups.held_memory(v1, 1) == 20971520
    assert cgroups.held_memory("cache 692224\nrss 0\nshmem 0\n", 1) == 0  # page cache only
    v2 = "anon 4096\nfile 8192\nkernel 100\nshmem 0\nunevictable 0\n"
    assert cgroups.held_memory(v2, 2) == 4096


NOBODY = 65534
AS_NOBODY = """
import sys
sys.path.insert(0, {repo!r})
from sandbox import Job, run_jobs
hostname = "import ctypes\\nprint(ctypes.CDLL(None).sethostname(b'x', 1))\\n"
(result,), = run_jobs([Job(hostname)])
print(result.status, result.stdout.strip())
"""


def _world_readable(path: str) -> bool:
    """Whether a user with no rights of its own can read `path` (every folder above it open)."""
    path = os.path.realpath(path)
    parents = [os.path.dirname(path)]
    while parents[-1] != "/":
        parents.append(os.path.dirname(parents[-1]))
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in parents) and bool(
        os.stat(path).st_mode & 0o004
    )


def test_without_root_a_program_holds_no_capability() -> None:
    """A sandbox that is not root runs in a user namespace it made, where every process holds
    every capability until it gives them up; a program that kept them could rename the
    session's host for its siblings to read. Run as nobody, with an interpreter nobody can
    read."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python = next((p for p in ("/usr/bin/python3", sys.executable) if _world_readable(p)), None)
    if os.geteuid() != 0 or python is None or not _world_readable(f"{repo}/sandbox/runner.py"):
        pytest.skip("needs root (to become nobody), and an interpreter and checkout nobody reads")
    done = subprocess.run(
        [python, "-I", "-c", AS_NOBODY.format(repo=repo)],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "R1_SANDBOX_PYTHON": python},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "cannot run programs" in done.stderr or "no isolation" in done.stdout:
        pytest.skip(f"the sandbox cannot run as nobody here: {done.stderr[-300:]}")
    assert done.stdout == "ok -1\n", done.stderr[-2000:]


# ---- limits a program could lift --------------------------------------------------------------

RAISES_LIMITS = """
import resource
lifted = []
for name in sorted(n for n in dir(resource) if n.startswith('RLIMIT_')):
    which = getattr(resource, name)
    soft, hard = resource.getrlimit(which)
    if soft != hard:
        lifted.append(name + ' soft below hard')
    if hard == resource.RLIM_INFINITY:
        continue
    for new in ((hard, hard + 1), (hard + 1, hard + 1), (resource.RLIM_INFINITY,) * 2):
        try:
            resource.setrlimit(which, new)
            lifted.append(name)
        except (ValueError, OSError):
            pass
print(lifted)
"""


def test_a_program_cannot_raise_any_of_its_limits() -> None:
    mine, _ = with_siblings(Job(RAISES_LIMITS, limits=LIMITS))
    assert [(r.status, r.stdout) for r in mine] == [("ok", "[]\n")]


SPIN = "t = time.process_time()\nwhile time.process_time() - t < 2.5:\n    pass\nprint('spun')\n"
CPU_TRICKS = {
    "soft limit raised to the hard one": (
        "import resource, time\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))\n"
    ),
    "SIGXCPU ignored": "import signal, time\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n",
    "SIGXCPU handled": "import signal, time\nsignal.signal(signal.SIGXCPU, lambda *a: None)\n",
    "spinning in two threads": (
        "import threading, time\n"
        "def burn():\n    while True:\n        pass\n"
        "threading.Thread(target=burn, daemon=True).start()\n"
    ),
}


@pytest.mark.parametrize("trick", sorted(CPU_TRICKS))
def test_the_cpu_limit_holds_for_every_run(trick: str) -> None:
    """Two runs in one process, 1 s of CPU each: a program that tries to outlast its limit is
    stopped at it in each run (cpu_time, not the wall clock), before it spun 2.5 s."""
    limits = Limits(cpu_seconds=1, wall_seconds=6)
    mine, _ = with_siblings(Job(CPU_TRICKS[trick] + SPIN, INPUTS, limits=limits))
    assert reasons(mine) == [("killed", "cpu_time")] * 2, mine
    assert [r.stdout for r in mine] == ["", ""]


def test_a_call_that_spins_fails_at_its_cpu_limit() -> None:
    hostile = "import time\ndef double(x):\n" + "".join(
        f"    {line}\n" for line in SPIN.split("\n")
    )
    limits = Limits(cpu_seconds=1, wall_seconds=6)
    mine, _ = with_siblings(Job(hostile, tests=TESTS, limits=limits))
    assert reasons(mine) == [(False, "cpu_time")] * 2, mine


# ---- the reasons a run ends ---------------------------------------------------------------------

ENDINGS = {  # program: (status, exit code, reason)
    "def broken(:\n    pass\n": ("error", 1, "syntax"),
    "if True:\nprint(1)\n": ("error", 1, "syntax"),  # IndentationError
    "compile('(', 'x', 'exec')\n": ("error", 1, "exception"),  # a SyntaxError it raised itself
    "raise ValueError('no')\n": ("error", 1, "exception"),
    "import sys\nsys.exit(3)\n": ("error", 3, "exit"),
    "import os\nos._exit(4)\n": ("error", 4, "exit"),
    "import sys\nprint('Traceback (most recent call last):', file=sys.stderr)\nsys.exit(1)\n": (
        "error",
        1,
        "exit",
    ),
    "raise KeyboardInterrupt\n": ("killed", -2, "signal"),  # CPython ends by SIGINT
    "import os\nos.write(3, b'\\xff' * 8)\n": ("killed", -9, "reply"),  # on the harness's channel
    "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)\n": ("killed", -24, "signal"),
    "x = bytearray(1 << 30)\n": ("error", 1, "memory"),
    "open('big', 'wb').write(b'x' * (20 << 20))\n": ("error", 1, "file_size"),
    # SIGXFSZ and SIGPIPE are ignored, as CPython has them: a program may handle the error
    "try:\n    open('big', 'wb').write(b'x' * (20 << 20))\n"
    "except OSError as e:\n    print(e.errno)\n": ("ok", 0, ""),
    "import os\nr, w = os.pipe()\nos.close(r)\ntry:\n    os.write(w, b'x')\n"
    "except BrokenPipeError:\n    print('EPIPE')\n": ("ok", 0, ""),
}


def test_every_end_names_its_true_cause() -> None:
    programs = sorted(ENDINGS)
    jobs = [Job(GOOD_STDIO, INPUTS, limits=LIMITS)]
    for code in programs:
        jobs += [Job(code, limits=Limits(memory_mb=128, file_size_mb=8)), jobs[0]]
    outcomes = run_jobs(jobs, workers=3)
    for i, code in enumerate(programs):
        (result,) = outcomes[1 + 2 * i]
        assert (result.status, result.exit_code, result.reason) == ENDINGS[code], (code, result)
    for outcome in outcomes[::2]:
        assert_correct(outcome)


CALL_ENDINGS = {
    "def double(x:\n    return 2 * x\n": "syntax",
    "raise ValueError('at import')\ndef double(x):\n    return 2 * x\n": "load",
    "def double(x):\n    return bytearray(1 << 30)\n": "memory",
    "def double(x):\n    raise OSError(27, 'File too large')\n": "file_size",
    "def double(x):\n    raise ValueError(x)\n": "raised",
}


@pytest.mark.parametrize(
    "code", sorted(CALL_ENDINGS), ids=[CALL_ENDINGS[c] for c in sorted(CALL_ENDINGS)]
)
def test_every_failed_call_names_its_true_cause(code: str) -> None:
    limits = Limits(cpu_seconds=1, wall_seconds=3, memory_mb=128)
    mine, _ = with_siblings(Job(code, tests=TESTS, limits=limits), siblings=2)
    assert reasons(mine) == [(False, CALL_ENDINGS[code])] * 2, mine


DISPOSITIONS = (
    "import signal\n"
    "names = {signal.SIG_DFL: 'default', signal.SIG_IGN: 'ignored'}\n"
    "for s in sorted(signal.valid_signals()):\n"
    "    if s not in (signal.SIGKILL, signal.SIGSTOP):\n"
    "        handler = signal.getsignal(s)\n"
    "        print(int(s), names.get(handler) or getattr(handler, '__name__', handler))\n"
    "print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))\n"
)


def _from_a_terminal() -> None:
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):  # the C library's own (32, 33)
                signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def test_signal_dispositions_are_plain_pythons() -> None:
    """What a plain interpreter started from a terminal has (every signal at its default, then
    CPython's own: SIGPIPE and SIGXFSZ ignored, SIGINT raising KeyboardInterrupt), whatever the
    sandbox was started under."""
    plain = subprocess.run(
        [sys.executable, "-I", "-S", "-c", DISPOSITIONS],
        capture_output=True,
        text=True,
        preexec_fn=_from_a_terminal,  # noqa: PLW1509 - a test's own child, no threads involved
        check=True,
    ).stdout
    mine, _ = with_siblings(Job(DISPOSITIONS, limits=LIMITS), siblings=2)
    assert mine[0].stdout == plain
    assert {"2 default_int_handler", "13 ignored", "25 ignored", "1 default"} <= set(
        plain.splitlines()
    )

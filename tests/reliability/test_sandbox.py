"""The code-execution sandbox: ordinary programs, hostile programs kept inside their limits, and
programs that try to get past the test harness.

Each hostile test checks from the outside (this process, the host's files, the process table,
the cgroup tree) that nothing reached past the sandbox; tests of guards the machine cannot give
are skipped with the reason `sandbox.capabilities()` reports.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import sandbox.runner as runner
from sandbox import Job, Limits, SandboxResult, capabilities, run_jobs, run_python
from sandbox.host_dirs import site_packages_dirs

REPO = Path(__file__).resolve().parents[2]
TIGHT = Limits(cpu_seconds=1, wall_seconds=1.5)
CAPS = capabilities()
IS_ROOT = os.geteuid() == 0
needs_isolation = pytest.mark.skipif(
    not (CAPS.runs_programs and (CAPS.namespaces or CAPS.uid_drop)),
    reason=f"the sandbox refuses or cannot run programs here: {CAPS.reason}",
)
needs_seccomp = pytest.mark.skipif(not CAPS.seccomp, reason="no seccomp filter here")
needs_cgroup = pytest.mark.skipif(not CAPS.cgroup, reason="no memory cgroup here")


@pytest.fixture(autouse=True)
def nothing_left_behind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After each test: no process under a sandbox uid, no session directory, no cgroup left."""
    dirs: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: object, **kwargs: object) -> str:
        path = mkdtemp(*args, **kwargs)
        dirs.append(path)
        return path

    monkeypatch.setattr(runner.tempfile, "mkdtemp", recording_mkdtemp)
    before = set(_session_cgroups())  # another process's (a killed run's) are not this test's
    yield
    assert [d for d in dirs if os.path.exists(d)] == []
    left = _live_descendants()
    assert left == [], [_described(p) for p in left]
    if IS_ROOT:
        left = _live_sandbox_processes()
        assert left == [], [_described(p) for p in left]
    assert sorted(set(_session_cgroups()) - before) == []


def _session_cgroups() -> list[str]:
    """This process's session cgroups: another process's (a pipeline run beside the tests) are
    not this test's to clean up."""
    if runner._cgroup is None:
        return []
    return glob.glob(os.path.join(runner._cgroup.path, _own_sessions() + "*"))


def _own_sessions() -> str:
    """The name every session this process opens starts with (`r1-sandbox-<pid>-`)."""
    return runner._session_prefix()


def _in_anothers_session(p: psutil.Process) -> bool:
    """Whether `p` runs in a session another process opened: in its session cgroup (where
    cgroups are read), or under its session's launcher (another test worker's, a pipeline run
    beside the tests). A process that escaped its session has no launcher above it: counted."""
    try:
        with open(f"/proc/{p.pid}/cgroup") as f:
            groups = f.read()
    except OSError:
        groups = ""
    if runner.SESSION_PREFIX in groups:
        return _own_sessions() not in groups
    launcher = next((a for a in _ancestors(p) if _is_launcher(a)), None)
    return launcher is not None and _parent_pid(launcher) != os.getpid()


def _described(p: psutil.Process) -> str:
    """A process left behind, for the failure's message: its command, parents and cgroups."""
    try:
        with open(f"/proc/{p.pid}/cgroup") as f:
            groups = " ".join(line.rsplit(":", 1)[-1] for line in f.read().split())
        parents = [(a.pid, a.cmdline()[-1:]) for a in _ancestors(p)]
        return f"{p.pid} {p.cmdline()} parents {parents} cgroups {groups}"
    except (OSError, psutil.Error) as error:
        return f"{p.pid}: {error}"


def _ancestors(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.parents()
    except psutil.Error:
        return []


def _is_launcher(p: psutil.Process) -> bool:
    try:
        return any(arg.endswith("launcher.py") for arg in p.cmdline())
    except psutil.Error:
        return False


def _parent_pid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


def _resource_tracker(p: psutil.Process) -> bool:
    """Python's multiprocessing resource tracker: started once in a process's life by whatever
    first uses multiprocessing in it (another test on this worker, or a pool it left starting
    in the background: seen in CI at a sandbox test's teardown), kept until the process ends.
    The sandbox uses no multiprocessing."""
    try:
        return any("multiprocessing.resource_tracker" in a for a in p.cmdline())
    except psutil.Error:
        return False


DYING_S = 5.0  # a killed session's processes may take this long to exit on a loaded machine


def _live_descendants() -> list[psutil.Process]:
    """This process's descendants still alive `DYING_S` after the test (or as soon as none is):
    a process the sandbox killed is not held against it while it exits, one left running is."""
    deadline = time.monotonic() + DYING_S
    while True:
        live = [
            p
            for p in psutil.Process().children(recursive=True)
            if _status(p) not in (None, psutil.STATUS_ZOMBIE) and not _resource_tracker(p)
        ]
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.1)


def _live_sandbox_processes() -> list[psutil.Process]:
    low, high = runner.UID_BASE, runner.UID_BASE + runner.UID_SPAN
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        if p.info["uids"] is None or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        uids = (p.info["uids"].real, p.info["uids"].effective)
        if any(low <= uid < high for uid in uids) and not _in_anothers_session(p):
            found.append(p)
    # one that ended while it was looked at (another session's, at its end) is not left behind
    return [p for p in found if _status(p) not in (None, psutil.STATUS_ZOMBIE)]


def _status(p: psutil.Process) -> str | None:
    try:
        return p.status()
    except psutil.Error:
        return None


def ran(result: SandboxResult) -> SandboxResult:
    """The result, once it is known the sandbox itself did run the program."""
    assert result.status != "sandbox_failed", result.detail
    return result


# Ordinary programs


@needs_isolation
def test_hello_world() -> None:
    result = ran(run_python("print('hello, world')"))
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "hello, world\n")
    assert result.reason == ""  # no limit reached


@needs_isolation
def test_stdin_echo() -> None:
    result = ran(run_python("import sys\nsys.stdout.write(sys.stdin.read()[::-1])", stdin="abc\n"))
    assert result.stdout == "\ncba"


@needs_isolation
def test_large_stdin_round_trip() -> None:
    data = "x" * 300_000 + "\n"
    result = ran(run_python("import sys\nprint(len(sys.stdin.read()))", stdin=data))
    assert result.stdout.strip() == str(len(data))


@needs_isolation
def test_non_zero_exit() -> None:
    result = ran(run_python("import sys\nprint('partial')\nsys.exit(3)"))
    assert (result.status, result.exit_code, result.stdout, result.reason) == (
        "error",
        3,
        "partial\n",
        "exit",
    )


@needs_isolation
def test_syntax_error() -> None:
    result = ran(run_python("def broken(:\n    pass"))
    assert (result.status, result.exit_code) == ("error", 1)
    assert "SyntaxError" in result.stderr and "SyntaxError" in result.detail


@needs_isolation
def test_an_exception_shows_the_programs_traceback_only() -> None:
    result = ran(run_python("def f():\n    raise ValueError('bad')\nf()"))
    assert (result.status, result.reason) == ("error", "exception")
    assert 'File "/work/main.py", line 2, in f' in result.stderr
    assert "sandbox" not in result.stderr


@needs_isolation
def test_files_sit_beside_the_program_and_import() -> None:
    files = {"helper.py": "def double(x):\n    return 2 * x\n", "data/n.txt": "21"}
    code = "from helper import double\nprint(double(int(open('data/n.txt').read())))"
    assert ran(run_python(code, files=files)).stdout == "42\n"


def test_file_names_must_stay_inside_the_run_directory() -> None:
    result = run_python("print(1)", files={"../escape.py": "x"})
    assert result.status == "error" and "outside the work directory" in result.stderr


@needs_isolation
def test_an_output_over_the_cap_ends_the_run() -> None:
    result = ran(run_python("print('x' * 1_000_000)", limits=Limits(output_bytes=1000)))
    assert (result.status, result.reason) == ("killed", "output_limit")
    assert len(result.stdout) == 1000


@needs_isolation
def test_clean_environment() -> None:
    code = "import os, sys\nprint(sorted(os.environ))\nprint(sys.flags.ignore_environment)"
    lines = ran(run_python(code)).stdout.splitlines()
    assert lines == ["['HOME', 'LANG', 'PATH', 'TMPDIR']", "1"]


@needs_isolation
def test_concurrent_runs_from_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: run_python(f"print({i} * {i})"), range(8)))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]


@needs_isolation
def test_threads_are_allowed() -> None:
    code = (
        "import threading\nout = []\n"
        "ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(sorted(out))"
    )
    assert ran(run_python(code)).stdout == f"{list(range(8))}\n"


@needs_isolation
def test_each_input_of_a_job_gets_a_fresh_main_and_fresh_streams() -> None:
    code = (
        "import sys, builtins, os\n"
        "print(globals().get('seen'), getattr(builtins, 'leak', None), os.getcwd())\n"
        "seen = sys.stdin.read().strip()\n"
        "builtins.leak = seen\n"
        "os.chdir('/tmp')\n"
        "print(seen, file=sys.stderr)\n"
    )
    (results,) = run_jobs([Job(code, ("a", "b", "c"))])
    assert [r.stdout for r in results] == ["None None /work\n"] * 3
    assert [r.stderr for r in results] == ["a\n", "b\n", "c\n"]


@needs_isolation
def test_a_run_that_ends_its_process_leaves_the_next_input_a_fresh_one() -> None:
    code = "import os, sys\nn = int(sys.stdin.read())\nif n == 1:\n    os._exit(7)\nprint(n)"
    (results,) = run_jobs([Job(code, ("0", "1", "2"))])
    assert [(r.status, r.exit_code, r.stdout) for r in results] == [
        ("ok", 0, "0\n"),
        ("error", 7, ""),
        ("ok", 0, "2\n"),
    ]


def test_capabilities_are_consistent() -> None:
    if CAPS.namespaces:
        assert CAPS.network_isolated and CAPS.filesystem_isolated and CAPS.reason == ""
    else:
        assert not CAPS.network_isolated and CAPS.reason
    assert CAPS.uid_drop == IS_ROOT
    # every guard that is off is named, in words, for the start-up warning
    assert bool(CAPS.uncontained) == (
        not CAPS.namespaces or not CAPS.cgroup or not CAPS.seccomp or not CAPS.uid_drop
    )


# Hostile programs


@needs_isolation
def test_infinite_loop_stops_at_the_cpu_limit() -> None:
    result = ran(run_python("while True:\n    pass", limits=TIGHT))
    assert result.status in ("killed", "timeout")
    assert result.reason in ("cpu_time", "wall_time")  # stopped by a limit, not by itself


@needs_isolation
def test_sleeping_program_stops_at_the_wall_clock() -> None:
    result = ran(
        run_python("import time\nprint('started', flush=True)\ntime.sleep(60)", limits=TIGHT)
    )
    # it ran (it printed) until the wall-clock limit stopped it
    assert (result.status, result.reason, result.stdout) == ("timeout", "wall_time", "started\n")


@needs_isolation
def test_closed_outputs_do_not_hide_a_running_program() -> None:
    code = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)"
    assert ran(run_python(code, limits=TIGHT)).status == "timeout"


@needs_isolation
@needs_seccomp
def test_a_program_may_not_start_processes_unless_allowed() -> None:
    code = (
        "import os, subprocess\n"
        "for start in (os.fork, lambda: subprocess.run(['/bin/true']),"
        " lambda: os.execv('/bin/true', ['true'])):\n"
        "    try:\n"
        "        start()\n"
        "        print('started')\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
    )
    assert ran(run_python(code)).stdout == "refused 1\n" * 3


@needs_isolation
def test_fork_bomb_is_held_at_the_process_limit() -> None:
    code = (
        "import os, time\n"
        "forks = 0\n"
        "for _ in range(1000):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"  # leave the process group: must not matter
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        forks += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(forks, flush=True)\n"
        "time.sleep(60)\n"
    )
    limits = Limits(cpu_seconds=1, wall_seconds=1.5, processes=8, spawn=True)
    result = ran(run_python(code, limits=limits))
    assert result.status == "timeout"
    assert int(result.stdout) < limits.processes


@needs_isolation
def test_endless_fork_bomb_is_contained() -> None:
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    result = ran(run_python(code, limits=Limits(cpu_seconds=1, wall_seconds=1.5, spawn=True)))
    assert result.status in ("timeout", "killed")
    assert psutil.Process().is_running()


@needs_isolation
def test_background_process_does_not_outlive_the_program() -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('done')"
    limits = Limits(cpu_seconds=1, wall_seconds=1.5, spawn=True)
    result = ran(run_python(code, limits=limits))
    # the run ends with the program, not with its child: waiting for the child would end it at
    # the wall-clock limit; the autouse fixture checks the child is gone too
    assert (result.status, result.reason, result.stdout) == ("ok", "", "done\n")


@needs_isolation
@pytest.mark.parametrize(
    "code",
    ["x = bytearray(1024 ** 3)", "chunks = []\nwhile True:\n    chunks.append(b'x' * 10 ** 7)"],
    ids=["one-allocation", "growing"],
)
def test_memory_hog_hits_the_memory_limit(code: str) -> None:
    before = psutil.Process().memory_info().rss
    result = ran(run_python(code, limits=Limits(memory_mb=128, wall_seconds=5)))
    assert result.status in ("error", "killed")
    assert result.reason == "memory"
    assert psutil.Process().memory_info().rss < before + 64 * 1024 * 1024


@needs_isolation
@needs_cgroup
def test_memory_outside_the_address_space_is_counted_too() -> None:
    """60 MB of tmpfs files, which RLIMIT_AS does not see, under a 64 MB limit."""
    code = (
        "data = b'x' * (1 << 20)\n"
        "for n in range(5):\n"
        "    with open(f'/tmp/big{n}', 'wb') as f:\n"
        "        for _ in range(15):\n"
        "            f.write(data)\n"
        "print('wrote it all')\n"
    )
    result = ran(run_python(code, limits=Limits(memory_mb=64, file_size_mb=20)))
    assert (result.status, result.reason) == ("killed", "memory")
    assert "wrote it all" not in result.stdout


@needs_isolation
@needs_seccomp
def test_memory_files_io_uring_and_network_sockets_are_refused() -> None:
    code = (
        "import ctypes, os, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, call in [\n"
        "    ('memfd', lambda: os.memfd_create('x')),\n"
        "    ('inet', lambda: socket.socket(socket.AF_INET)),\n"
        "    ('inet6', lambda: socket.socket(socket.AF_INET6)),\n"
        "    ('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),\n"
        "]:\n"
        "    try:\n"
        "        call()\n"
        "        print(name, 'made')\n"
        "    except OSError as exc:\n"
        "        print(name, 'refused', exc.errno)\n"
        "print('io_uring', libc.syscall(425, 8, ctypes.create_string_buffer(120)),"
        " ctypes.get_errno())\n"
        "a, b = socket.socketpair()\n"
        "a.send(b'unix ok')\n"
        "print(b.recv(7).decode())\n"
    )
    lines = ran(run_python(code)).stdout.splitlines()
    assert lines == [
        "memfd refused 1",
        "inet refused 1",
        "inet6 refused 1",
        "netlink refused 1",
        "io_uring -1 1",
        "unix ok",
    ]


@needs_isolation
def test_file_size_limit() -> None:
    code = "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (100 * 1024 * 1024))"
    result = ran(run_python(code, limits=Limits(file_size_mb=8)))
    assert result.status in ("error", "killed")
    assert result.reason == "file_size"


@needs_isolation
def test_third_party_packages_are_not_importable() -> None:
    if not CAPS.filesystem_isolated:
        pytest.skip(f"no private root here: {CAPS.reason}")
    code = (
        "import sys\n"
        f"sys.path += {site_packages_dirs()!r}\n"
        "for name in ('yaml', 'psutil', 'torch', 'numpy'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "        print(name, 'imported')\n"
        "    except ImportError:\n"
        "        print(name, 'missing')\n"
        "import json, collections, re\n"
        "print('stdlib ok')\n"
    )
    out = ran(run_python(code)).stdout
    assert "imported" not in out and out.endswith("stdlib ok\n")


@needs_isolation
def test_reading_outside_its_directory_fails(tmp_path: Path) -> None:
    if not (CAPS.filesystem_isolated or CAPS.uid_drop):
        pytest.skip(f"no private root and no uid drop here: {CAPS.reason}")
    private = tmp_path / "private.txt"
    private.write_text("top secret")
    private.chmod(0o600)
    targets = [str(private), str(REPO / "README.md"), "/etc/passwd", "/etc/shadow"]
    if not CAPS.filesystem_isolated:  # world-readable files stay readable without a private root
        targets = [str(private), "/etc/shadow"]
    code = (
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        print(path, 'READ', open(path).read(20))\n"
        "    except OSError as exc:\n"
        "        print(path, 'DENIED', type(exc).__name__)\n"
    )
    result = ran(run_python(code))
    assert result.status == "ok"
    assert result.stdout.count("DENIED") == len(targets), result.stdout
    assert "top secret" not in result.stdout and "root:" not in result.stdout


@needs_isolation
def test_environment_secrets_are_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "r1-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("R1_TEST_SECRET", secret)
    code = (
        "import os\n"
        "print(os.environ.get('R1_TEST_SECRET'))\n"
        f"for pid in ({os.getpid()}, {os.getppid()}, 1, 'self'):\n"
        "    try:\n"
        "        print(pid, 'READ', open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(pid, 'DENIED', type(exc).__name__)\n"
    )
    result = ran(run_python(code))
    assert result.status == "ok"
    assert result.stdout.startswith("None\n")
    assert secret not in result.stdout + result.stderr
    if CAPS.filesystem_isolated or CAPS.uid_drop:  # no /proc at all, or not ours to read
        for pid in (os.getpid(), os.getppid()):
            assert f"{pid} DENIED" in result.stdout


@needs_isolation
def test_writing_outside_its_directory_fails() -> None:
    if not (CAPS.filesystem_isolated or CAPS.uid_drop):
        pytest.skip(f"no private root and no uid drop here: {CAPS.reason}")
    token = secrets.token_hex(6)
    # Without a private root, the world-writable /tmp stays writable (see sandbox/README.md).
    host_tmp = (
        [Path(tempfile.gettempdir()) / f"outside_{token}"] if CAPS.filesystem_isolated else []
    )
    refused = [REPO / f"outside_{token}", Path(f"/usr/outside_{token}")]
    code = (
        f"for path in {[str(p) for p in [*host_tmp, *refused]]!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('escaped')\n"
        "        print(path, 'WROTE')\n"
        "    except OSError as exc:\n"
        "        print(path, 'DENIED', type(exc).__name__)\n"
    )
    result = ran(run_python(code))
    assert result.status == "ok"
    for path in [*host_tmp, *refused]:
        assert not path.exists()
    for path in refused:
        assert f"{path} DENIED" in result.stdout


@needs_isolation
def test_runs_of_one_session_do_not_see_each_others_files() -> None:
    if not CAPS.filesystem_isolated:
        pytest.skip(f"no private root here: {CAPS.reason}")
    token = secrets.token_hex(6)
    writer = f"open('/tmp/{token}', 'w').write('x')\nopen('/work/{token}', 'w').write('x')\n"
    reader = (
        "import os, time\ntime.sleep(0.3)\n"
        f"print(os.path.exists('/tmp/{token}'), os.path.exists('/work/{token}'))"
    )
    jobs = [Job(writer), Job(reader), Job(writer), Job(reader)]
    results = run_jobs(jobs, workers=4)
    assert [r[0].stdout for r in results[1::2]] == ["False False\n"] * 2


@needs_isolation
def test_network_connections_fail() -> None:
    if not CAPS.network_isolated:
        pytest.skip(f"no network namespace here: {CAPS.reason}")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"for address in [('127.0.0.1', {port}), ('1.1.1.1', 80), ('example.com', 443)]:\n"
            "    try:\n"
            "        socket.create_connection(address, timeout=0.5)\n"
            "        print(address, 'CONNECTED')\n"
            "    except OSError as exc:\n"
            "        print(address, 'FAILED', type(exc).__name__)\n"
        )
        result = ran(run_python(code, limits=Limits(wall_seconds=5)))
        with pytest.raises(BlockingIOError):
            server.accept()
    assert result.status == "ok"
    assert "CONNECTED" not in result.stdout and result.stdout.count("FAILED") == 3


@needs_isolation
@pytest.mark.parametrize("spawn", [False, True], ids=["no-spawn", "spawn"])
def test_killing_its_parent_or_the_judge_fails(spawn: bool) -> None:
    if not (CAPS.namespaces or CAPS.uid_drop):
        pytest.skip(f"kill(-1) would reach our own processes here: {CAPS.reason}")
    code = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {os.getpid()}, 1, 2, 3, 4, -1):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError as exc:\n"
        "        print(pid, type(exc).__name__)\n"
        "print('still here')\n"
    )
    results = run_jobs([Job(code, limits=Limits(spawn=spawn)), Job("print('next')")])
    assert results[0][0].stdout.endswith("still here\n") and results[0][0].status == "ok"
    assert results[1][0].stdout == "next\n"  # the session's judge and zygote lived on
    assert psutil.Process().is_running() and psutil.Process(os.getppid()).is_running()


@needs_isolation
def test_signals_to_the_whole_group_stay_inside() -> None:
    code = "import os, signal\nos.killpg(0, signal.SIGKILL)"
    result = ran(run_python(code))
    assert (result.status, result.exit_code, result.reason) == ("killed", -signal.SIGKILL, "signal")
    assert psutil.Process().is_running()


@needs_isolation
def test_a_program_gets_default_signals_whatever_the_sandbox_was_started_under() -> None:
    """Started under nohup or as a shell's background job, the sandbox inherits SIGHUP or SIGINT
    ignored, and signals may come blocked; the program gets none of that."""
    ignored = (signal.SIGHUP, signal.SIGINT, signal.SIGUSR1)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignored}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    code = (
        "import signal\n"
        "print([signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGUSR1)])\n"
        "print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
    )
    try:
        result = ran(run_python(code))
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    handlers = [signal.SIG_DFL, signal.default_int_handler, signal.SIG_DFL]
    assert result.stdout == f"{handlers}\n[]\n", result.stderr


@needs_isolation
@pytest.mark.parametrize("number", [1, 9, 15, 31, 34, 35, 40, 64])
def test_every_signal_ends_a_run_as_a_failure_with_its_name(number: int) -> None:
    result = ran(
        run_python(f"import os\nos.kill(os.getpid(), {number})\nimport time\ntime.sleep(1)")
    )
    assert (result.status, result.exit_code, result.reason) == ("killed", -number, "signal")
    assert "killed by SIG" in result.detail


# The sandbox itself failing


def test_a_missing_interpreter_is_a_sandbox_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "PYTHON", "/nonexistent/bin/python3")
    result = run_python("print(1)")
    assert result.status == "sandbox_failed" and result.exit_code is None
    assert result.reason == "sandbox_failed"


def test_unisolated_runs_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = runner.Capabilities(False, False, False, False, reason="unshare: not permitted")
    monkeypatch.setattr(runner, "_capabilities", bare)
    monkeypatch.delenv("R1_SANDBOX_UNISOLATED", raising=False)
    result = run_python("import os\nos.kill(-1, 9)")
    assert result.status == "sandbox_failed" and "no isolation" in result.detail


@needs_isolation
def test_what_a_killed_process_left_is_removed_and_a_live_ones_kept():
    """A process killed before its session's cleanup leaves the session's folder and cgroup;
    the next process to start the sandbox removes them, and leaves a live process's alone."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    dead, live = f"{runner.SESSION_PREFIX}{ended.stdout.strip()}-x", runner._session_prefix() + "x"
    places = [tempfile.gettempdir()] + ([runner._cgroup.path] if runner._cgroup else [])
    made = [os.path.join(place, name) for place in places for name in (dead, live)]
    for path in made:
        os.mkdir(path)
    try:
        runner._remove_stale_sessions()
        assert [os.path.exists(p) for p in made] == [False, True] * len(places)
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                os.rmdir(path)

"""The code-execution sandbox: ordinary programs, hostile programs kept inside their limits, and
the code reward built on it.

Each hostile test checks from the outside (this process, the host's files, the process table) that
nothing reached past the sandbox; tests of isolation the machine cannot give are skipped with the
reason `sandbox.capabilities()` reports.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import sandbox.runner as runner
from rewards.code import code_reward, extract_code, parse_tests
from rewards.registry import get_reward
from sandbox import Limits, SandboxResult, capabilities, run_python

REPO = Path(__file__).resolve().parents[2]
TIGHT = Limits(cpu_seconds=1, wall_seconds=1.5)
CAPS = capabilities()
IS_ROOT = os.geteuid() == 0
needs_isolation = pytest.mark.skipif(
    not (CAPS.runs_programs and (CAPS.namespaces or CAPS.uid_drop)),
    reason=f"the sandbox refuses or cannot run programs here: {CAPS.reason}",
)


@pytest.fixture(autouse=True)
def nothing_left_behind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After each test: no process of any run's uid alive, no run's temporary directory left."""
    uids: list[int] = []
    dirs: list[str] = []
    run_ids, mkdtemp = runner._run_ids, tempfile.mkdtemp

    def recording_ids() -> tuple[int, int]:
        ids = run_ids()
        uids.append(ids[0])
        return ids

    def recording_mkdtemp(*args: object, **kwargs: object) -> str:
        path = mkdtemp(*args, **kwargs)
        dirs.append(path)
        return path

    monkeypatch.setattr(runner, "_run_ids", recording_ids)
    monkeypatch.setattr(runner.tempfile, "mkdtemp", recording_mkdtemp)
    yield
    assert [d for d in dirs if os.path.exists(d)] == []
    assert _live_descendants() == []
    if IS_ROOT:
        assert _live_processes_of(set(uids)) == []


def _live_descendants() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if _status(p) not in (None, psutil.STATUS_ZOMBIE)
    ]


def _live_processes_of(uids: set[int]) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        if p.info["uids"] is None or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if {p.info["uids"].real, p.info["uids"].effective} & uids:
            found.append(p)
    return found


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
    assert result.seconds < 5


@needs_isolation
def test_stdin_echo() -> None:
    result = ran(run_python("import sys\nsys.stdout.write(sys.stdin.read()[::-1])", stdin="abc\n"))
    assert result.stdout == "\ncba"


@needs_isolation
def test_large_stdin_round_trip() -> None:
    data = "x" * 300_000 + "\n"
    result = ran(
        run_python("import sys\nprint(len(sys.stdin.read()))", stdin=data, limits=Limits())
    )
    assert result.stdout.strip() == str(len(data))


@needs_isolation
def test_non_zero_exit() -> None:
    result = ran(run_python("import sys\nprint('partial')\nsys.exit(3)"))
    assert (result.status, result.exit_code, result.stdout) == ("error", 3, "partial\n")


@needs_isolation
def test_syntax_error() -> None:
    result = ran(run_python("def broken(:\n    pass"))
    assert (result.status, result.exit_code) == ("error", 1)
    assert "SyntaxError" in result.stderr and "SyntaxError" in result.detail


@needs_isolation
def test_files_sit_beside_the_program_and_import() -> None:
    files = {"helper.py": "def double(x):\n    return 2 * x\n", "data/n.txt": "21"}
    code = "from helper import double\nprint(double(int(open('data/n.txt').read())))"
    assert ran(run_python(code, files=files)).stdout == "42\n"


def test_file_names_must_stay_inside_the_run_directory() -> None:
    result = run_python("print(1)", files={"../escape.py": "x"})
    assert result.status == "sandbox_failed" and "inside" in result.detail


@needs_isolation
def test_output_is_capped() -> None:
    result = ran(run_python("print('x' * 1_000_000)", limits=Limits(output_bytes=1000)))
    assert result.status == "ok" and len(result.stdout) == 1000


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


def test_capabilities_are_consistent() -> None:
    if CAPS.namespaces:
        assert CAPS.network_isolated and CAPS.filesystem_isolated and CAPS.reason == ""
    else:
        assert not CAPS.network_isolated and CAPS.reason
    assert CAPS.uid_drop == IS_ROOT


# Hostile programs


@needs_isolation
def test_infinite_loop_stops_at_the_cpu_limit() -> None:
    result = ran(run_python("while True:\n    pass", limits=TIGHT))
    assert result.status in ("killed", "timeout")
    assert result.seconds < TIGHT.wall_seconds + 1.5
    if result.status == "killed":
        assert "cpu time limit" in result.detail


@needs_isolation
def test_sleeping_program_stops_at_the_wall_clock() -> None:
    result = ran(
        run_python("import time\nprint('started', flush=True)\ntime.sleep(60)", limits=TIGHT)
    )
    assert result.status == "timeout" and result.stdout == "started\n"
    assert TIGHT.wall_seconds <= result.seconds < TIGHT.wall_seconds + 1.5


@needs_isolation
def test_closed_outputs_do_not_hide_a_running_program() -> None:
    code = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)"
    assert ran(run_python(code, limits=TIGHT)).status == "timeout"


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
    limits = Limits(cpu_seconds=1, wall_seconds=1.5, processes=8)
    result = ran(run_python(code, limits=limits))
    assert result.status == "timeout"
    assert int(result.stdout) < limits.processes


@needs_isolation
def test_endless_fork_bomb_is_contained() -> None:
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    result = ran(run_python(code, limits=TIGHT))
    assert result.status in ("timeout", "killed")
    assert psutil.Process().is_running()


@needs_isolation
def test_background_process_does_not_outlive_the_program() -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('done')"
    result = ran(run_python(code, limits=TIGHT))
    assert result.status == "ok" and result.stdout == "done\n"
    assert result.seconds < TIGHT.wall_seconds + 1.5


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
    assert "memory" in result.detail
    assert psutil.Process().memory_info().rss < before + 64 * 1024 * 1024


@needs_isolation
def test_file_size_limit() -> None:
    code = "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (100 * 1024 * 1024))"
    result = ran(run_python(code, limits=Limits(file_size_mb=8)))
    assert result.status in ("error", "killed")
    assert "file size limit" in result.detail


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
    # A private /tmp is the run's own: written there, gone with the run.


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
def test_killing_its_parent_fails() -> None:
    if not (CAPS.namespaces or CAPS.uid_drop):
        pytest.skip(f"kill(-1) would reach our own processes here: {CAPS.reason}")
    code = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {os.getpid()}, {os.getppid()}, 1, -1):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError as exc:\n"
        "        print(pid, type(exc).__name__)\n"
        "print('still here')\n"
    )
    result = ran(run_python(code))
    assert result.status == "ok" and result.stdout.endswith("still here\n")
    assert psutil.Process().is_running() and psutil.Process(os.getppid()).is_running()
    # And the sandbox keeps working for the next program.
    assert run_python("print(1)").stdout == "1\n"


@needs_isolation
def test_signals_to_the_whole_group_stay_inside() -> None:
    code = "import os, signal\nos.killpg(0, signal.SIGKILL)"
    result = ran(run_python(code))
    assert (result.status, result.exit_code) == ("killed", -signal.SIGKILL)
    assert psutil.Process().is_running()


# The sandbox itself failing


def test_missing_interpreter_is_a_sandbox_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "PYTHON", "/nonexistent/bin/python3")
    result = run_python("print(1)")
    assert result.status == "sandbox_failed" and result.exit_code is None


def test_unisolated_runs_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = runner.Capabilities(False, False, False, False, reason="unshare: not permitted")
    monkeypatch.setattr(runner, "_capabilities", bare)
    monkeypatch.delenv("R1_SANDBOX_UNISOLATED", raising=False)
    result = run_python("import os\nos.kill(-1, 9)")
    assert result.status == "sandbox_failed" and "no isolation" in result.detail


# The code reward

CODE_COMPLETION = (
    "<think>double small numbers</think>\n<answer>\n```python\nn = int(input())\n"
    "print(n * 2 if n < 3 else n)\n```\n</answer>"
)
STDIO_TESTS = [
    {"input": "1", "output": "2"},
    {"input": "2\n", "output": "4\n"},
    {"input": "5", "output": "10"},
]


@needs_isolation
def test_code_reward_is_the_fraction_of_tests_passed() -> None:
    assert code_reward(["p"], [CODE_COMPLETION], [STDIO_TESTS]) == [pytest.approx(2 / 3)]


@needs_isolation
def test_code_reward_assert_style_and_json_tests() -> None:
    completion = "```python\ndef double(x):\n    return 2 * x\n```"
    tests = '[{"code": "assert double(2) == 4"}, {"code": "assert double(3) == 5"}]'
    assert code_reward(["p"], [completion], [tests]) == [0.5]


@needs_isolation
def test_code_reward_edge_cases() -> None:
    completions = [
        "no code at all",
        "```python\nwhile True:\n    pass\n```",
        CODE_COMPLETION,
        CODE_COMPLETION,
        "```python\nunterminated",
    ]
    tests = [STDIO_TESTS, [{"input": "", "output": ""}], [], "{not json", STDIO_TESTS]
    scores = code_reward(["p"] * 5, completions, tests, wall_seconds=1.5, cpu_seconds=1)
    assert scores == [0.0, 0.0, None, 0.0, 0.0]


def test_code_reward_is_none_when_the_sandbox_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "PYTHON", "/nonexistent/bin/python3")
    assert code_reward(["p"], [CODE_COMPLETION], [STDIO_TESTS]) == [None]


@needs_isolation
def test_code_reward_is_registered() -> None:
    fn = get_reward("code", wall_seconds=2.0)
    assert fn(["p"], [CODE_COMPLETION], tests=[STDIO_TESTS]) == [pytest.approx(2 / 3)]


def test_extract_code_prefers_python_in_the_answer() -> None:
    completion = (
        "```python\nprint('draft')\n```\n<answer>```text\nnotes\n```\n"
        "```python\nprint('final')\n```</answer>"
    )
    assert extract_code(completion) == "print('final')\n"
    assert extract_code("<answer>42</answer>") is None
    assert parse_tests("assert f(1) == 1") == [{"code": "assert f(1) == 1"}]


@needs_isolation
def test_sigkill_exit_code_is_reported() -> None:
    result = ran(run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"))
    assert (result.status, result.exit_code) == ("killed", -signal.SIGKILL)

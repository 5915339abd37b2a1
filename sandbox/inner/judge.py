"""The judge: runs a session's jobs through the zygote, a few at a time, and reports each result.

It reads jobs from the runner (`{"job": id, "kind": "program" | "calls", ...}` messages, then
`{"end": true}`) and writes one result message per job. It is the only process of the session that
sees tests: they reach it on its own pipe, after the zygote was forked, and no program is ever
forked from it; it runs under its own uid when the sandbox is root.

- A program job runs the code once on its stdin and reports what happened (`facts`: exit status,
  CPU seconds, OOM, time and output limits, stdout and stderr): the runner classifies it.
- A calls job loads the code as a module in a confined process and runs each assert-style test
  here, in the judge, with the program's top-level names bound to proxies: a call or attribute
  read crosses to the program's process, and only plain data comes back (sandbox/inner/wire.py).
  `a == b` and `a != b` in a test compare type and value (`same`), never through a method of the
  program's objects, which never leave its process. A test passes when it runs to its end.
  When the program's process ends (a crash, a limit), the next test gets a fresh one.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import json
import os
import queue
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from sandbox.inner import wire

SETUP_SECONDS = 10.0  # a confined process must be ready within this (else the sandbox failed)
DRAIN_SECONDS = 0.5  # outputs still read after the program has ended
REPLY_LIMIT = 16 << 20
JOB_LIMIT = 256 << 20
SAME = "__r1_same__"

Emit = Callable[[dict[str, Any]], None]


def serve(job_fd: int, result_fd: int, controls: list[socket.socket]) -> NoReturn:
    jobs: queue.Queue[dict | None] = queue.Queue()
    lock = threading.Lock()

    def emit(message: dict[str, Any]) -> None:
        with lock:
            wire.write_message(result_fd, message)

    workers = [threading.Thread(target=_work, args=(c, jobs, emit), daemon=True) for c in controls]
    for worker in workers:
        worker.start()
    try:
        while True:
            message = wire.read_message(job_fd, JOB_LIMIT)
            if message.get("end"):
                break
            jobs.put(message)
    except EOFError:
        pass
    for _ in workers:
        jobs.put(None)
    for worker in workers:
        worker.join()
    os._exit(0)


def _work(control: socket.socket, jobs: queue.Queue, emit: Emit) -> None:
    while (job := jobs.get()) is not None:
        try:
            result = (
                run_calls(control, job) if job["kind"] == "calls" else run_program(control, job)
            )
        except Exception as exc:  # noqa: BLE001 - the judge's own failure: the job is unscorable
            result = {"judge_error": f"{type(exc).__name__}: {exc}"[:500]}
        emit({"job": job["job"], **result})


# ---- one confined process ----------------------------------------------------------------------


class Ended(BaseException):
    """The program's process ended (or was ended) while the judge waited on it.

    A BaseException, so that a test's `except Exception` cannot swallow it."""


class Process:
    """A confined process the zygote forked for one job, and the judge's end of its channel.

    `deadline` is the current run's or test's (`start_clock` sets it)."""

    def __init__(self, control: socket.socket, job: dict):
        self.control = control
        self.limits = job["limits"]
        self.channel, theirs = socket.socketpair()
        self.started = time.monotonic()
        self.deadline = self.started + SETUP_SECONDS
        self.pid: int | None = None
        self.exit: dict[str, Any] | None = None
        self.setup_error: str | None = None
        self.timed_out = False
        try:
            request = {"op": "spawn", "setup": _run_setup(job)}
            socket.send_fds(control, [json.dumps(request).encode()], [theirs.fileno()])
            reply = self._control_message(time.monotonic() + SETUP_SECONDS)
        finally:
            theirs.close()
        if reply.get("op") != "spawned":
            self.setup_error = f"spawn failed: {reply.get('error', reply)}"
            return
        self.pid = reply["pid"]
        self._wait_ready()

    @property
    def alive(self) -> bool:
        return self.exit is None and self.pid is not None and not self.setup_error

    def start_clock(self) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + float(self.limits["wall_seconds"])
        self.timed_out = False

    def _wait_ready(self) -> None:
        try:
            message = self.read(time.monotonic() + SETUP_SECONDS, REPLY_LIMIT)
        except (Ended, wire.WireError) as exc:
            message = {"setup_failed": f"no ready message: {exc}"}
        if message.get("ready") is not True:
            self.setup_error = str(message.get("setup_failed", message))[:500]
            self.finish(kill=True)

    def send(self, message: dict[str, Any], fds: list[int] = ()) -> None:
        self.channel.settimeout(max(0.001, self.deadline - time.monotonic()))
        try:
            data = wire.dumps(message)
            sent = socket.send_fds(self.channel, [data], list(fds)) if fds else 0
            self.channel.sendall(data[sent:])
        except TimeoutError:
            self.timed_out = True
            raise Ended("wall clock limit") from None
        except OSError as exc:
            raise Ended(f"channel closed: {exc}") from None

    def read(self, deadline: float, limit: int) -> Any:
        try:
            return wire.read_message(self.channel.fileno(), limit, deadline)
        except TimeoutError:
            self.timed_out = True
            raise Ended("wall clock limit") from None
        except (EOFError, ConnectionError):
            raise Ended("the program's process ended") from None

    def finish(self, kill: bool) -> None:
        """Wait for the exit report (killing the process first when told to, or once the
        deadline has passed) and close the channel."""
        if self.exit is None and self.pid is not None:
            if kill:
                self._kill()
            try:
                self.exit = self._control_message(max(self.deadline, time.monotonic() + 1.0))
            except TimeoutError:
                self.timed_out = True
                self._kill()
                self.exit = self._control_message(time.monotonic() + SETUP_SECONDS)
        self.channel.close()

    def _kill(self) -> None:
        self.control.send(json.dumps({"op": "kill", "pid": self.pid}).encode())

    def _control_message(self, deadline: float) -> dict[str, Any]:
        self.control.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            data = self.control.recv(1 << 16)
        finally:
            self.control.settimeout(None)
        if not data:
            raise RuntimeError("the zygote is gone")
        return json.loads(data)

    def facts(self, status: int | None = None) -> dict[str, Any]:
        """What came of the current run: `status` from the harness, else from the exit report."""
        exit_ = self.exit or {}
        return {
            "setup_error": self.setup_error,
            "status": status if status is not None else exit_.get("status"),
            "cpu": exit_.get("cpu", 0.0),
            "oom": exit_.get("oom", False),
            "timed_out": self.timed_out,
            "seconds": time.monotonic() - self.started,
        }


def _run_setup(job: dict) -> dict[str, Any]:
    limits = job["limits"]
    runs = len(job.get("tests") or job.get("inputs") or [None])
    cpu = int(limits["rlimits"]["cpu"])
    return {
        "mode": job["kind"],
        "spawn": bool(limits["spawn"]),
        "rlimits": {**limits["rlimits"], "cpu_total": (cpu + 2) * runs},
        "tmpfs_mb": limits["tmpfs_mb"],
    }


# ---- program jobs --------------------------------------------------------------------------------


def run_program(control: socket.socket, job: dict) -> dict[str, Any]:
    """The program once per input, in one process while it keeps running normally."""
    runs: list[dict[str, Any]] = []
    process: Process | None = None
    for stdin in job["inputs"]:
        if process is None or not process.alive:
            process = Process(control, job)
            if process.setup_error:
                return {"runs": runs, "setup_error": process.setup_error}
            with contextlib.suppress(Ended):
                process.send({"code": job["code"], "files": job.get("files") or {}})
        runs.append(_run_once(process, stdin.encode("utf-8", "surrogatepass")))
        if job["limits"]["spawn"] and process.alive:  # what it started ends with its process
            process.finish(kill=True)
    if process is not None:
        if process.alive:
            with contextlib.suppress(Ended):
                process.send({"op": "bye"})
        process.finish(kill=not process.alive)
    return {"runs": runs}


def _run_once(process: Process, stdin: bytes) -> dict[str, Any]:
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    nonce = secrets.token_hex(8)
    process.start_clock()
    try:
        process.send({"op": "run", "nonce": nonce}, [stdin_r, out_w, err_w])
    except Ended:
        pass
    finally:
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
    try:
        out, err, exceeded = _communicate(process, stdin_w, stdin, out_r, err_r)
    finally:
        os.close(out_r)
        os.close(err_r)
    status = None
    if not exceeded and process.alive:
        try:
            reply = process.read(process.deadline, REPLY_LIMIT)
            if reply.get("nonce") == nonce and type(reply.get("exit")) is int:
                status = reply["exit"]
        except (Ended, wire.WireError):
            pass
    if status is None:  # the process ended, or was ended: its exit report says how
        process.finish(kill=True)
    return {
        **process.facts(status),
        "output_exceeded": exceeded,
        "stdout": out.decode("latin-1"),
        "stderr": err.decode("latin-1"),
    }


def _communicate(
    process: Process, stdin_fd: int, stdin: bytes, out_fd: int, err_fd: int
) -> tuple[bytes, bytes, bool]:
    """Feed stdin and read both outputs until they close, the deadline passes, an output goes
    over the cap, or the process has ended and they are drained."""
    cap = int(process.limits["output_bytes"])
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    selector = selectors.DefaultSelector()
    for fd in kept:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    feeder = _Feeder(stdin_fd, stdin, selector)
    selector.register(process.control, selectors.EVENT_READ)
    selector.register(process.channel, selectors.EVENT_READ)  # the harness reports the run's end
    deadline, exceeded, draining = process.deadline, False, False
    try:
        while not exceeded and any(key.fd in kept for key in selector.get_map().values()):
            left = deadline - time.monotonic()
            if left <= 0:
                process.timed_out = not draining
                break
            for key, _ in selector.select(min(left, 1.0)):
                if key.fd == stdin_fd:
                    feeder.write_some()
                elif key.fd == process.control.fileno():
                    selector.unregister(key.fd)
                    process.exit = process._control_message(time.monotonic() + SETUP_SECONDS)
                    deadline, draining = min(deadline, time.monotonic() + DRAIN_SECONDS), True
                elif key.fd == process.channel.fileno():  # what is left to read is drained
                    selector.unregister(key.fd)
                    deadline, draining = min(deadline, time.monotonic() + DRAIN_SECONDS), True
                elif not _read_some(selector, key.fd, kept[key.fd], cap):
                    exceeded = True
    finally:
        selector.close()
        feeder.close()
    return bytes(kept[out_fd]), bytes(kept[err_fd]), exceeded


class _Feeder:
    """Writes a program's stdin as the pipe takes it, then closes it."""

    def __init__(self, fd: int, data: bytes, selector: selectors.BaseSelector):
        self.fd, self.pending, self.selector = fd, memoryview(data), selector
        self.open = True
        if self.pending:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_WRITE)
        else:
            self.close()

    def write_some(self) -> None:
        try:
            self.pending = self.pending[os.write(self.fd, self.pending[:65536]) :]
        except BlockingIOError:
            return
        except OSError:  # the program closed its stdin
            self.pending = self.pending[:0]
        if not self.pending:
            self.selector.unregister(self.fd)
            self.close()

    def close(self) -> None:
        if self.open:
            self.open = False
            os.close(self.fd)


def _read_some(selector: selectors.BaseSelector, fd: int, kept: bytearray, cap: int) -> bool:
    """Read what is there; False when the output went over the cap."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return True
    if not chunk:
        selector.unregister(fd)
        return True
    room = cap - len(kept)
    kept += chunk[:room]
    return len(chunk) <= room


# ---- calls jobs ----------------------------------------------------------------------------------


class Remote:
    """A callable, object or class of the program under test, in its own process."""

    __slots__ = ("_program", "_id", "_type")

    def __init__(self, program: Program, id_: int, type_name: str):
        self._program, self._id, self._type = program, id_, type_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._program.request({"op": "call", "target": {"handle": self._id}},
                                     args=list(args), kwargs=kwargs)  # fmt: skip

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._program.request(
            {"op": "getattr", "target": {"handle": self._id}, "attr": attr}
        )

    def __repr__(self) -> str:
        return f"<{self._type} of the program under test>"


class Unsupported(Exception):
    """A test the judge cannot run (e.g. one passing a function to the program)."""


class Program:
    """A process with the program loaded as a module, answering the judge's calls."""

    def __init__(self, control: socket.socket, job: dict):
        self.process = Process(control, job)
        self.names: dict[str, dict[str, Any]] = {}
        self.load_error: str | None = None
        if self.process.setup_error:
            return
        self.process.start_clock()
        try:
            self.process.send({"code": job["code"]})
            reply = self.process.read(self.process.deadline, REPLY_LIMIT)
        except (Ended, wire.WireError) as exc:
            self.load_error = f"ended while loading: {exc}"
            return
        if isinstance(reply.get("loaded"), dict):
            self.names = reply["loaded"]
        else:
            self.load_error = f"{reply.get('raised', 'error')}: {reply.get('message', '')}"

    @property
    def alive(self) -> bool:
        return self.process.exit is None and not self.process.setup_error and not self.load_error

    def remote(self, id_: int, type_name: str) -> Remote:
        return Remote(self, id_, type_name)

    def request(self, message: dict[str, Any], **values: Any) -> Any:
        for key, value in values.items():
            try:
                message[key] = wire.encode(value, _handle_of)
            except wire.WireError as exc:
                raise Unsupported(
                    f"the test passes the program a value it cannot send: {exc}"
                ) from None
        self.process.send(message)
        try:
            reply = self.process.read(self.process.deadline, REPLY_LIMIT)
            if "value" in reply:
                return wire.decode(reply["value"], self.remote)
        except wire.WireError as exc:
            self.process.finish(kill=True)
            raise Ended(f"malformed reply: {exc}") from None
        raise _program_exception(
            str(reply.get("raised", "Exception")), str(reply.get("message", ""))
        )

    def close(self) -> dict[str, Any]:
        if self.alive:
            with contextlib.suppress(Ended):
                self.process.send({"op": "bye"})
        self.process.finish(kill=not self.alive)
        return self.process.facts()


def _handle_of(value: Any) -> int:
    if isinstance(value, Remote):
        return value._id
    raise wire.WireError(f"a {type(value).__name__} is not plain data")


class ProgramError(Exception):
    """An exception raised inside the program under test, of a type the judge does not have."""


def _program_exception(name: str, message: str) -> BaseException:
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls, message = ProgramError, f"{name}: {message}"
    try:
        exc = cls(message)
    except Exception:  # noqa: BLE001 - an exception type that wants other arguments
        exc = ProgramError(f"{name}: {message}")
    exc.r1_from_program = True  # type: ignore[attr-defined]
    return exc


def run_calls(control: socket.socket, job: dict) -> dict[str, Any]:
    verdicts: list[dict[str, Any]] = []
    program: Program | None = None
    for source in job["tests"]:
        if program is None or not program.alive:
            if program is not None:
                program.close()
            if program is not None and program.load_error:  # loading fails the same way again
                verdicts.append({"passed": False, "why": "load", "detail": program.load_error})
                continue
            program = Program(control, job)
            if program.process.setup_error:
                program.close()
                return {"setup_error": program.process.setup_error, "verdicts": verdicts}
            if program.load_error:
                verdicts.append({"passed": False, "why": "load", "detail": program.load_error,
                                 "facts": program.close()})  # fmt: skip
                continue
        program.process.start_clock()
        verdicts.append(run_test(program, source))
    if program is not None:
        program.close()
    return {"verdicts": verdicts}


def run_test(program: Program, source: str) -> dict[str, Any]:
    try:
        tree = _StrictEquality().visit(ast.parse(source))
        code = compile(ast.fix_missing_locations(tree), "<test>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return {"passed": None, "why": "bad_test", "detail": f"SyntaxError: {exc}"}
    namespace = _namespace(program, tree)
    try:
        exec(code, namespace)
        return {"passed": True, "why": "passed"}
    except Ended as exc:
        facts = program.close()
        return {"passed": False, "why": "ended", "detail": str(exc), "facts": facts}
    except Unsupported as exc:
        return {"passed": None, "why": "unsupported", "detail": str(exc)}
    except AssertionError as exc:
        why = "raised" if getattr(exc, "r1_from_program", False) else "assertion"
        return {"passed": False, "why": why, "detail": str(exc)[:300]}
    except BaseException as exc:  # noqa: BLE001 - anything else ends the test as failed
        why = "raised" if getattr(exc, "r1_from_program", False) else "test_error"
        return {"passed": False, "why": why, "detail": f"{type(exc).__name__}: {exc}"[:300]}


class _StrictEquality(ast.NodeTransformer):
    """`a == b` -> `same(a, b)` and `a != b` -> `not same(a, b)` (single comparisons)."""

    def visit_Compare(self, node: ast.Compare) -> ast.AST:  # noqa: N802 - the ast API's name
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], ast.Eq | ast.NotEq):
            return node
        call = ast.Call(ast.Name(SAME, ast.Load()), [node.left, node.comparators[0]], [])
        return ast.UnaryOp(ast.Not(), call) if isinstance(node.ops[0], ast.NotEq) else call


def same(a: Any, b: Any) -> bool:
    """Equal as plain data: the same type and the same value all the way down. Numbers are the
    exception tests are written for: an int and a float compare by value (`2.0 == 2`), as the
    test's author ran them; a bool is not a number here. NaN equals NaN."""
    if type(a) in _NUMBERS and type(b) in _NUMBERS:
        return a == b or (a != a and b != b)
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if type(a) is complex:
        return same(a.real, b.real) and same(a.imag, b.imag)
    return a is b if type(a) is Remote else bool(a == b)


_NUMBERS = (int, float)


def _namespace(program: Program, tree: ast.AST) -> dict[str, Any]:
    """Builtins, the standard library modules the test names, and the program's other names."""
    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "__test__", SAME: same}
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    for name in used - {SAME}:
        if hasattr(builtins, name):
            continue  # a program's own `len` or `abs` never stands in for the test's
        entry = program.names.get(name)
        module = entry.get("module") if entry else name
        if module is not None:
            if str(module).split(".")[0] in sys.stdlib_module_names:
                with contextlib.suppress(ImportError):
                    namespace[name] = importlib.import_module(str(module))
        elif "value" in entry:
            namespace[name] = wire.decode(entry["value"], program.remote)
        elif "object" in entry:
            namespace[name] = program.remote(int(entry["object"]), name)
    return namespace

"""Calls jobs: the code loaded as a module in a confined process, each assert-style test run here,
in the judge, with the program's top-level names bound to proxies (`Remote`). A call or attribute
read crosses to the program's process and only plain data comes back (sandbox/inner/wire.py);
`a == b` and `a != b` in a test compare as `same` does, never through a method of the program's
objects, which never leave its process. A test passes when it runs to its end. When the
program's process ends (a crash, a limit), the next test gets a fresh one."""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import socket
import sys
from typing import Any

from sandbox.inner import wire
from sandbox.inner.process import REPLY_LIMIT, Ended, Process, Refused, Reporter

SAME = "__r1_same__"


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

    def __bool__(self) -> bool:
        raise TypeError(f"a {self._type} of the program under test has no truth value here")

    def __repr__(self) -> str:
        return f"<{self._type} of the program under test>"


class Unsupported(Exception):
    """A test the judge cannot run (e.g. one passing a function to the program)."""


class Program:
    """A process with the program loaded as a module, answering the judge's calls."""

    def __init__(self, control: socket.socket, job: dict, report: Reporter):
        self.process = Process(control, job, report)
        self.names: dict[str, dict[str, Any]] = {}
        self.load_error: str | None = None
        self.load_reason = "load"  # or "syntax": the program does not compile
        self.load_reported = False  # it said why loading failed (and then exits by itself)
        if self.process.setup_error:
            return
        self.process.start_clock()
        try:
            self.process.send({"code": job["code"]})
            reply = self.process.read(self.process.deadline, REPLY_LIMIT)
        except (Ended, Refused) as exc:
            self.load_error = f"ended while loading: {exc}"
            return
        names = reply.get("loaded")
        if isinstance(names, dict) and all(isinstance(v, dict) for v in names.values()):
            self.names = names
        else:
            self.load_error = f"{reply.get('raised', 'error')}: {reply.get('message', '')}"[:500]
            self.load_reason = "syntax" if reply.get("stage") == "compile" else "load"
            self.load_reported = "raised" in reply

    @property
    def alive(self) -> bool:
        return self.process.alive and not self.load_error

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
        reply = self.process.read(self.process.deadline, REPLY_LIMIT)
        if "value" in reply:
            return self.decode(reply["value"])
        if "unsendable" in reply:  # its own encoder refused the value
            raise Refused(f"the program returned what is not plain data: {reply['unsendable']}")
        raise _program_exception(
            str(reply.get("raised", "Exception")), str(reply.get("message", "")), reply.get("errno")
        )

    def decode(self, value: Any) -> Any:
        """A value of the program as fresh plain data (Refused when over the bounds)."""
        try:
            return wire.decode(value, self.remote)
        except (wire.WireError, MemoryError) as exc:
            raise Refused(str(exc)[:300]) from None

    def close(self) -> dict[str, Any]:
        """End the process (it leaves by itself after a bye, or after telling that loading
        failed; otherwise it is killed) and say how it ended."""
        leaves = self.alive or self.load_reported
        if self.alive:
            with contextlib.suppress(Ended):
                self.process.send({"op": "bye"})
        self.process.finish(kill=not leaves)
        return self.process.facts()


def _handle_of(value: Any) -> int:
    if isinstance(value, Remote):
        return value._id
    raise wire.WireError(f"a {type(value).__name__} is not plain data")


class ProgramError(Exception):
    """An exception raised inside the program under test, of a type the judge does not have."""


EFBIG = 27


def _program_exception(name: str, message: str, errno: object = None) -> BaseException:
    """The built-in exception of that name (a test may expect it), marked as the program's, with
    the limit it means when it means one: MemoryError (its address space) or EFBIG (its file
    size)."""
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls, message = ProgramError, f"{name}: {message}"
    try:
        exc = cls(message)
    except Exception:  # noqa: BLE001 - an exception type that wants other arguments
        exc = ProgramError(f"{name}: {message}")
    exc.r1_from_program = True  # type: ignore[attr-defined]
    exc.r1_reason = (  # type: ignore[attr-defined]
        "memory" if name == "MemoryError" else "file_size" if errno == EFBIG else "raised"
    )
    return exc


def run_calls(control: socket.socket, job: dict, report: Reporter) -> dict[str, Any]:
    """Each test of the job, its verdict reported as it comes; what else there is to say about
    the job (a setup error) is returned."""
    program: Program | None = None
    for source in job["tests"]:
        if program is None or not program.alive:
            if program is not None:
                program.close()
            if program is not None and program.load_error:  # loading fails the same way again
                report.item(_load_failure(program))
                continue
            program = Program(control, job, report)
            if program.process.setup_error:
                program.close()
                return {"setup_error": program.process.setup_error}
            if program.load_error:
                report.item({**_load_failure(program), "facts": program.close()})
                continue
        program.process.start_clock()
        report.item(run_test(program, source))
    if program is not None:
        program.close()
    return {}


def _load_failure(program: Program) -> dict[str, Any]:
    return {"passed": False, "why": program.load_reason, "detail": program.load_error}


def run_test(program: Program, source: str) -> dict[str, Any]:
    try:
        tree = _StrictEquality().visit(ast.parse(source))
        code = compile(ast.fix_missing_locations(tree), "<test>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return {"passed": None, "why": "bad_test", "detail": f"{type(exc).__name__}: {exc}"}
    try:
        exec(code, _namespace(program, tree))
        return {"passed": True, "why": "passed"}
    except Ended as exc:
        facts = program.close()
        return {"passed": False, "why": "ended", "detail": str(exc), "facts": facts}
    except Refused as exc:
        return {"passed": False, "why": "reply", "detail": str(exc)}
    except Unsupported as exc:
        return {"passed": None, "why": "unsupported", "detail": str(exc)}
    except AssertionError as exc:
        why = getattr(exc, "r1_reason", "assertion")
        return {"passed": False, "why": why, "detail": _text(exc, with_type=False)}
    except MemoryError as exc:  # the test's own work on the program's values, in the judge
        why = getattr(exc, "r1_reason", "memory")
        return {"passed": False, "why": why, "detail": _text(exc)}
    except BaseException as exc:  # noqa: BLE001 - anything else ends the test as failed
        why = getattr(exc, "r1_reason", "test_error")
        return {"passed": False, "why": why, "detail": _text(exc)}


def _text(exc: BaseException, with_type: bool = True) -> str:
    """An exception in words, at most 300 characters, whatever its arguments are (an int too
    long to print, an object that cannot be shown)."""
    try:
        text = str(exc)[:300]
    except BaseException:  # noqa: BLE001
        text = "(its message cannot be shown)"
    return f"{type(exc).__name__}: {text}"[:300] if with_type else text


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
    """What the test's free names mean: builtins (never the program's own `len` or `abs`); the
    judge's standard-library modules, for a name the test reads attributes of (`math.isclose`,
    even when the program defines a `math` of its own) or that the program imported; and the
    program's other top-level names, as proxies or plain values."""
    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "__test__", SAME: same}
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} - {SAME}
    dotted = {
        node.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    for name in used:
        if hasattr(builtins, name):
            continue
        entry = program.names.get(name) or {}
        module = entry.get("module")
        if module is None and (not entry or name in dotted) and _is_stdlib(name):
            module = name
        if module is not None:
            if _importable(str(module)):
                with contextlib.suppress(ImportError):
                    namespace[name] = importlib.import_module(str(module))
        elif "value" in entry:
            namespace[name] = program.decode(entry["value"])
        elif "object" in entry:
            namespace[name] = program.remote(int(entry["object"]), name)
    return namespace


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


# Standard-library modules that do something when imported (open a browser, print, start a
# program): a program may name them as what its names stand for, and the judge imports what
# they name.
_ACTS_ON_IMPORT = frozenset(
    {"antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo", "ensurepip"}
)


def _importable(module: str) -> bool:
    """A standard-library module the judge may import for a test: none that acts on import."""
    parts = module.split(".")
    return _is_stdlib(module) and parts[0] not in _ACTS_ON_IMPORT and "__main__" not in parts

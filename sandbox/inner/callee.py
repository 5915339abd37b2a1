"""Calls mode, inside the confined process: the program loaded as a module (`__name__ ==
"solution"`), its top-level names reported, then each of the judge's calls and attribute reads
answered with one message: the value as plain data (sandbox/inner/wire.py), the exception it
raised, or why the value cannot be sent (`unsendable`: not plain data, or over the bounds).
Objects that are not plain data stay here, and the judge holds them by number (a handle).
Standard library only."""

from __future__ import annotations

import builtins
import os
import sys
import types
from typing import Any, NoReturn

from sandbox.inner import wire


class _Handles:
    """Objects of the program the judge refers to by number."""

    def __init__(self) -> None:
        self.objects: list[Any] = []

    def add(self, obj: Any) -> int:
        self.objects.append(obj)
        return len(self.objects) - 1

    def get(self, index: int, type_name: str = "") -> Any:
        if not 0 <= index < len(self.objects):
            raise LookupError(f"no object {index}")
        return self.objects[index]


def serve(load: dict, channel: int, request_limit: int) -> NoReturn:
    """Load the program and answer the judge's calls until it says bye."""
    sys.path[:] = [p for p in sys.path if p.startswith(sys.base_prefix)]
    sys.argv = ["solution.py"]
    handles = _Handles()
    module = types.ModuleType("solution")
    module.__builtins__ = builtins
    sys.modules["solution"] = module
    try:
        code = compile(str(load["code"]), "solution.py", "exec", dont_inherit=True)
    except BaseException as exc:  # noqa: BLE001 - it does not compile: reported, then out
        stage = "" if isinstance(exc, MemoryError) else "compile"
        _send(channel, {**_raised(exc), "stage": stage})
        os._exit(1)
    try:
        exec(code, module.__dict__)
        names = {
            k: _describe(v, handles) for k, v in list(module.__dict__.items()) if k[:2] != "__"
        }
        reply: dict[str, Any] = {"loaded": names}
    except BaseException as exc:  # noqa: BLE001 - the program failed to load: reported, then out
        _send(channel, _raised(exc))
        os._exit(1)
    _send(channel, reply)
    while True:
        request = wire.read_message(channel, request_limit)
        if request.get("op") == "bye":
            os._exit(0)
        _send(channel, _answer(request, module.__dict__, handles))


def _describe(value: Any, handles: _Handles) -> dict[str, Any]:
    if isinstance(value, types.ModuleType):
        return {"module": getattr(value, "__name__", "")}
    if callable(value):
        return {"object": handles.add(value)}
    try:
        return {"value": wire.encode(value, handles.add)}
    except BaseException:  # noqa: BLE001
        return {"object": handles.add(value)}


def _answer(request: dict, names: dict[str, Any], handles: _Handles) -> dict[str, Any]:
    try:
        target = _target(request["target"], names, handles)
        if request["op"] == "getattr":
            attr = str(request["attr"])
            if attr.startswith("__"):
                raise AttributeError(attr)
            result = getattr(target, attr)
        else:
            args = wire.decode(request.get("args", []), handles.get)
            kwargs = wire.decode(request.get("kwargs", {"$": "dict", "v": []}), handles.get)
            result = target(*args, **kwargs)
        return {"value": wire.encode(result, handles.add)}
    except wire.WireError as exc:  # what it returned is not plain data, or is over the bounds
        return {"unsendable": str(exc)[:300]}
    except BaseException as exc:  # noqa: BLE001 - the program's own error, reported
        return _raised(exc)


def _target(ref: dict, names: dict[str, Any], handles: _Handles) -> Any:
    if "handle" in ref:
        return handles.get(int(ref["handle"]))
    return names[str(ref["name"])]


def _raised(exc: BaseException) -> dict[str, Any]:
    try:
        message = str(exc)[:300]
    except BaseException:  # noqa: BLE001
        message = "(unprintable)"
    reply: dict[str, Any] = {"raised": type(exc).__name__[:100], "message": message}
    if isinstance(exc, OSError) and type(exc.errno) is int:
        reply["errno"] = exc.errno
    return reply


def _send(channel: int, reply: dict[str, Any]) -> None:
    try:
        wire.write_message(channel, reply)
    except (TypeError, ValueError, RecursionError) as exc:  # a reply JSON cannot carry
        wire.write_message(channel, {"unsendable": str(exc)[:300]})

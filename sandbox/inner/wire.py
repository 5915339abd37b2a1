"""Messages between the sandbox's processes, and values as plain data.

A message is a 4-byte big-endian length and that many bytes of JSON. Values cross between a
program under test and the judge as plain data only: None, bool, int, float, str, and lists,
tuples, dicts, sets, frozensets, bytes, complex numbers and ranges of them, each tagged so that
its type survives (`{"$": "tuple", "v": [...]}`). Subclasses travel as their plain base (an
IntEnum as its int, an OrderedDict or Counter as a dict, a namedtuple as a tuple); a generator or
other iterator is read out into `{"$": "iter"}`; anything else becomes a handle the judge can call
or read attributes of but never compare. Decoding builds fresh built-in objects only, so no
method of the program's own classes (`__eq__`, `__hash__`, `__repr__`) ever runs in the judge.

Standard library only: it runs inside the sandbox, imported before the private root is entered.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

HEADER = struct.Struct(">I")
MAX_DEPTH = 100
MAX_NODES = 1_000_000
_PLAIN_INT_DIGITS = 4000  # below Python's int/str conversion limit (4300 digits)


class WireError(ValueError):
    """A message or value that breaks the protocol (too large, too deep, malformed)."""


# ---- framing ----------------------------------------------------------------------------------


def dumps(message: Any) -> bytes:
    data = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return HEADER.pack(len(data)) + data


def write_message(fd: int, message: Any) -> None:
    view = memoryview(dumps(message))
    while view:
        view = view[os.write(fd, view) :]


def read_message(fd: int, limit: int, deadline: float | None = None) -> Any:
    """The next message on `fd`. EOFError when the writer is gone, TimeoutError at `deadline`
    (time.monotonic), WireError when it is over `limit` bytes or not JSON."""
    (size,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if size > limit:
        raise WireError(f"message of {size} bytes over the limit of {limit}")
    try:
        return json.loads(_read_exact(fd, size, deadline))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"malformed message: {exc}") from None


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            _wait_readable(fd, deadline)
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _wait_readable(fd: int, deadline: float) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no message before the deadline")
        if poller.poll(left * 1000):
            return


# ---- values -----------------------------------------------------------------------------------


def encode(value: Any, handle: Callable[[Any], int] | None = None) -> Any:
    """`value` as JSON-ready plain data; non-plain objects become handles (`handle(obj)` gives
    their id) or, without `handle`, raise WireError."""
    budget = [MAX_NODES]
    return _encode(value, handle, 0, budget)


def _encode(value: Any, handle: Callable[[Any], int] | None, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        raise WireError("value too deep or too large")
    kind = type(value)
    if value is None or kind is bool:
        return value
    if isinstance(value, int) and kind is not bool:
        number = int.__index__(value)
        if abs(number).bit_length() > _PLAIN_INT_DIGITS * 3:
            return {"$": "int", "v": hex(number)}
        return number
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    sub = lambda item: _encode(item, handle, depth + 1, budget)  # noqa: E731
    if isinstance(value, list):
        return [sub(item) for item in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"$": "tuple", "v": [sub(item) for item in tuple.__iter__(value)]}
    if isinstance(value, dict):
        return {"$": "dict", "v": [[sub(k), sub(v)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"$": "frozenset", "v": [sub(item) for item in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"$": "set", "v": [sub(item) for item in set.__iter__(value)]}
    if isinstance(value, bytes | bytearray):
        return {"$": "bytes", "v": bytes(value).decode("latin-1")}
    if isinstance(value, complex):
        return {"$": "complex", "v": [complex.__complex__(value).real, value.imag]}
    if kind is range:
        return {"$": "range", "v": [value.start, value.stop, value.step]}
    if isinstance(value, Iterator) and hasattr(kind, "__next__"):
        return {"$": "iter", "v": [sub(item) for item in _bounded(value, budget)]}
    if handle is None:
        raise WireError(f"a {kind.__name__} is not plain data")
    return {"$": "handle", "v": handle(value), "type": kind.__name__[:100]}


def _bounded(iterator: Iterator[Any], budget: list[int]) -> Iterator[Any]:
    for item in iterator:
        if budget[0] <= 0:
            raise WireError("iterator too long")
        yield item


Resolver = Callable[[int, str], Any]


def decode(data: Any, resolve: Resolver | None = None) -> Any:
    """Plain data back into fresh built-in objects; `resolve(id, type_name)` gives what a handle
    stands for (without it a handle decodes to a `Handle`)."""
    return _decode(data, resolve, 0)


class Handle:
    """A non-plain object of the other side, by id: it equals nothing but itself."""

    __slots__ = ("id", "type_name")

    def __init__(self, id_: int, type_name: str):
        self.id, self.type_name = id_, type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} object of the program under test>"


def _decode(data: Any, resolve: Resolver | None, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise WireError("value too deep")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [_decode(item, resolve, depth + 1) for item in data]
    if kind is not dict or set(data) - {"$", "v", "type"} or "$" not in data:
        raise WireError(f"not plain data: {str(data)[:80]}")
    tag, payload = data["$"], data.get("v")
    if tag == "int" and type(payload) is str:
        return int(payload, 16)
    if tag == "bytes" and type(payload) is str:
        return payload.encode("latin-1")
    if tag == "handle" and type(payload) is int:
        type_name = str(data.get("type", "object"))[:100]
        return resolve(payload, type_name) if resolve is not None else Handle(payload, type_name)
    if type(payload) is not list:
        raise WireError(f"malformed {tag!r} value")
    items = [_decode(item, resolve, depth + 1) for item in payload]
    try:
        return _BUILDERS[tag](items)
    except KeyError:
        raise WireError(f"unknown value tag {tag!r}") from None
    except (TypeError, ValueError) as exc:  # unhashable set members or dict keys, bad range
        raise WireError(f"malformed {tag!r} value: {exc}") from None


def _pairs_to_dict(items: list[Any]) -> dict:
    if any(type(pair) is not list or len(pair) != 2 for pair in items):
        raise ValueError("dict entries must be pairs")
    return {k: v for k, v in items}


def _complex(items: list[Any]) -> complex:
    real, imag = items
    if type(real) is not float or type(imag) is not float:
        raise ValueError("complex parts must be floats")
    return complex(real, imag)


def _range(items: list[Any]) -> range:
    if len(items) != 3 or any(type(i) is not int for i in items):
        raise ValueError("a range is three ints")
    return range(*items)


_BUILDERS: dict[str, Callable[[list[Any]], Any]] = {
    "tuple": tuple,
    "set": set,
    "frozenset": frozenset,
    "dict": _pairs_to_dict,
    "complex": _complex,
    "range": _range,
    "iter": iter,
}

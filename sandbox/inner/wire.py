"""Messages between the sandbox's processes, and values as plain data.

A message is a 4-byte big-endian length and that many bytes of JSON. Values cross between a
program under test and the judge as plain data only: None, bool, int, float, str, and lists,
tuples, dicts, sets, frozensets, bytes, complex numbers and ranges of them, each tagged so that
its type survives (`{"$": "tuple", "v": [...]}`). Subclasses travel as their plain base (an
IntEnum as its int, an OrderedDict or Counter as a dict, a namedtuple as a tuple); a generator or
other iterator is read out into `{"$": "iter"}`; anything else becomes a handle the judge can call
or read attributes of but never compare. Decoding builds fresh built-in objects only, so no
method of the program's own classes (`__eq__`, `__hash__`, `__repr__`) ever runs in the judge.

Decoding is bounded, whoever wrote the data: at most MAX_NODES values, MAX_DEPTH deep, ints of at
most MAX_INT_BITS bits, and no set or dict with more than MAX_SAME_HASH members or keys of one hash
value (plain ints, floats and tuples can be chosen to share one, and a set of them would take
quadratic time to build, in C, where no deadline reaches). A set member or dict key of a subclass
with its own `__hash__` or `__eq__` is refused when encoding: its container means something else
once it is plain data.

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
MAX_INT_BITS = 1 << 20  # about 315,000 decimal digits
MAX_SAME_HASH = 32  # members of a set, or keys of a dict, that may share one hash value
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


def read_message(
    fd: int, limit: int, deadline: float | None = None, tick: Callable[[], None] | None = None
) -> Any:
    """The next message on `fd`. EOFError when the writer is gone, TimeoutError at `deadline`
    (time.monotonic), WireError when it is over `limit` bytes or not JSON. While it waits,
    `tick()` is called every TICK_SECONDS (it may raise to stop the wait)."""
    (size,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline, tick))
    if size > limit:
        raise WireError(f"message of {size} bytes over the limit of {limit}")
    return _loads(_read_exact(fd, size, deadline, tick))


TICK_SECONDS = 0.05


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"malformed message: {str(exc)[:200]}") from None


def _read_exact(fd: int, n: int, deadline: float | None, tick: Callable[[], None] | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            _wait_readable(fd, deadline, tick)
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _wait_readable(fd: int, deadline: float, tick: Callable[[], None] | None) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no message before the deadline")
        if poller.poll(min(left, TICK_SECONDS) * 1000 if tick else left * 1000):
            return
        if tick is not None:
            tick()


class Frames:
    """Whole messages out of a byte stream read in pieces (non-blocking reads)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages `data` completes; WireError for one over the limit or not JSON."""
        self.buffer += data
        messages, start = [], 0
        while len(self.buffer) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer, start)
            if size > self.limit:
                raise WireError(f"message of {size} bytes over the limit of {self.limit}")
            end = start + HEADER.size + size
            if len(self.buffer) < end:
                break
            messages.append(_loads(bytes(self.buffer[start + HEADER.size : end])))
            start = end
        del self.buffer[:start]
        return messages


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
        bits = abs(number).bit_length()
        if bits > MAX_INT_BITS:
            raise WireError(f"an int of {bits} bits is over the limit of {MAX_INT_BITS}")
        if bits > _PLAIN_INT_DIGITS * 3:
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
    key = lambda item: sub(_plain_key(item))  # noqa: E731
    if isinstance(value, dict):
        return {"$": "dict", "v": [[key(k), sub(v)] for k, v in dict.items(value)]}
    if isinstance(value, frozenset):
        return {"$": "frozenset", "v": [key(item) for item in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"$": "set", "v": [key(item) for item in set.__iter__(value)]}
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


_KEY_BASES = (int, float, str, bytes, tuple, frozenset, complex)


def _plain_key(item: Any) -> Any:
    """A set member or dict key, refused when its type hashes or compares in its own way: in the
    program its container holds members its own `__eq__` told apart, which plain data cannot."""
    kind = type(item)
    if kind in _KEY_BASES or item is None or kind is bool:
        return item
    for base in _KEY_BASES:
        if isinstance(item, base):
            if kind.__hash__ is not base.__hash__ or kind.__eq__ is not base.__eq__:
                raise WireError(
                    f"a {kind.__name__[:100]} in a set or as a dict key has its own __hash__ or "
                    "__eq__: not plain data"
                )
            break
    return item


def _bounded(iterator: Iterator[Any], budget: list[int]) -> Iterator[Any]:
    for item in iterator:
        if budget[0] <= 0:
            raise WireError("iterator too long")
        yield item


Resolver = Callable[[int, str], Any]


def decode(data: Any, resolve: Resolver | None = None) -> Any:
    """Plain data back into fresh built-in objects; `resolve(id, type_name)` gives what a handle
    stands for (without it a handle decodes to a `Handle`). WireError when `data` is not plain
    data or is over the bounds (module docstring): its cost is linear in its size."""
    return _Decoder(resolve).value(data, 0)


class Handle:
    """A non-plain object of the other side, by id: it equals nothing but itself."""

    __slots__ = ("id", "type_name")

    def __init__(self, id_: int, type_name: str):
        self.id, self.type_name = id_, type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} object of the program under test>"


class _Decoder:
    def __init__(self, resolve: Resolver | None):
        self.resolve = resolve
        self.nodes = MAX_NODES

    def value(self, data: Any, depth: int) -> Any:
        self.nodes -= 1
        if self.nodes < 0:
            raise WireError(f"more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise WireError(f"a value nested more than {MAX_DEPTH} deep")
        kind = type(data)
        if data is None or kind in (bool, float, str):
            return data
        if kind is int:
            if data.bit_length() > MAX_INT_BITS:
                raise WireError(f"an int over {MAX_INT_BITS} bits")
            return data
        if kind is list:
            return [self.value(item, depth + 1) for item in data]
        if kind is not dict or set(data) - {"$", "v", "type"} or "$" not in data:
            raise WireError(f"not plain data: {_excerpt(data)}")
        return self.tagged(data["$"], data.get("v"), data, depth)

    def tagged(self, tag: Any, payload: Any, data: dict, depth: int) -> Any:
        if tag == "int" and type(payload) is str:
            if len(payload) > MAX_INT_BITS // 4 + 3:
                raise WireError(f"an int over {MAX_INT_BITS} bits")
            return _parse(int, payload, 16)
        if tag == "bytes" and type(payload) is str:
            return _parse(str.encode, payload, "latin-1")
        if tag == "handle" and type(payload) is int:
            type_name = str(data.get("type", "object"))[:100]
            if self.resolve is None:
                return Handle(payload, type_name)
            return self.resolve(payload, type_name)
        if type(payload) is not list or tag not in _BUILDERS:
            raise WireError(f"not plain data: {_excerpt(data)}")
        items = [self.value(item, depth + 1) for item in payload]
        try:
            return _BUILDERS[tag](items)
        except (TypeError, ValueError) as exc:  # unhashable set members or dict keys, bad range
            raise WireError(f"malformed {tag!r} value: {exc}") from None


def _parse(parse: Callable[..., Any], payload: str, arg: Any) -> Any:
    try:
        return parse(payload, arg)
    except ValueError as exc:
        raise WireError(f"malformed value: {exc}") from None


def _excerpt(data: Any) -> str:
    try:
        return json.dumps(data)[:80]
    except (TypeError, ValueError, RecursionError):
        return type(data).__name__


def _distinct_hashes(members: list[Any], what: str) -> list[Any]:
    """`members`, once it is known that no more than MAX_SAME_HASH of them share a hash value
    (TypeError for an unhashable one). Linear: one hash of each."""
    counts: dict[int, int] = {}
    for member in members:
        key = hash(member)
        counts[key] = seen = counts.get(key, 0) + 1
        if seen > MAX_SAME_HASH:
            raise ValueError(f"more than {MAX_SAME_HASH} {what} share one hash value")
    return members


def _set(items: list[Any]) -> set:
    return set(_distinct_hashes(items, "members"))


def _frozenset(items: list[Any]) -> frozenset:
    return frozenset(_distinct_hashes(items, "members"))


def _pairs_to_dict(items: list[Any]) -> dict:
    if any(type(pair) is not list or len(pair) != 2 for pair in items):
        raise ValueError("dict entries must be pairs")
    _distinct_hashes([k for k, _ in items], "keys")
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
    "set": _set,
    "frozenset": _frozenset,
    "dict": _pairs_to_dict,
    "complex": _complex,
    "range": _range,
    "iter": iter,
}

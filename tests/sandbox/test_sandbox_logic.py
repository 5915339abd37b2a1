"""The sandbox's pure parts: plain-data values, strict equality, run classification, the seccomp
filter (against a slow reference BPF interpreter) and cgroup discovery. No process is started."""

from __future__ import annotations

import ast
import collections
import enum
import errno
import math
import signal
import struct
from typing import NamedTuple

import pytest

from sandbox.inner import cgroups, seccomp, wire
from sandbox.inner.calls import SAME, _importable, _StrictEquality, same
from sandbox.limits import Limits
from sandbox.outcome import classify, signal_name, verdict_of

# ---- plain data --------------------------------------------------------------------------------


class Point(NamedTuple):
    x: int
    y: int


class Colour(enum.IntEnum):
    RED = 3


class Lying(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


def round_trip(value):
    return wire.decode(wire.json.loads(wire.dumps(wire.encode(value))[4:]))


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -7,
        2**20000,
        1.5,
        "tëxt \ud800",
        [1, [2, (3, 4)]],
        (1,),
        {1: "a", (2, 3): [4]},
        {1, 2},
        frozenset({"a"}),
        b"\x00\xff",
        1 + 2j,
        range(1, 10, 3),
    ],
    ids=lambda v: type(v).__name__,
)
def test_plain_values_come_back_equal_and_of_the_same_type(value):
    back = round_trip(value)
    assert same(back, value) if not isinstance(value, set | frozenset | range) else back == value
    assert type(back) is type(value)


def test_nan_and_infinities_travel():
    back = round_trip([math.nan, math.inf, -math.inf])
    assert math.isnan(back[0]) and back[1:] == [math.inf, -math.inf]


def test_subclasses_travel_as_their_plain_base_and_lose_their_methods():
    assert type(round_trip(Lying(7))) is int and round_trip(Lying(7)) != 8
    assert round_trip(Colour.RED) == 3 and type(round_trip(Colour.RED)) is int
    assert round_trip(Point(1, 2)) == (1, 2) and type(round_trip(Point(1, 2))) is tuple
    counter = round_trip(collections.Counter("aab"))
    assert counter == {"a": 2, "b": 1} and type(counter) is dict


def test_iterators_are_read_out_and_other_objects_become_handles():
    assert list(round_trip(iter([1, 2]))) == [1, 2]
    assert list(round_trip(x * x for x in range(3))) == [0, 1, 4]
    objects: list[object] = []
    data = wire.encode([object(), 1], lambda obj: objects.append(obj) or len(objects) - 1)
    handle, one = wire.decode(data)
    assert isinstance(handle, wire.Handle) and handle.id == 0 and one == 1
    assert handle != wire.Handle(0, "object")  # a handle equals nothing but itself
    with pytest.raises(wire.WireError, match="not plain data"):
        wire.encode(object())


def test_values_too_deep_or_too_long_are_refused():
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(wire.WireError):
        wire.encode(deep)
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(wire.WireError):
        wire.encode(cyclic)
    with pytest.raises(wire.WireError):
        wire.encode(iter(int, 1))  # an endless iterator


@pytest.mark.parametrize(
    "data",
    [
        {"a": 1},  # a mapping that is not a tag
        {"$": "evil", "v": []},
        {"$": "set", "v": [[1]]},  # unhashable member
        {"$": "dict", "v": [[[1], 2]]},  # unhashable key
        {"$": "dict", "v": [[1]]},
        {"$": "range", "v": [1, "2", 3]},
        {"$": "complex", "v": [1, 2]},
        {"$": "tuple", "v": "abc"},
    ],
)
def test_malformed_plain_data_is_refused(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


P = (1 << 61) - 1  # every multiple of it hashes to 0 as a plain int


@pytest.mark.parametrize(
    "data",
    [
        {"$": "set", "v": [k * P for k in range(1, wire.MAX_SAME_HASH + 2)]},
        {"$": "frozenset", "v": [k * P for k in range(1, wire.MAX_SAME_HASH + 2)]},
        {"$": "dict", "v": [[k * P, k] for k in range(1, wire.MAX_SAME_HASH + 2)]},
        {"$": "set", "v": [{"$": "tuple", "v": [k * P]} for k in range(1, wire.MAX_SAME_HASH + 2)]},
        [0] * (wire.MAX_NODES + 1),
        {"$": "int", "v": "f" * (wire.MAX_INT_BITS // 4 + 10)},
        2 ** (wire.MAX_INT_BITS + 1),
    ],
    ids=["set", "frozenset", "dict-keys", "tuples", "too-many", "hex-int", "int"],
)
def test_decoding_is_bounded_whoever_wrote_the_data(data):
    """Sets and dicts whose members share a hash would take quadratic time to build; every
    check is linear."""
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_sets_within_the_bounds_decode():
    at_most = [k * P for k in range(1, wire.MAX_SAME_HASH + 1)]
    assert wire.decode({"$": "set", "v": at_most}) == set(at_most)
    assert wire.decode({"$": "set", "v": list(range(100_000))}) == set(range(100_000))
    nested = 0
    for _ in range(wire.MAX_DEPTH):
        nested = [nested]
    assert wire.decode(nested) == nested


class OwnHash(int):
    __hash__ = object.__hash__


class Ordinary(int):
    """An int subclass that hashes as an int does."""


def test_set_members_that_hash_in_their_own_way_are_not_plain_data():
    with pytest.raises(wire.WireError, match="own __hash__ or __eq__"):
        wire.encode({OwnHash(1)})
    with pytest.raises(wire.WireError, match="own __hash__ or __eq__"):
        wire.encode({Lying(1): "x"})
    assert round_trip({Colour.RED, Ordinary(4), Point(1, 2)}) == {3, 4, (1, 2)}
    assert round_trip(OwnHash(5)) == 5  # alone, it is its plain int
    with pytest.raises(wire.WireError, match="bits"):
        wire.encode(1 << (wire.MAX_INT_BITS + 1))


def test_frames_come_whole_from_pieces():
    stream = wire.dumps({"a": 1}) + wire.dumps([2]) + wire.dumps("three")
    frames = wire.Frames(100)
    got = [m for i in range(0, len(stream), 3) for m in frames.feed(stream[i : i + 3])]
    assert got == [{"a": 1}, [2], "three"]
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.Frames(4).feed(wire.dumps("too long"))


def test_the_judge_imports_no_module_that_acts_on_import():
    assert _importable("math") and _importable("os.path") and _importable("collections.abc")
    for name in ("antigravity", "this", "idlelib.idle", "unittest.__main__", "numpy"):
        assert not _importable(name), name


def test_messages_over_the_limit_are_refused(tmp_path):
    import os

    read, write = os.pipe()
    os.write(write, wire.HEADER.pack(10_000) + b"x")
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.read_message(read, 100)
    os.close(read)
    os.close(write)


# ---- strict equality -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a,b,equal",
    [
        (4, 4, True),
        (4, 4.0, True),  # numbers compare by value, as the tests' authors ran them
        (2.5, 2, False),
        (True, 1, False),
        ([1, 2], (1, 2), False),
        ([1, [2, 3]], [1, [2, 3]], True),
        ([1, [2, 3]], [1, [2, 3.0]], True),
        ([1, [2, 3]], [1, [2, "3"]], False),
        ({"a": [1]}, {"a": [1]}, True),
        ({"a": 1}, {"a": True}, False),
        (math.nan, math.nan, True),
        (0.1 + 0.2, 0.3, False),
        ({1, 2}, {2, 1}, True),
        ("4", 4, False),
        (None, 0, False),
    ],
)
def test_same_compares_type_and_value(a, b, equal):
    """Type and value, except that int and float compare by value; bool is not a number."""
    assert same(a, b) is equal


def test_equality_in_tests_is_rewritten_to_same():
    tree = _StrictEquality().visit(ast.parse("assert f(2) == 4\nassert g() != [1]\nassert 1 < 2"))
    code = ast.unparse(tree)
    assert f"{SAME}(f(2), 4)" in code and f"not {SAME}(g(), [1])" in code and "1 < 2" in code


# ---- what a run's facts mean -------------------------------------------------------------------


@pytest.mark.parametrize("number", range(1, 65))
def test_every_signal_has_a_name(number):
    name = signal_name(number)
    assert name.startswith("SIG") or name.startswith("signal ")


def test_real_time_signals_are_named_from_sigrtmin():
    assert signal_name(int(signal.SIGRTMIN) + 6) == "SIGRTMIN+6"


FACTS = {"status": 0, "cpu": 0.1, "seconds": 0.2, "stdout": "", "stderr": ""}
RAISED = {"kind": "exception", "type": "ValueError"}


@pytest.mark.parametrize(
    "changes,status,reason",
    [
        ({}, "ok", ""),
        ({"status": 3}, "error", "exit"),  # no word from the harness: os._exit(3)
        ({"status": 3, "end": {"kind": "exit"}}, "error", "exit"),  # SystemExit(3)
        ({"status": 1, "end": RAISED}, "error", "exception"),
        # what it printed does not decide: the harness says how it ended
        ({"status": 1, "stderr": "Traceback (most recent call last):\nValueError\n"}, "error",
         "exit"),
        ({"status": 1, "end": {"kind": "syntax", "type": "SyntaxError"}}, "error", "syntax"),
        ({"status": 1, "end": {"kind": "exception", "type": "MemoryError"}}, "error", "memory"),
        ({"status": 1, "end": {"kind": "exception", "type": "OSError", "errno": 27}}, "error",
         "file_size"),
        ({"status": 1, "end": {"kind": "exception", "type": "OSError", "errno": 2}}, "error",
         "exception"),
        ({"status": -24}, "killed", "signal"),  # SIGXCPU: never the limit's (hard = soft)
        ({"status": -9, "cpu_limit": True}, "killed", "cpu_time"),  # the judge's or the rlimit's
        ({"status": -9, "cpu": 5.0}, "killed", "signal"),  # a SIGKILL of its own, however long
        ({"status": -2}, "killed", "signal"),  # an uncaught KeyboardInterrupt, as CPython ends
        ({"status": -25}, "killed", "file_size"),
        ({"status": -40}, "killed", "signal"),
        ({"status": -9, "oom": True}, "killed", "memory"),
        ({"timed_out": True, "status": -9}, "timeout", "wall_time"),
        ({"output_exceeded": True}, "killed", "output_limit"),
        ({"setup_error": "unshare: not permitted"}, "sandbox_failed", "sandbox_failed"),
        ({"status": None}, "sandbox_failed", "sandbox_failed"),
    ],
)  # fmt: skip
def test_classify(changes, status, reason):
    result = classify({**FACTS, **changes}, Limits(cpu_seconds=2))
    assert (result.status, result.reason) == (status, reason)


def test_no_facts_is_a_sandbox_failure_with_the_reason():
    result = classify(None, Limits(), "the session ran past its deadline")
    assert result.status == "sandbox_failed" and "deadline" in result.detail


def test_verdicts_of_ended_programs_fail_with_the_cause():
    limits = Limits()
    assert verdict_of({"passed": True}, limits).passed is True
    assert verdict_of({"passed": None, "why": "unsupported"}, limits).passed is None
    ended = {"passed": False, "why": "ended", "facts": {**FACTS, "status": -40}}
    assert (verdict_of(ended, limits).passed, verdict_of(ended, limits).reason) == (False, "signal")
    left = {"passed": False, "why": "ended", "facts": FACTS}  # os._exit(0) in the middle of a call
    assert verdict_of(left, limits).reason == "exit"
    load = {"passed": False, "why": "load", "detail": "ValueError", "facts": {**FACTS, "status": 1}}
    assert verdict_of(load, limits).reason == "load"
    syntax = {"passed": False, "why": "syntax", "detail": "SyntaxError: invalid syntax"}
    assert verdict_of(syntax, limits).reason == "syntax"
    reply = {"passed": False, "why": "reply", "detail": "more than 32 members share one hash"}
    assert (verdict_of(reply, limits).passed, verdict_of(reply, limits).reason) == (False, "reply")


# ---- the seccomp filter, against a slow reference interpreter ---------------------------------


def run_filter(program: list[seccomp.Insn], nr: int, args=(0,) * 6, arch=seccomp.AUDIT_ARCH_X86_64):
    """Classic BPF, the obvious way: the accumulator, absolute loads, K jumps, K returns."""
    padded = [a & (2**64 - 1) for a in args] + [0] * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *padded)
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == seccomp.LD_W_ABS:
            (acc,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif code == seccomp.RET_K:
            return k
        else:
            taken = {
                seccomp.JEQ_K: acc == k,
                seccomp.JGE_K: acc >= k,
                seccomp.JSET_K: bool(acc & k),
            }[code]
            pc += 1 + (jt if taken else jf)


EPERM = seccomp.RET_ERRNO(errno.EPERM)
NR = seccomp.NR
READ, WRITE, MMAP, GETPID = 0, 1, 9, 39
AF_INET, SOCK_STREAM = 2, 1


@pytest.mark.parametrize("spawn", [False, True])
def test_ordinary_calls_pass_and_the_listed_ones_are_refused(spawn):
    program = seccomp.build(spawn, 100, (1, 2, 3))
    for nr in (READ, WRITE, MMAP, GETPID):
        assert run_filter(program, nr) == seccomp.RET_ALLOW
    for name in ("memfd_create", "io_uring_setup", "ptrace", "process_vm_readv", "bpf", "unshare"):
        assert run_filter(program, NR[name]) == EPERM, name
    for name in seccomp.IPC_CALLS:  # System V IPC and POSIX message queues
        assert run_filter(program, NR[name]) == EPERM, name
    assert run_filter(program, NR["clone3"]) == seccomp.RET_ERRNO(errno.ENOSYS)
    assert run_filter(program, NR["socket"], (AF_INET, SOCK_STREAM)) == EPERM
    assert run_filter(program, NR["socket"], (seccomp.AF_UNIX, SOCK_STREAM)) == seccomp.RET_ALLOW
    assert run_filter(program, NR["fcntl"], (3, seccomp.F_SETPIPE_SZ)) == EPERM
    assert run_filter(program, NR["fcntl"], (3, 1)) == seccomp.RET_ALLOW
    assert run_filter(program, READ | seccomp.X32_BIT) == EPERM  # the x32 numbers
    assert run_filter(program, READ, arch=0x40000003) == seccomp.RET_KILL  # another ABI


def test_without_spawn_only_threads_start_and_signals_reach_only_itself():
    program = seccomp.build(False, 100, (1, 2, 3))
    clone_thread = seccomp.CLONE_THREAD | 0x00000100  # with CLONE_VM, as pthread_create
    assert run_filter(program, NR["clone"], (clone_thread,)) == seccomp.RET_ALLOW
    assert run_filter(program, NR["clone"], (17,)) == EPERM  # fork: SIGCHLD only
    for name in ("fork", "vfork", "execve", "execveat"):
        assert run_filter(program, NR[name]) == EPERM
    assert run_filter(program, NR["kill"], (100, 9)) == seccomp.RET_ALLOW
    assert run_filter(program, NR["kill"], (0, 9)) == seccomp.RET_ALLOW
    for target in (101, 1, 2, -1, -100):
        assert run_filter(program, NR["kill"], (target, 9)) == EPERM, target
    assert run_filter(program, NR["tgkill"], (100, 101, 9)) == seccomp.RET_ALLOW
    assert run_filter(program, NR["tgkill"], (7, 7, 9)) == EPERM


def test_with_spawn_signals_reach_anything_but_the_sandbox_and_minus_one():
    program = seccomp.build(True, 100, (1, 2, 3))
    assert run_filter(program, NR["clone"], (17,)) == seccomp.RET_ALLOW
    assert run_filter(program, NR["execve"]) == seccomp.RET_ALLOW
    for target in (1, 2, 3, -1, -2, -3):
        assert run_filter(program, NR["kill"], (target, 9)) == EPERM, target
    for target in (100, 250, 0, -250):
        assert run_filter(program, NR["kill"], (target, 9)) == seccomp.RET_ALLOW, target


def test_the_prebuilt_filter_takes_each_process_pid():
    prebuilt = seccomp.Filter(False, (1, 2))
    for pid in (100, 4_000_000):
        patched = bytearray(prebuilt.buffer.raw)
        for offset in prebuilt.pid_slots:
            struct.pack_into("I", patched, offset, pid)
        assert bytes(patched) == seccomp.pack(seccomp.build(False, pid, (1, 2)))


# ---- cgroup discovery ---------------------------------------------------------------------------


def test_memory_cgroups_are_found_from_mountinfo_and_membership(monkeypatch):
    files = {
        "/proc/self/mountinfo": (
            "30 25 0:26 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
            "34 25 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
            "35 25 0:31 /inner /elsewhere rw - cgroup cgroup rw,memory\n"
        ),
        "/proc/self/cgroup": "4:memory:/job/1\n0::/job\n1:name=systemd:/\n",
    }
    monkeypatch.setattr(cgroups, "_read_text", lambda path: files[path])
    assert cgroups._cgroup_mounts() == {
        ("cgroup2", ""): "/sys/fs/cgroup/unified",
        ("cgroup", "memory"): "/sys/fs/cgroup/memory",
    }
    assert cgroups._membership()["memory"] == "/job/1" and cgroups._membership()[""] == "/job"

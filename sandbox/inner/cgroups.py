"""Memory cgroups for sandboxed programs: one per program, under one per sandbox session.

A cgroup counts every page a program's processes are charged for: its heap, but also memfd and
tmpfs files, pipe buffers and kernel memory, which an address-space limit does not see. cgroup v2
(`memory.max`) is used where our own cgroup can delegate the memory controller; else cgroup v1
(`memory.limit_in_bytes`) where its memory hierarchy is writable; else none, and the sandbox says
so at start.

The host finds a usable hierarchy (`find_memory_cgroup`) and makes the session's directory; inside
the sandbox the zygote works through a directory descriptor opened before the private root is
entered (`RunCgroups`). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

_V1_MOUNT_TYPE = "cgroup"
_V2_MOUNT_TYPE = "cgroup2"


@dataclass(frozen=True)
class MemoryCgroup:
    version: int  # 1 or 2
    path: str  # our own cgroup's directory in that hierarchy


def find_memory_cgroup() -> tuple[MemoryCgroup | None, str]:
    """A cgroup directory where we may create children with a memory limit, or None and why."""
    mounts = _cgroup_mounts()
    membership = _membership()
    reasons = []
    hierarchies = (
        (2, ("cgroup2", ""), "", _v2_usable),
        (1, ("cgroup", "memory"), "memory", _v1_usable),
    )
    for version, mount_key, controller, usable in hierarchies:
        mount = mounts.get(mount_key)
        if mount is None or controller not in membership:
            continue
        path = _join(mount, membership[controller])
        ok, why = usable(path)
        if ok:
            return MemoryCgroup(version, path), ""
        reasons.append(f"cgroup v{version} at {path}: {why}")
    if not reasons:
        reasons.append("no memory cgroup hierarchy is mounted")
    return None, "; ".join(reasons)


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _cgroup_mounts() -> dict[tuple[str, str], str]:
    """(type, controller) -> mount point: ("cgroup2", "") and ("cgroup", "memory")."""
    found: dict[tuple[str, str], str] = {}
    try:
        lines = _read_text("/proc/self/mountinfo").splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue  # only hierarchies mounted at their root map paths one to one
        fstype, options = tail[0], tail[2].split(",")
        if fstype == _V2_MOUNT_TYPE:
            found.setdefault(("cgroup2", ""), fields[4])
        elif fstype == _V1_MOUNT_TYPE and "memory" in options:
            found.setdefault(("cgroup", "memory"), fields[4])
    return found


def _membership() -> dict[str, str]:
    """controller -> our cgroup path ("" for cgroup v2)."""
    found: dict[str, str] = {}
    try:
        lines = _read_text("/proc/self/cgroup").splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            found[controller] = parts[2]
    return found


def _join(mount: str, path: str) -> str:
    return os.path.join(mount, path.lstrip("/"))


def _v2_usable(path: str) -> tuple[bool, str]:
    try:
        controllers = _read_text(os.path.join(path, "cgroup.controllers")).split()
    except OSError as exc:
        return False, f"cannot read its controllers ({exc.strerror})"
    if "memory" not in controllers:
        return False, "the memory controller is not delegated to it"
    subtree = os.path.join(path, "cgroup.subtree_control")
    try:
        if "memory" not in _read_text(subtree).split():
            _write_text(subtree, "+memory")
    except OSError as exc:
        return False, f"cannot enable memory for its children ({exc.strerror})"
    return _try_child(path, "memory.max")


def _v1_usable(path: str) -> tuple[bool, str]:
    return _try_child(path, "memory.limit_in_bytes")


def _try_child(path: str, limit_file: str) -> tuple[bool, str]:
    probe = os.path.join(path, f"r1-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return False, f"cannot create a child cgroup ({exc.strerror})"
    try:
        with open(os.path.join(probe, limit_file), "w") as f:
            f.write(str(64 << 20))
        return True, ""
    except OSError as exc:
        return False, f"cannot set {limit_file} ({exc.strerror})"
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def make_session_dir(cgroup: MemoryCgroup, name: str) -> str:
    path = os.path.join(cgroup.path, name)
    os.mkdir(path)
    return path


def remove_tree(path: str) -> None:
    """Remove a session's cgroup directory and any left in it, killing what still runs there."""
    if not os.path.isdir(path):
        return
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
    _empty_and_remove(
        lambda: _read_text(os.path.join(path, "cgroup.procs")), lambda: os.rmdir(path)
    )


def _empty_and_remove(read_procs, rmdir) -> None:
    for _ in range(200):
        try:
            rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            with contextlib.suppress(OSError):
                for pid in read_procs().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.005)


# memory.stat keys of pages that reclaim cannot free without swap
_HELD = {1: ("rss", "shmem", "unevictable"), 2: ("anon", "shmem", "unevictable")}


def held_memory(stat: str, version: int) -> int:
    """Bytes of a cgroup's memory.stat that only freeing (not reclaim) gives back."""
    values = {}
    for line in stat.splitlines():
        key, _, value = line.partition(" ")
        values[key] = value
    return sum(int(values.get(key, "0")) for key in _HELD[version])


class RunCgroups:
    """One child cgroup per program, made through the session directory's descriptor."""

    def __init__(self, dir_fd: int, version: int):
        self.dir_fd, self.version = dir_fd, version
        self.limits: dict[str, int] = {}  # the memory limit last set, by cgroup

    def create(self, name: str, memory_bytes: int) -> None:
        os.mkdir(name, 0o755, dir_fd=self.dir_fd)
        self.set_memory(name, memory_bytes)

    def set_memory(self, name: str, memory_bytes: int) -> None:
        if self.limits.get(name) == memory_bytes:
            return
        self.limits[name] = memory_bytes
        if self.version == 2:
            self._write(name, "memory.max", memory_bytes)
            self._write(name, "memory.swap.max", 0, optional=True)
            self._write(name, "memory.oom.group", 1, optional=True)
        else:  # memsw (memory and swap) may not go below memory: lower it in the right order
            self._write(name, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
            self._write(name, "memory.limit_in_bytes", memory_bytes)
            self._write(name, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)

    def join(self, name: str) -> None:
        """Move the calling process into the program's cgroup."""
        self._write(name, "cgroup.procs", os.getpid())

    def oom_killed(self, name: str) -> bool:
        """Whether the kernel killed a process of this cgroup for memory."""
        events = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = self._read(name, events)
        except OSError:
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value) > 0
        return False

    def empty(self, name: str) -> bool:
        """No process in the cgroup, and no memory charged to it that reclaim cannot take back
        (without swap: anonymous and shared pages, tmpfs files and IPC segments among them, and
        locked ones). Page cache left by reading files is reclaimable and does not count."""
        try:
            if self._read(name, "cgroup.procs").strip():
                return False
            return held_memory(self._read(name, "memory.stat"), self.version) == 0
        except (OSError, ValueError):
            return False

    def remove(self, name: str) -> None:
        self.limits.pop(name, None)
        _empty_and_remove(
            lambda: self._read(name, "cgroup.procs"),
            lambda: os.rmdir(name, dir_fd=self.dir_fd),
        )

    def _write(self, name: str, key: str, value: int, optional: bool = False) -> None:
        try:
            fd = os.open(f"{name}/{key}", os.O_WRONLY, dir_fd=self.dir_fd)
        except FileNotFoundError:
            if optional:
                return
            raise
        try:
            os.write(fd, str(value).encode())
        except OSError:
            if not optional:
                raise
        finally:
            os.close(fd)

    def _read(self, name: str, key: str) -> str:
        fd = os.open(f"{name}/{key}", os.O_RDONLY, dir_fd=self.dir_fd)
        try:
            return os.read(fd, 65536).decode()
        finally:
            os.close(fd)

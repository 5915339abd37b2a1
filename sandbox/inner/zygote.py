"""The zygote: a clean interpreter that forks one confined process per program run.

It starts before the judge reads any test, so its memory (which every program inherits) holds no
expected output or test code: only the interpreter, the sandbox's own modules and the standard
library modules it imports ahead for the programs (`PRELOAD`). The judge's workers each hold one
end of a SEQPACKET socket to it and send, per run:

    {"op": "spawn", "id": ID, "setup": {...}}  with the process's channel attached (SCM_RIGHTS)
    {"op": "kill", "pid": N}
    {"op": "kill_all"}  every process spawned for this socket (its worker was replaced)

and get back `{"op": "spawned", "id": ID, "pid": N}` (or `{"op": "spawn_failed", "id": ID,
"error": ...}`) and, when the process has ended and been reaped, `{"op": "exit", "pid", "status",
"cpu", "maxrss_kb", "oom"}` (status as `os.waitstatus_to_exitcode`: negative for a signal).

A run's memory cgroup is reused by a later run only when it is empty: no process left in it, and
no memory that cannot be reclaimed charged to it (anonymous, shared or locked pages: tmpfs
files or IPC segments whose last user has gone but which the kernel has not freed yet). Else the
next run gets a fresh one. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
from dataclasses import dataclass
from typing import NoReturn

from sandbox.inner import candidate, seccomp
from sandbox.inner.cgroups import RunCgroups

# Standard library modules model-written programs import most, imported once here so that each
# program starts with them loaded (a fork shares them) instead of paying for the import.
PRELOAD = (
    "bisect", "collections", "copy", "functools", "heapq", "itertools", "math", "operator", "re",
    "string", "typing", "random", "fractions", "decimal", "statistics", "dataclasses",
)  # fmt: skip

MAX_FDS = 1


@dataclass
class _Child:
    control: socket.socket
    cgroup: str | None
    pidfd: int | None
    work: str
    uid: int
    spawn: bool


class Zygote:
    def __init__(self, cfg: dict, controls: list[socket.socket], cgroups: RunCgroups | None):
        self.cfg = cfg
        self.controls = controls
        self.cgroups = cgroups
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.children: dict[int, _Child] = {}
        self.count = 0
        self.selector = selectors.DefaultSelector()
        self.poll_children = not hasattr(os, "pidfd_open")
        guarded = (*cfg["setup"]["guarded"], os.getpid())
        self.filters = {spawn: seccomp.Filter(spawn, guarded) for spawn in (False, True)}
        self.idle_cgroups: list[str] = []  # emptied after a run, reused by the next

    def serve(self) -> NoReturn:
        for control in self.controls:
            self.selector.register(control, selectors.EVENT_READ, control)
        open_controls = len(self.controls)
        while open_controls or self.children:
            timeout = 0.01 if self.poll_children else None
            for key, _ in self.selector.select(timeout):
                if isinstance(key.data, socket.socket):
                    if not self._request(key.data):
                        self.selector.unregister(key.data)
                        open_controls -= 1
                        if not open_controls:
                            self._kill_all()
                else:
                    self._reap(key.data)
            if self.poll_children:
                self._reap_any()
        os._exit(0)

    def _request(self, control: socket.socket) -> bool:
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 16, MAX_FDS)
        except OSError:
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            return False
        request: dict = {}
        try:
            request = json.loads(data)
            if request["op"] == "kill":
                self._kill(int(request["pid"]))
            elif request["op"] == "kill_all":
                for pid, child in list(self.children.items()):
                    if child.control is control:
                        self._kill(pid)
            else:
                self._spawn(control, request, fds)
        except Exception as exc:  # noqa: BLE001 - told to the judge, which counts it as ours
            error = f"{type(exc).__name__}: {exc}"
            self._send(control, {"op": "spawn_failed", "id": request.get("id"), "error": error})
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return True

    def _spawn(self, control: socket.socket, request: dict, fds: list[int]) -> None:
        if len(fds) != 1:
            raise ValueError(f"spawn needs one descriptor (the channel), got {len(fds)}")
        self.count += 1
        setup = {**self.cfg["setup"], **request["setup"], **self._ids()}
        setup["filter"] = self.filters[bool(setup["spawn"])]
        setup["cgroup"] = cgroup = self._cgroup(setup["rlimits"]["memory"])
        if not setup["namespaces"]:  # no private /work: a directory of its own
            setup["work"] = self._plain_dir(setup["uid"], setup["gid"])
            setup["env"] = {**setup["env"], "HOME": setup["work"], "TMPDIR": setup["work"]}
        pid = os.fork()
        if pid == 0:
            candidate.start(setup, [self.devnull] * 3 + fds, self.cgroups)
        pidfd = None if self.poll_children else os.pidfd_open(pid)
        self.children[pid] = _Child(
            control, cgroup, pidfd, setup["work"], setup["uid"], setup["spawn"]
        )
        if pidfd is not None:
            self.selector.register(pidfd, selectors.EVENT_READ, pid)
        self._send(control, {"op": "spawned", "id": request.get("id"), "pid": pid})

    def _cgroup(self, memory: int) -> str | None:
        """An empty cgroup with this memory limit: an idle one, or a new one."""
        if self.cgroups is None:
            return None
        if self.idle_cgroups:
            name = self.idle_cgroups.pop()
            self.cgroups.set_memory(name, memory)
            return name
        name = f"run{self.count}"
        self.cgroups.create(name, memory)
        return name

    def _plain_dir(self, uid: int, gid: int) -> str:
        work = os.path.join(self.cfg["plain_work"], f"run{self.count}")
        os.mkdir(work, 0o700)
        if os.getuid() == 0:
            os.chown(work, uid, gid)
        return work

    def _ids(self) -> dict[str, int]:
        """A fresh uid and gid for each run when root, else our own."""
        if os.getuid() != 0:
            return {"uid": os.getuid(), "gid": os.getgid()}
        uid = self.cfg["uid_base"] + self.count
        return {"uid": uid, "gid": uid}

    def _kill(self, pid: int) -> None:
        if pid in self.children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _kill_all(self) -> None:
        for pid in list(self.children):
            self._kill(pid)

    def _reap(self, pid: int) -> None:
        try:
            _, status, usage = os.wait4(pid, 0)
        except ChildProcessError:
            return
        self._ended(pid, status, usage)

    def _reap_any(self) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self._ended(pid, status, usage)

    def _ended(self, pid: int, status: int, usage) -> None:
        child = self.children.pop(pid)
        if child.pidfd is not None:
            self.selector.unregister(child.pidfd)
            os.close(child.pidfd)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # what it started in its own group ends with it
        oom = False
        if self.cgroups is not None and child.cgroup is not None:
            oom = self.cgroups.oom_killed(child.cgroup)
            if oom or not self.cgroups.empty(child.cgroup):
                self.cgroups.remove(child.cgroup)  # a fresh one next time: nothing charged
            else:
                self.idle_cgroups.append(child.cgroup)
        if not self.cfg["namespaces"]:
            if child.spawn and os.getuid() == 0:
                _kill_uid(child.uid)
            shutil.rmtree(child.work, ignore_errors=True)
        self._send(
            child.control,
            {
                "op": "exit",
                "pid": pid,
                "status": os.waitstatus_to_exitcode(status),
                "cpu": usage.ru_utime + usage.ru_stime,
                "maxrss_kb": usage.ru_maxrss,
                "oom": oom,
            },
        )

    def _send(self, control: socket.socket, message: dict) -> None:
        with contextlib.suppress(OSError):  # the judge's worker is gone: nothing to tell
            control.send(json.dumps(message).encode())


def _kill_uid(uid: int) -> None:
    """Without a PID namespace, what a run started may outlive it: a helper under the run's uid
    kills every process of that uid (the runs' uids are never reused)."""
    helper = os.fork()
    if helper == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for _ in range(100):
                os.kill(-1, signal.SIGKILL)
        except BaseException:  # noqa: BLE001, S110 - ESRCH: none left
            pass
        os._exit(0)
    os.waitpid(helper, 0)


def seccomp_works() -> bool:
    """Whether a filter can be installed here: tried in a throwaway child."""
    if not seccomp.supported():
        return False
    pid = os.fork()
    if pid == 0:
        try:
            seccomp.install(seccomp.pack(seccomp.build(True, os.getpid(), ())))
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


M_ARENA_MAX = -8


def preload() -> None:
    """Import PRELOAD, then freeze what exists, so that no garbage collection in a forked
    process walks (and so copies) the zygote's objects. One malloc arena: glibc reserves 64 MB
    of address space for each thread's own, which RLIMIT_AS would count against a program's
    memory (four threads would use up 256 MB)."""
    import gc
    import importlib

    seccomp.LIBC.mallopt(M_ARENA_MAX, 1)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    gc.freeze()

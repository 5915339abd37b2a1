"""The sandbox session's entry point: `python -I -S -B launcher.py CONFIG`, started by
sandbox/runner.py. CONFIG is a marshalled dict in hex.

1. Launcher (L): with namespaces, unshare the mount, network, IPC, UTS and PID namespaces (and a
   user namespace when not root), then fork the init and wait for it.
2. Init (A): PID 1 of the new PID namespace. It opens the session's cgroup directory, builds the
   private root (the system's /usr and the interpreter read-only, their site-packages masked by
   empty directories, /dev/null and a few other devices, /work and /tmp writable, /dev/shm a link
   to /tmp) and enters it,
   finds whether a seccomp filter can be installed, reports the guards in force on the status
   pipe, then forks the judge and the zygote, connected by one SEQPACKET socket per judge worker.
   When the judge is done it ends the zygote and exits, and the kernel ends everything left in
   the PID namespace.
3. Judge (J, sandbox/inner/judge.py) and zygote (Z, sandbox/inner/zygote.py).

Without namespaces ("plain") the same processes run without the private root; each program gets
its own directory under the session's, and the init ends the judge and zygote itself.

Status messages (one marshalled dict in hex per line on the status pipe): {"kind": "guards", ...},
{"kind": "setup_failed", "error": ...}, {"kind": "ended", "judge": status, "zygote": status}.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sandbox.inner import judge, zygote  # noqa: E402 - after the path is set
from sandbox.inner.cgroups import RunCgroups  # noqa: E402

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1

_TOP_LEVEL = ("usr", "bin", "sbin", "lib", "lib64", "lib32", "libx32")
_DEVICES = ("null", "zero", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def _report(fd: int, **message: object) -> None:
    os.write(fd, marshal.dumps(message).hex().encode() + b"\n")


def _enter_namespaces() -> None:
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    uid, gid = os.getuid(), os.getgid()
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(flags), "unshare")
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def _bind_readonly(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
    if os.statvfs(source).f_flag & os.ST_NOEXEC:
        flags |= MS_NOEXEC
    _mount(None, target, None, flags)


def _build_root(cfg: dict) -> None:
    """The private root: system libraries read-only, /work and /tmp writable, nothing else."""
    root = cfg["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=1024,mode=755")
    for name in _TOP_LEVEL:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(root, name))
        elif os.path.isdir(host):
            os.mkdir(os.path.join(root, name), 0o755)
            _bind_readonly(host, os.path.join(root, name))
    for host in cfg["binds"]:
        target = root + host
        if not os.path.exists(target):  # else already inside /usr
            os.makedirs(target, 0o755)
            _bind_readonly(host, target)
    for host in cfg["masks"]:  # third-party packages: an empty, read-only directory instead
        target = root + host
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=555")
    os.mkdir(os.path.join(root, "etc"), 0o755)
    if os.path.exists("/etc/ld.so.cache"):
        open(os.path.join(root, "etc", "ld.so.cache"), "w").close()
        _bind_readonly("/etc/ld.so.cache", os.path.join(root, "etc", "ld.so.cache"))
    os.mkdir(os.path.join(root, "dev"), 0o755)
    for name in _DEVICES:
        node = os.path.join(root, "dev", name)
        open(node, "w").close()
        _mount("/dev/" + name, node, None, MS_BIND)
    os.symlink("/tmp", os.path.join(root, "dev", "shm"))  # POSIX shm: in each program's own /tmp
    for name in ("tmp", "work"):  # each program mounts its own over these (candidate.py)
        os.mkdir(os.path.join(root, name), 0o755)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(root)
    os.chdir("/")


def _fork(target, *args) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - shows as the process's exit status
            os.write(2, f"sandbox {target.__name__}: {type(exc).__name__}: {exc}\n".encode())
        os._exit(70)
    return pid


def _init(cfg: dict) -> None:
    """PID 1 of the session; never returns."""
    status_fd = cfg["status_fd"]
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        cgroup_fd = os.open(cfg["cgroup"], os.O_RDONLY | os.O_DIRECTORY) if cfg["cgroup"] else None
        if cfg["namespaces"]:
            _build_root(cfg)
        seccomp_on = cfg["seccomp"] and zygote.seccomp_works()
        _report(status_fd, kind="guards", seccomp=seccomp_on, cgroup=cfg["cgroup_version"])
        pairs = [
            socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(cfg["workers"])
        ]
    except BaseException as exc:  # noqa: BLE001 - reported to the runner
        _report(status_fd, kind="setup_failed", error=f"{type(exc).__name__}: {exc}")
        os._exit(1)
    setup = {**cfg["setup"], "seccomp": seccomp_on, "namespaces": cfg["namespaces"]}
    judge_pid = _fork(_judge, cfg, [a for a, _ in pairs], [b for _, b in pairs], cgroup_fd)
    guarded = [os.getpid(), judge_pid]
    zygote_cfg = {**cfg, "setup": {**setup, "guarded": guarded}}
    zygote_pid = _fork(_zygote, zygote_cfg, [b for _, b in pairs], [a for a, _ in pairs], cgroup_fd)
    for a, b in pairs:
        a.close()
        b.close()
    os.close(cfg["job_fd"])
    os.close(cfg["result_fd"])
    _, judge_status = os.waitpid(judge_pid, 0)
    os.kill(zygote_pid, signal.SIGKILL)
    _, zygote_status = os.waitpid(zygote_pid, 0)
    _report(
        status_fd,
        kind="ended",
        judge=os.waitstatus_to_exitcode(judge_status),
        zygote=os.waitstatus_to_exitcode(zygote_status),
    )
    os._exit(0)


def _judge(cfg: dict, mine: list, theirs: list, cgroup_fd: int | None) -> None:
    for sock in theirs:
        sock.close()
    if cgroup_fd is not None:
        os.close(cgroup_fd)
    os.close(cfg["status_fd"])
    if os.getuid() == 0:  # the judge holds the tests: an uid no program runs under
        os.setgroups([])
        os.setgid(cfg["uid_base"])
        os.setuid(cfg["uid_base"])
    judge.serve(cfg["job_fd"], cfg["result_fd"], mine)


def _zygote(cfg: dict, mine: list, theirs: list, cgroup_fd: int | None) -> None:
    for sock in theirs:
        sock.close()
    for fd in (cfg["status_fd"], cfg["job_fd"], cfg["result_fd"]):
        os.close(fd)
    cgroups = RunCgroups(cgroup_fd, cfg["cgroup_version"]) if cgroup_fd is not None else None
    zygote.preload()
    zygote.Zygote(cfg, mine, cgroups).serve()


_init_pid = 0


def _end_init(signum: int, frame: object) -> None:
    """SIGTERM from the runner: kill the init; with a PID namespace the kernel then ends all."""
    if _init_pid:
        os.kill(_init_pid, signal.SIGKILL)


def main() -> None:
    global _init_pid
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    signal.signal(signal.SIGTERM, _end_init)
    try:
        if cfg["namespaces"]:
            _enter_namespaces()
        _init_pid = os.fork()
    except BaseException as exc:  # noqa: BLE001 - reported to the runner
        _report(cfg["status_fd"], kind="setup_failed", error=f"{type(exc).__name__}: {exc}")
        os._exit(1)
    if _init_pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _init(cfg)
    for fd in (cfg["status_fd"], cfg["job_fd"], cfg["result_fd"]):
        os.close(fd)
    _, status = os.waitpid(_init_pid, 0)
    os._exit(0 if status == 0 else 1)


if __name__ == "__main__":
    main()

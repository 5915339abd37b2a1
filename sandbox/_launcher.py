"""The sandbox's launcher: run as `python -I -S -B _launcher.py CONFIG` by sandbox.runner.

CONFIG is a marshalled dict in hex. The launcher imports only a few built-in modules (it runs
isolated, without site-packages, and every import costs each run its time) and does, in order:

1. Launcher (L): when the config asks for namespaces, unshare the mount, network, IPC, UTS and PID
   namespaces (plus a user namespace when not root), then fork the init.
2. Init (A): PID 1 of the new PID namespace. It builds a private root on a size-capped tmpfs (the
   system's /usr and the interpreter read-only, a few /dev nodes, /tmp and /work writable, the
   run's files copied into /work), chroots into it, forks the program and reaps every process until
   the program ends. Its exit tears the namespace down, so nothing the program started survives it.
3. Program (B): set the resource limits, drop to the run's own uid (when root), forbid new
   privileges and exec the interpreter on /work/main.py with a clean environment.

Without namespaces (mode "plain") the same steps run without the private root: the program runs in
the host's work directory under its own uid and limits only.

Each outcome is reported as one line, a marshalled dict in hex, on the status pipe (fd given in the
config):
{"kind": "exit", ...} from the init, {"kind": "exec_failed" | "setup_failed", "error": ...}, or
{"kind": "probe_ok"} in probe mode (set up everything, run nothing).
"""

from __future__ import annotations

import _signal  # the signal module would import enum: every import costs each run its time
import ctypes
import marshal
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

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


def _enter_namespaces(cfg: dict) -> None:
    """Unshare every namespace the sandbox uses; map our own ids when not root."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    uid, gid = os.getuid(), os.getgid()
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(flags), "unshare")
    if uid != 0:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")


def _bind_readonly(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
    if os.statvfs(source).f_flag & os.ST_NOEXEC:
        flags |= MS_NOEXEC
    _mount(None, target, None, flags)


def _copy_tree(source: str, target: str, uid: int, gid: int) -> None:
    """Copy the run's files into the private /work, owned by the program's uid."""
    for dirpath, dirnames, filenames in os.walk(source):
        rel = os.path.relpath(dirpath, source)
        dest_dir = target if rel == "." else os.path.join(target, rel)
        for name in dirnames:
            os.mkdir(os.path.join(dest_dir, name), 0o700)
            os.chown(os.path.join(dest_dir, name), uid, gid)
        for name in filenames:
            dest = os.path.join(dest_dir, name)
            with open(os.path.join(dirpath, name), "rb") as src, open(dest, "wb") as out:
                out.write(src.read())
            os.chmod(dest, 0o600)
            os.chown(dest, uid, gid)


def _build_root(cfg: dict) -> None:
    """The private root: system libraries read-only, /work and /tmp writable, nothing else.

    /work and /tmp are each a tmpfs of `tmpfs_mb`, so the program cannot fill the host's disk.
    """
    root = cfg["root"]
    uid, gid = cfg["uid"], cfg["gid"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(
        "tmpfs",
        root,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        "size=1m,nr_inodes=1024,mode=755",
    )
    for name in _TOP_LEVEL:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(root, name))
        elif os.path.isdir(host):
            os.mkdir(os.path.join(root, name), 0o755)
            _bind_readonly(host, os.path.join(root, name))
    for host in cfg["binds"]:
        target = root + host
        if os.path.exists(target):  # already inside /usr
            continue
        os.makedirs(target, 0o755)
        _bind_readonly(host, target)
    os.mkdir(os.path.join(root, "etc"), 0o755)
    if os.path.exists("/etc/ld.so.cache"):
        open(os.path.join(root, "etc", "ld.so.cache"), "w").close()
        _bind_readonly("/etc/ld.so.cache", os.path.join(root, "etc", "ld.so.cache"))
    os.mkdir(os.path.join(root, "dev"), 0o755)
    for name in _DEVICES:
        node = os.path.join(root, "dev", name)
        open(node, "w").close()
        _mount("/dev/" + name, node, None, MS_BIND)
    scratch = f"size={cfg['tmpfs_mb']}m,nr_inodes=4096,mode=700,uid={uid},gid={gid}"
    for name in ("tmp", "work"):
        os.mkdir(os.path.join(root, name), 0o755)
        _mount("tmpfs", os.path.join(root, name), "tmpfs", MS_NOSUID | MS_NODEV, scratch)
    _copy_tree(cfg["work"], os.path.join(root, "work"), uid, gid)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(root)
    os.chdir("/work")


def _set_limits(limits: dict) -> None:
    cpu = int(limits["cpu"])
    for which, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (limits["memory"], limits["memory"])),
        (resource.RLIMIT_FSIZE, (limits["file_size"], limits["file_size"])),
        (resource.RLIMIT_NPROC, (limits["processes"], limits["processes"])),
        (resource.RLIMIT_NOFILE, (256, 256)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)


def _drop_privileges(uid: int, gid: int) -> None:
    if os.getuid() == 0 and uid != 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("could not drop to the sandbox uid")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _program(cfg: dict, status_fd: int) -> None:
    """The child that becomes the interpreter; never returns."""
    try:
        os.set_inheritable(status_fd, False)
        if cfg["namespaces"]:  # its own session: no signal to its group reaches the launcher
            os.setsid()
        _set_limits(cfg["limits"])
        _drop_privileges(cfg["uid"], cfg["gid"])
        argv = [cfg["python"], "-E", "-s", "-S", "-B", "main.py"]
        os.execve(cfg["python"], argv, cfg["env"])
    except BaseException as exc:  # noqa: BLE001 - reported, then the child ends
        try:
            _report(status_fd, kind="exec_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            os._exit(127)


def _end_leftovers(uid: int) -> None:
    """Without a PID namespace: kill what the program left running, then reap it all.

    When root, a helper under the program's uid sends SIGKILL to every process of that uid;
    orphans come back to this process (a child subreaper) to be reaped.
    """
    if os.getuid() == 0 and uid != 0:
        helper = os.fork()
        if helper == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                for _ in range(100):
                    os.kill(-1, 9)
            except BaseException:  # noqa: BLE001 - ESRCH: none left
                pass
            os._exit(0)
    while True:
        try:
            os.wait4(-1, 0)
        except ChildProcessError:
            return


def _init(cfg: dict, status_fd: int) -> None:
    """PID 1 of the sandbox: set up, run the program, reap everything, report; never returns."""
    code = 1
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PDEATHSIG)")
        if cfg["namespaces"]:
            _build_root(cfg)
        else:
            _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
            os.chdir(cfg["work"])
        if cfg["probe"]:
            _report(status_fd, kind="probe_ok")
            os._exit(0)
        program = os.fork()
        if program == 0:
            _program(cfg, status_fd)
        while True:
            pid, status, usage = os.wait4(-1, 0)
            if pid == program:
                break
        if not cfg["namespaces"]:
            _end_leftovers(cfg["uid"])
        _report(
            status_fd,
            kind="exit",
            code=os.waitstatus_to_exitcode(status),
            cpu=usage.ru_utime + usage.ru_stime,
            maxrss_kb=usage.ru_maxrss,
        )
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the runner
        try:  # noqa: SIM105 - contextlib costs every run an import
            _report(status_fd, kind="setup_failed", error=f"{type(exc).__name__}: {exc}")
        except OSError:
            pass
    os._exit(code)


_init_pid = 0


def _end_init(signum: int, frame: object) -> None:
    """SIGTERM from the runner (wall clock): kill the init; the kernel then empties its PID
    namespace before the init can be reaped, so once we return, nothing of the run is left."""
    if _init_pid:
        os.kill(_init_pid, 9)


def main() -> None:
    global _init_pid
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    status_fd = cfg["status_fd"]
    _signal.signal(_signal.SIGTERM, _end_init)
    try:
        if cfg["namespaces"]:
            _enter_namespaces(cfg)
        _init_pid = os.fork()
    except BaseException as exc:  # noqa: BLE001 - reported to the runner
        _report(status_fd, kind="setup_failed", error=f"{type(exc).__name__}: {exc}")
        os._exit(1)
    if _init_pid == 0:
        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
        _init(cfg, status_fd)
    os.close(status_fd)
    _, status = os.waitpid(_init_pid, 0)
    os._exit(0 if status == 0 else 1)


if __name__ == "__main__":
    main()

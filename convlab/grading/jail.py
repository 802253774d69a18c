"""Run the learner's process isolated by the OS (Linux, grader running as root).

``python -m convlab.grading.jail CONFIG -- ARGV...`` starts ARGV (the grading kernel):

- in new mount, PID, IPC and network namespaces: a private ``/tmp``, ``/var/tmp`` and
  ``/dev/shm`` (other graders' folders are not there), the hidden paths (solutions,
  instructor and private tests, ``.git``, the batch folder...) covered by empty read-only
  mounts, its own ``/proc`` (it sees only its own processes), no network;
- as a user id of its own (``uid``, no supplementary groups, no new privileges), so it
  can signal, trace or read ``/proc`` of no other process and write only where that id
  may: its scratch folder, which is its working folder and ``$HOME``;
- under limits: processes (per user id, threads count), address space, open files,
  file size, CPU seconds, no core files; with cgroups, when writable, pids and memory
  for the whole tree;
- as PID 1 of its namespace: when it ends, the kernel kills every process left in it;
  and it dies with this wrapper (parent-death signal).

`probe()` says whether this machine can do it. Nothing here imports numpy or numba.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWIPC, CLONE_NEWNET = 0x20000, 0x20000000, 0x8000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
LIMITS = {"nproc": 1024, "address_space": 24 << 30, "nofile": 1024, "fsize": 256 << 20,
          "cpu": 1800, "memory": 6 << 30, "pids": 1024}

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def unshare(flags: int) -> None:
    _check(_c().unshare(flags), "unshare")


def mount(src, target, fstype, flags, data=None) -> None:
    def enc(s):
        return None if s is None else os.fsencode(s)

    _check(_c().mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def prctl(option, arg) -> None:
    _check(_c().prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl")


# ----------------------------------------------------------------------------------------
# What this machine allows


_probe: dict = {}


def probe() -> dict:
    """{"ok": bool, "why": reason when not}: can the grader jail the learner's process?"""
    if _probe:
        return dict(_probe)
    if not sys.platform.startswith("linux"):
        _probe.update(ok=False, why="not Linux")
    elif os.geteuid() != 0:
        _probe.update(ok=False, why="the grader does not run as root (no user switch, no "
                                    "namespaces)")
    else:
        try:
            r = subprocess.run([sys.executable, "-m", "convlab.grading.jail", "--probe"],
                               capture_output=True, text=True, timeout=30)
            ok = r.returncode == 0 and r.stdout.strip() == "ok"
            _probe.update(ok=ok, why="" if ok else (r.stderr.strip().splitlines() or [
                "namespaces refused"])[-1])
        except (OSError, subprocess.SubprocessError) as e:
            _probe.update(ok=False, why=f"the probe failed: {e}")
    return dict(_probe)


def _probe_main() -> int:
    unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET)
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")
    pid = os.fork()
    if pid == 0:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        os.setgid(65534)
        os.setuid(65534)
        os._exit(0 if os.getpid() == 1 else 3)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        print("the PID namespace or the user switch failed", file=sys.stderr)
        return 1
    print("ok")
    return 0


# ----------------------------------------------------------------------------------------
# cgroups (best effort): pids and memory for the whole tree


def _cgroup_dirs(name: str) -> list[tuple[str, dict]]:
    """(folder, {file: value}) of the cgroups to create, v2 or v1 pids/memory."""
    root = "/sys/fs/cgroup"
    if os.path.exists(f"{root}/cgroup.controllers"):
        return [(f"{root}/{name}", {"pids.max": "pids", "memory.max": "memory"})]
    out = []
    for ctl, files in (("pids", {"pids.max": "pids"}),
                       ("memory", {"memory.limit_in_bytes": "memory"})):
        base = f"{root}/{ctl}"
        try:
            with open("/proc/self/cgroup") as f:
                for line in f:
                    _, ctls, path = line.rstrip("\n").split(":", 2)
                    if ctl in ctls.split(","):
                        base = f"{root}/{ctl}{path}".rstrip("/")
        except OSError:
            pass
        if os.path.isdir(base):
            out.append((f"{base}/{name}", files))
    return out


def _join_cgroups(name: str, limits: dict) -> list[str]:
    joined = []
    for folder, files in _cgroup_dirs(name):
        try:
            os.makedirs(folder, exist_ok=True)
            for fname, key in files.items():
                with open(os.path.join(folder, fname), "w") as f:
                    f.write(str(limits[key]))
            with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            joined.append(folder)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
    return joined


def remove_cgroups(name: str) -> None:
    for folder, _ in _cgroup_dirs(name):
        with contextlib.suppress(OSError):
            os.rmdir(folder)


# ----------------------------------------------------------------------------------------
# The jail


def _hide(path: str) -> None:
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000")
        mount(None, path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    elif os.path.isfile(path):
        mount("/dev/null", path, None, MS_BIND)


def _blocking_ancestor(path: str) -> str | None:
    """The topmost folder above `path` that other users cannot enter (``/root``, say)."""
    parts = os.path.realpath(path).split(os.sep)[1:]
    cur = ""
    for part in parts[:-1]:
        cur += os.sep + part
        try:
            if not os.stat(cur).st_mode & 0o001:
                return cur
        except OSError:
            return None
    return None


def _expose(paths) -> None:
    """Make `paths` reachable for another user where a parent folder is closed to it: that
    parent is covered by an empty folder in which only these paths are mounted again."""
    groups: dict = {}
    for p in paths:
        a = _blocking_ancestor(p)
        if a is not None and os.path.isdir(p):
            groups.setdefault(a, []).append(os.path.realpath(p))
    for a, ps in groups.items():
        fds = [(os.open(p, os.O_PATH | os.O_DIRECTORY), p) for p in ps]
        mount("tmpfs", a, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for fd, p in fds:
            os.makedirs(p, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
            mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            os.close(fd)


def in_private_tmp(path: str) -> bool:
    """Whether `path` lies under a folder the jail replaces by a fresh tmpfs."""
    real = os.path.realpath(path)
    return any(real == t or real.startswith(t + os.sep) for t in PRIVATE_TMP)


def _setup_mounts(cfg: dict) -> None:
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    exposed = cfg.get("expose", [])
    _expose(exposed)
    # what the kernel needs under /tmp (a venv, a checkout, carried wheels) is mounted into
    # the fresh /tmp again, read-only; the hidden paths inside it are covered after
    readonly = [*cfg["readonly"], *(p for p in exposed if os.path.isdir(p) and in_private_tmp(p))]
    keep = [(p, ro) for p, ro in ((cfg["scratch"], False), *((p, True) for p in readonly))]
    fds = [(os.open(p, os.O_PATH | os.O_DIRECTORY), p, ro) for p, ro in keep]
    for t in PRIVATE_TMP:
        if os.path.isdir(t) and not os.path.islink(t):
            mount("tmpfs", t, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=512m")
    for fd, p, ro in fds:
        os.makedirs(p, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        if ro:
            mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    for p in cfg["hide"]:
        with contextlib.suppress(OSError):
            _hide(p)


def _limits(lim: dict) -> None:
    for res, key in ((resource.RLIMIT_NPROC, "nproc"), (resource.RLIMIT_AS, "address_space"),
                     (resource.RLIMIT_NOFILE, "nofile"), (resource.RLIMIT_FSIZE, "fsize"),
                     (resource.RLIMIT_CPU, "cpu")):
        v = int(lim[key])
        resource.setrlimit(res, (v, v))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv) -> int:
    if argv[:1] == ["--probe"]:
        return _probe_main()
    cfg_path, sep, *cmd = argv
    if sep != "--" or not cmd:
        print("usage: python -m convlab.grading.jail CONFIG -- ARGV...", file=sys.stderr)
        return 2
    # The grader gone (killed, timed out) takes the jail with it, and the jail's death its
    # kernel (PDEATHSIG below): no learner process outlives the grading that started it.
    parent = os.getppid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it went before the line above
        return 1
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    uid, gid, scratch = int(cfg["uid"]), int(cfg["gid"]), cfg["scratch"]
    lim = {**LIMITS, **cfg.get("limits", {})}
    if "-f" in cmd:  # the kernel's connection file: a copy only its user may read
        i = cmd.index("-f") + 1
        with open(cmd[i], "rb") as f:
            data = f.read()
        copy = os.path.join(scratch, ".connection.json")
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chown(copy, uid, gid)
        cmd[i] = copy
    _join_cgroups(cfg["cgroup"], lim)
    unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET)
    _setup_mounts(cfg)
    pid = os.fork()
    if pid == 0:
        try:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _limits(lim)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            prctl(PR_SET_NO_NEW_PRIVS, 1)
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            os.umask(0o077)
            os.chdir(scratch)
            env = dict(cfg["env"])
            os.execvpe(cmd[0], cmd, env)
        except BaseException as e:  # noqa: BLE001
            print(f"convlab jail: {e}", file=sys.stderr)
            os._exit(127)

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            return 1
    return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

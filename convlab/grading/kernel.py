"""The learner's process: a Jupyter kernel, isolated by the OS where the grader can.

`KernelSession` starts a kernel in a scratch folder, runs cells one at a time under a
time limit, keeps at most `OUTPUT_CAP` characters of what each cell prints, and can be
restarted. Where `jail.probe()` allows (Linux, root), the kernel runs under
`convlab.grading.jail`: its own user id, namespaces, limits (see there); the grader
talks to it over Unix sockets in the scratch folder. Elsewhere it runs as the grader's
user and `isolation()` says what is missing. `stop()` kills whatever the kernel left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import jail

KERNEL_NAME = "convlab-grader"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
OUTPUT_CAP = 64 << 10  # characters of a cell's printed output the grader keeps
MAX_MESSAGE = 32 << 20  # bytes of one kernel message before the grader drops the connection
# PYTHONPATH: the grader's own import path (a course run from a checkout, carried wheels)
_ENV_KEEP = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "CUDA_VISIBLE_DEVICES",
             "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "NUMBA_CUDA_DRIVER", "TZ")


@dataclass
class CellRun:
    status: str  # ok | error | timeout | dead
    ename: str = ""
    evalue: str = ""
    traceback: str = ""
    stdout: str = ""
    seconds: float = 0.0


def isolation() -> dict:
    """What isolates the learner's process on this machine (for the summary and results)."""
    p = jail.probe()
    if p["ok"]:
        return {"os": True, "user": "own user id", "namespaces": "mount, pid, ipc, net",
                "limits": sorted(jail.LIMITS), "missing": []}
    return {"os": False, "missing": [p["why"]], "limits": [],
            "note": "the learner's code runs as the grader's user, in a scratch folder; only "
                    "the in-process guard rails stand between it and the grader's files"}


def _exposed_dirs() -> list[str]:
    """The folders the kernel must reach: the Python environment, the course's checkout and
    the PYTHONPATH folders (carried wheels, say). The jail opens a way to them where a
    parent folder is closed to the kernel's user or lies in the /tmp it replaces."""
    candidates = [*os.environ.get("PYTHONPATH", "").split(os.pathsep), sys.prefix,
                  sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
                  str(Path(__file__).resolve().parents[2])]
    return sorted({os.path.realpath(p) for p in candidates if p and os.path.isdir(p)})


def kernel_env(mode: str, home: str) -> dict:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.update(CONVLAB_MODE=mode, CONVLAB_GRADING="1", MPLBACKEND="Agg", HOME=home,
               PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               PYDEVD_DISABLE_FILE_VALIDATION="1", IPYTHONDIR=f"{home}/.ipython",
               MPLCONFIGDIR=f"{home}/.matplotlib", JUPYTER_RUNTIME_DIR=f"{home}/.jupyter",
               JUPYTER_DATA_DIR=f"{home}/.jupyter", NUMBA_CACHE_DIR=f"{home}/.numba",
               JUPYTER_PLATFORM_DIRS="1")
    env["NUMBA_ENABLE_CUDASIM"] = "1" if mode == "sim" else "0"
    return env


def _free_uid() -> int:
    """A user id no account and no process uses (one per grading run)."""
    try:
        with open("/etc/passwd", encoding="utf-8", errors="replace") as f:
            used = {int(line.split(":")[2]) for line in f if line.count(":") >= 3
                    and line.split(":")[2].isdigit()}
    except OSError:
        used = set()
    while True:
        uid = 0x3000_0000 + secrets.randbelow(0x0FFF_FFFF)
        if uid not in used and not _pids_of(uid):
            return uid


def _pids_of(uid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    out.append(int(d))
            except OSError:
                continue
    return out


def _make_client_class():
    from nbclient import NotebookClient
    from nbformat import NotebookNode

    class CappedClient(NotebookClient):
        """Keeps only stream output, at most OUTPUT_CAP characters per cell."""

        used = 0

        def output(self, outs, msg, display_id, cell_index):
            if msg.get("msg_type") != "stream":
                return None
            text = str(msg.get("content", {}).get("text", ""))
            room = OUTPUT_CAP - self.used
            if room <= 0:
                return None
            if len(text) > room:
                text = text[:room] + "\n[output cut: the grader keeps the first "
                text += f"{OUTPUT_CAP} characters]\n"
            self.used += len(text)
            out = NotebookNode(output_type="stream",
                               name=msg.get("content", {}).get("name", "stdout"), text=text)
            outs.append(out)
            return out

    return CappedClient


class KernelSession:
    """One grading kernel, run cell by cell; restartable.

    scratch: its working folder (and $HOME); private: the grader's own folder (kernel
    spec, logs; the kernel cannot read it); hide: paths the kernel must not see; readonly:
    folders it may read (the inbox); init: source of the first cell after each start.
    """

    def __init__(self, scratch: Path, private: Path, mode: str, hide=(), readonly=(),
                 init: str = "", startup_timeout: float = 60, total_timeout: float = 900):
        self.scratch, self.private, self.mode = Path(scratch), Path(private), mode
        self.hide, self.readonly, self.init = list(hide), list(readonly), init
        self.startup_timeout, self.total_timeout = startup_timeout, total_timeout
        self.client = None
        self.starts = 0
        self.jailed = jail.probe()["ok"]
        self.uid = _free_uid() if self.jailed else os.getuid()
        self.cgroup = f"convlab-{self.uid}"
        self._log = None

    def _spec_dir(self) -> Path:
        d = self.private / "kernels" / KERNEL_NAME
        d.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        if self.jailed:
            cfg = self.private / "jail.json"
            cfg.write_text(json.dumps({
                "uid": self.uid, "gid": self.uid, "scratch": str(self.scratch),
                "readonly": [str(p) for p in self.readonly],
                "hide": [str(p) for p in self.hide], "cgroup": self.cgroup,
                "expose": _exposed_dirs(),
                "env": kernel_env(self.mode, str(self.scratch)),
                "limits": self._limits()}))
            os.chmod(cfg, 0o600)
            argv = [sys.executable, "-m", "convlab.grading.jail", str(cfg), "--", *argv]
        (d / "kernel.json").write_text(json.dumps({
            "argv": argv, "display_name": "convlab grader", "language": "python"}))
        return self.private / "kernels"

    def _limits(self) -> dict:
        lim = {"cpu": int(self.total_timeout) + 120}
        if self.mode == "gpu":  # a CUDA context reserves far more address space than it uses
            import resource

            lim["address_space"] = resource.RLIM_INFINITY
        return lim

    def start(self):
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import AsyncKernelManager

        if self.jailed:
            os.chown(self.scratch, self.uid, self.uid)
        spec_dir = self._spec_dir()
        km = AsyncKernelManager(kernel_name=KERNEL_NAME,
                                kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_dir)]))
        km.connection_file = str(self.private / f"connection-{self.starts}.json")
        if self.jailed:  # no network in the jail: Unix sockets in the scratch folder
            ipc = self.scratch / ".ipc"
            ipc.mkdir(exist_ok=True)
            os.chown(ipc, self.uid, self.uid)
            km.transport, km.ip = "ipc", str(ipc / f"k{self.starts}")
        import nbformat

        client = _make_client_class()(
            nbformat.v4.new_notebook(), km=km, timeout=60, allow_errors=True,
            startup_timeout=int(self.startup_timeout), kernel_name=KERNEL_NAME,
            record_timing=False, iopub_timeout=5)
        client.on_cell_executed = self._on_executed
        if self._log is None:
            self._log = open(self.private / "kernel.log", "ab")  # noqa: SIM115  (closed in stop)
        env = kernel_env(self.mode, str(self.scratch))
        self._log.flush()
        log_start = self._log.tell()
        try:
            client.start_new_kernel(cwd=str(self.scratch), env=env, stdout=self._log,
                                    stderr=self._log)
            client.start_new_kernel_client()
        except Exception as e:
            raise RuntimeError(f"{e}{self._startup_log(log_start)}") from e
        with contextlib.suppress(Exception):
            import zmq

            client.kc.iopub_channel.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        self.client = client
        self.starts += 1
        if self.init:
            run = self.run(self.init, self.startup_timeout)
            if run.status != "ok":
                raise RuntimeError(f"the grading kernel did not start: {run.ename}: "
                                   f"{run.evalue}")

    def _startup_log(self, start: int, chars: int = 1200) -> str:
        """The end of what a kernel that failed to start printed (no learner code has run
        in it yet)."""
        try:
            self._log.flush()
            text = (self.private / "kernel.log").read_bytes()[start:].decode("utf-8", "replace")
        except OSError:
            return ""
        text = ANSI.sub("", text).strip()
        return f"; its stderr ended with:\n{text[-chars:]}" if text else ""

    def _on_executed(self, cell, cell_index, execute_reply):
        self._reply = execute_reply

    def run(self, source: str, timeout: float) -> CellRun:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError
        from nbformat import v4

        cell = v4.new_code_cell(source)
        self.client.nb.cells = [cell]
        self.client.timeout = max(1, int(round(timeout)))
        self.client.used = 0
        self._reply = None
        t0 = time.perf_counter()
        try:
            self.client.execute_cell(cell, 0)
        except CellTimeoutError:
            return CellRun("timeout", seconds=time.perf_counter() - t0,
                           stdout=_stream(cell, "stdout"))
        except DeadKernelError:
            return CellRun("dead", seconds=time.perf_counter() - t0,
                           stdout=_stream(cell, "stdout"))
        except Exception as e:  # noqa: BLE001  (a broken channel is a dead kernel to us)
            return CellRun("dead", ename=type(e).__name__, evalue=str(e)[:500],
                           seconds=time.perf_counter() - t0)
        dt = time.perf_counter() - t0
        content = (self._reply or {}).get("content", {})
        if content.get("status") == "ok":
            return CellRun("ok", stdout=_stream(cell, "stdout"), seconds=dt)
        if content.get("status") == "error":
            return CellRun("error", ename=str(content.get("ename", ""))[:200],
                           evalue=str(content.get("evalue", ""))[:4000],
                           traceback=ANSI.sub("", "\n".join(
                               str(x) for x in content.get("traceback", [])))[-8000:],
                           stdout=_stream(cell, "stdout"), seconds=dt)
        return CellRun("dead", ename="NoReply", evalue="the kernel gave no valid reply",
                       seconds=dt)

    def _kill_leftovers(self) -> None:
        if not self.jailed:
            return
        for _ in range(5):
            pids = _pids_of(self.uid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def stop(self):
        if self.client is not None:
            km = self.client.km
            try:
                self.client._cleanup_kernel()
            except Exception:  # noqa: BLE001
                pass
            with contextlib.suppress(Exception):
                pid = km.provisioner.process.pid if km.provisioner else None
                if pid:
                    os.killpg(pid, signal.SIGKILL)
            self.client = None
        self._kill_leftovers()

    def close(self):
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.jailed:
            jail.remove_cgroups(self.cgroup)

    def survivors(self) -> list[int]:
        """Processes of the kernel's user still alive (none after `close`, when jailed)."""
        return _pids_of(self.uid) if self.jailed else []


def _stream(cell, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == name)


def remove_tree(path) -> None:
    shutil.rmtree(path, ignore_errors=True)

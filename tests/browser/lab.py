"""JupyterLab and headless Chromium for the browser test (tests/test_browser.py).

JupyterLab comes from the environment the README's main command builds (`make lab`
creates .venv); Chromium is Debian's (/usr/bin/chromium), driven by Playwright's Python
package. Nothing here downloads a browser: Playwright only gets an executable path.

The server listens on 127.0.0.1 on a free port with a random token, keeps its runtime
files, user settings and workspaces in a temporary folder, serves a temporary copy of the
notebooks (so running them never rewrites the repository's files) and is told not to
fetch news, update checks or extension listings from the network.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"

# Chromium flags for a closed network and a root user (see the machine notes): no
# sandbox, no GPU, and no background connections to Google's services.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--metrics-recording-only",
    "--no-default-browser-check",
]


def chromium_path() -> str | None:
    """Debian's Chromium (or CONVLAB_CHROMIUM), never a browser a tool downloaded."""
    cand = os.environ.get("CONVLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    return cand if Path(cand).is_file() and os.access(cand, os.X_OK) else None


def jupyter_lab_command() -> list[str] | None:
    """`jupyter lab` of the .venv that `make lab` builds (CONVLAB_JUPYTER overrides it)."""
    if os.environ.get("CONVLAB_JUPYTER"):
        return shlex.split(os.environ["CONVLAB_JUPYTER"])
    jupyter = ROOT / ".venv" / "bin" / "jupyter"
    return [str(jupyter), "lab"] if jupyter.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(settings_dir: Path) -> None:
    """User settings for a quiet, offline JupyterLab (no news toast, no update check)."""
    f = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@dataclass(repr=False)
class Lab:
    base: str  # http://127.0.0.1:PORT/
    token: str
    root: Path  # the folder the server serves (a temporary copy)
    log: Path
    proc: subprocess.Popen

    def __repr__(self) -> str:
        return f"Lab({self.base}, root={self.root}, log={self.log})"

    def url(self, path: str, workspace: str | None = None) -> str:
        """The page of one notebook; a fresh workspace unless one is named, so that a
        page does not reopen the tabs of the page before it."""
        self._n = getattr(self, "_n", 0) + 1
        ws = workspace or f"test{self._n}"
        return f"{self.base}lab/workspaces/{ws}/tree/{path}?token={self.token}"

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(
            f"{self.base}api/{path}", method=method,
            headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


@contextmanager
def jupyter_lab(cmd: list[str], root: Path, tmp: Path, timeout: float = 90):
    """Start JupyterLab serving `root`; yield a Lab; shut kernels and server down."""
    port, token = free_port(), os.urandom(16).hex()
    runtime, settings, workspaces = tmp / "runtime", tmp / "settings", tmp / "workspaces"
    for d in (runtime, settings, workspaces):
        d.mkdir(parents=True, exist_ok=True)
    _write_settings(settings)
    env = dict(os.environ)
    env["JUPYTER_RUNTIME_DIR"] = str(runtime)
    env["CONVLAB_MODE"] = "sim"  # the kernel runs the lesson under the CUDA simulator
    # A learner's kernel picks matplotlib's inline backend only when MPLBACKEND is unset.
    env.pop("MPLBACKEND", None)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    args = cmd + [
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.terminals_enabled=False",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={workspaces}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")  # CI containers run as root
    log = tmp / "jupyterlab.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen(args, cwd=root, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}/", token, root, log, proc)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{lab.log_tail()}")
            try:
                lab.api("status")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not answer in {timeout:.0f} s:\n"
                                   f"{lab.log_tail()}")
            time.sleep(0.3)
        yield lab
    finally:
        _stop(lab)


def _stop(lab: Lab) -> None:
    if lab.proc.poll() is None:
        try:
            for k in lab.api("kernels") or []:
                lab.api(f"kernels/{k['id']}", method="DELETE")
        except Exception:  # noqa: BLE001 - best effort; the process group goes below
            pass
        lab.proc.terminate()  # SIGTERM: jupyter_server shuts its kernels down and exits
        try:
            lab.proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
    try:  # anything left in the server's own process group (it started in a new session)
        os.killpg(lab.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    lab.proc.wait()

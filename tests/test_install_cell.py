"""The notebooks' install cell, and doctor's checks for hosted runtimes (Colab, Kaggle).

Fast tests run the cell's source with `subprocess.run` replaced, so the pip commands it
would run are recorded instead: a no-op where this convlab is importable (no process at
all: the grader runs this cell too), ConvLab-3 removed first, the repository or an offline
pack as the source. The slow test builds a Colab-like environment for real: a fresh venv
(Python >= 3.11) with NumPy 2.0.2 and numba 0.60 preinstalled (Colab's pair; this
checkout's venv has another numba), no numba-cuda, a stand-in ConvLab-3; the install cell
installs the course from a local git copy (``file://``, nothing from the course's real
URL), then lesson 00's first cells run under the simulator and doctor says OK.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

import nbformat
import pytest

from convlab import publish, runtime

ROOT = Path(__file__).resolve().parent.parent
REPO, BRANCH = "https://github.com/me/course", "dev"


def _first_code_cell(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code")


def test_every_lesson_and_exercise_notebook_starts_with_the_install_cell():
    repo, branch = publish.course_url(ROOT)
    want = publish.install_cell(repo, branch)
    paths = [p for d in ("notebooks", "exercises", "solutions")
             for p in sorted((ROOT / d).glob("*.ipynb"))]
    assert len(paths) >= 3 * 13
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        assert all(c.cell_type == "markdown" for c in nb.cells[:first]), p.name
        assert nb.cells[first].source == want, f"{p.relative_to(ROOT)}: not the install cell"


# ----------------------------------------------------------------------------------------
# The cell's logic, with subprocess.run recorded

_DRIVER = textwrap.dedent('''
    import json, subprocess, sys
    calls = []
    def fake_run(cmd, *a, **k):
        calls.append(cmd if isinstance(cmd, str) else [str(c) for c in cmd])
        rc = 1 if (isinstance(cmd, str) or "install" in cmd) else 0
        return subprocess.CompletedProcess(cmd, rc, b"", b"offline")
    subprocess.run = fake_run
    sys.path.insert(0, sys.argv[2]) if len(sys.argv) > 2 else None
    try:
        exec(open(sys.argv[1]).read(), {"__name__": "__main__"})
        outcome = "ok"
    except RuntimeError as e:
        outcome = str(e)
    print("RESULT " + json.dumps({"calls": calls, "outcome": outcome}))
''')


def _run_cell(tmp_path, cwd, extra_path=None, audit=False) -> dict:
    cell = tmp_path / "cell.py"
    cell.write_text(publish.install_cell(REPO, BRANCH), encoding="utf-8")
    driver = tmp_path / "driver.py"
    src = _DRIVER
    if audit:  # no process may start at all
        src = ("import sys\n"
               "def hook(ev, args):\n"
               "    if ev in ('subprocess.Popen', 'os.system', 'os.posix_spawn', 'os.exec'):\n"
               "        raise RuntimeError('started a process: ' + ev)\n"
               "sys.addaudithook(hook)\n") + src
    driver.write_text(src, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CONVLAB_MODE"] = "sim"
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the cell unpacks an offline pack
    (tmp_path / "tmp").mkdir(exist_ok=True)
    args = [sys.executable, str(driver), str(cell)] + ([str(extra_path)] if extra_path else [])
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(line[len("RESULT "):]) | {"stdout": r.stdout}


def test_the_cell_does_nothing_where_this_convlab_is_importable(tmp_path):
    res = _run_cell(tmp_path, cwd=tmp_path, audit=True)
    assert res["outcome"] == "ok", res
    assert res["calls"] == []
    assert "Installing" not in res["stdout"]


def _fake_convlab3(where: Path) -> Path:
    pkg = where / "convlab"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""ConvLab-3 stand-in: a dialog toolkit."""\n')
    return where


def test_the_cell_removes_convlab3_and_installs_from_the_repository(tmp_path):
    res = _run_cell(tmp_path, cwd=tmp_path, extra_path=_fake_convlab3(tmp_path / "site"))
    pip = [c for c in res["calls"] if isinstance(c, list)]
    assert pip[0][-4:] == ["pip", "uninstall", "-y", "convlab"], pip
    assert pip[1][-4:] == ["pip", "install", "-q", f"convlab-course @ git+{REPO}@{BRANCH}"], pip
    assert "nvidia-smi -L" in res["calls"]
    assert res["outcome"] == "could not install the course", res
    assert "Uninstalling ConvLab-3" in res["stdout"]


def test_the_cell_installs_from_an_uploaded_offline_pack(tmp_path):
    work = tmp_path / "content"
    work.mkdir()
    with zipfile.ZipFile(work / "convlab-course-0.1.0.zip", "w") as z:
        z.writestr("convlab_course-0.1.0-py3-none-any.whl", b"not really a wheel")
        z.writestr("wheels/numba_cuda-0.30.4-py3-none-any.whl", b"a dependency")
        z.writestr("notebooks/00_setup.ipynb", "{}")
    # the cell looks for convlab: hide this checkout's by running from a folder without it
    res = _run_cell(tmp_path, cwd=work, extra_path=_fake_convlab3(tmp_path / "site"))
    install = [c for c in res["calls"] if isinstance(c, list) and "install" in c][0]
    unpacked = Path(install[install.index("-q") + 1])
    assert unpacked.name == "convlab_course-0.1.0-py3-none-any.whl", install
    assert install[-3:] == ["--no-index", "--find-links", str(unpacked.parent / "wheels")]
    assert "the offline pack" in res["stdout"]


# ----------------------------------------------------------------------------------------
# doctor: the hosted runtimes' known breakages, each with its fix


def test_doctor_names_convlab3_and_the_old_distribution_name():
    (p,) = runtime.convlab_problems("ConvLab-3: An Open-source Dialog System Toolkit")
    assert p.fatal and "ConvLab-3" in p.what and "pip uninstall -y convlab" in p.fix
    (old,) = runtime.convlab_problems("A Jupyter course on making 2D convolution fast on GPUs")
    assert not old.fatal and "old distribution name" in old.what
    assert runtime.convlab_problems(None) == []
    (other,) = runtime.convlab_problems(None, ["/usr/lib/python3/dist-packages/convlab"])
    assert "/usr/lib/python3/dist-packages/convlab" in other.what


def test_doctor_finds_a_convlab3_folder_on_the_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_fake_convlab3(tmp_path / "site")))
    assert str(tmp_path / "site" / "convlab") in runtime._other_convlab_folders()


@pytest.mark.parametrize("versions, needle, fatal", [
    ({"numpy": "1.23.5", "numba": "0.60.0"}, "NumPy 1.23.5 is older", True),
    ({"numpy": "2.0.2", "numba": "0.58.1"}, "numba 0.58.1 is older", True),
])
def test_doctor_flags_preinstalled_versions_that_do_not_fit(versions, needle, fatal):
    (p,) = runtime.version_problems(versions)
    assert needle in p.what and p.fatal is fatal and "pip install" in p.fix
    assert runtime.version_problems({"numpy": "2.0.2", "numba": "0.60.0"}) == []


def test_doctor_flags_a_package_pip_changed_after_its_import():
    (p,) = runtime.stale_module_problems({"numpy": "2.0.2", "numba": "0.60.0"},
                                         {"numpy": "2.4.6", "numba": "0.60.0"})
    assert "numpy 2.0.2 is imported" in p.what and "Restart session" in p.fix
    assert runtime.stale_module_problems({"numpy": "2.0.2"}, {"numpy": "2.0.2"}) == []


def test_doctor_flags_cuda13_wheels_on_a_cuda12_driver():
    probs = runtime.driver_problems("12.4", {"cuda-bindings": "13.0.1", "cupy-cuda13x": "14.0"})
    assert [p.fatal for p in probs] == [True, False]
    assert "CUDA 12.4" in probs[0].what and '"cuda-bindings<13"' in probs[0].fix
    assert "cupy-cuda12x" in probs[1].fix
    assert runtime.driver_problems("13.0", {"cuda-bindings": "13.0.1"}) == []
    assert runtime.driver_problems(None, {"cuda-bindings": "13.0.1"}) == []


def test_doctor_flags_a_toolkit_newer_than_the_driver_without_nvjitlink():
    (p,) = runtime.driver_problems("12.2", {"nvidia-cuda-nvcc-cu12": "12.9.86"})
    assert "UNSUPPORTED_PTX_VERSION" in p.what and "nvJitLink" in p.fix
    ok = {"nvidia-cuda-nvcc-cu12": "12.9.86", "nvidia-nvjitlink-cu12": "12.9.86"}
    assert runtime.driver_problems("12.2", ok) == []


def test_doctor_knows_the_p100_and_the_t4():
    (p100,) = runtime.device_problems((6, 0), {"cuda-bindings": "12.9.1"})
    assert not p100.fatal and "no tensor cores" in p100.what
    p100_cu13 = runtime.device_problems((6, 0), {"cuda-bindings": "13.0.1"})
    assert p100_cu13[0].fatal and "not supported by CUDA 13" in p100_cu13[0].what
    (t4,) = runtime.device_problems((7, 5), {"cuda-bindings": "13.0.1"})
    assert not t4.fatal and "no BF16 or TF32" in t4.what
    assert runtime.device_problems((9, 0), {"cuda-bindings": "13.0.1"}) == []


def test_short_doctor_prints_the_summary_rows_and_the_verdict(capsys):
    import io

    out = io.StringIO()
    runtime.setup("sim")
    rep = runtime.doctor(file=out, short=True)
    text = out.getvalue()
    assert "mode" in text and "smoke kernel" in text and "numba-cuda" not in text
    assert text.rstrip().endswith("verdict: OK") == rep.ok


# ----------------------------------------------------------------------------------------
# The Colab-like environment (slow: a venv, real installs)

COLAB_PREINSTALLED = ["numpy==2.0.2", "numba==0.60.0", "scipy", "matplotlib", "tqdm",
                      "ipykernel", "nbclient", "nbformat"]


def _fake_convlab3_wheel(dest: Path) -> Path:
    """A wheel of a distribution 'convlab' 3.0.1 (ConvLab-3's name) with a convlab package."""
    files = {
        "convlab/__init__.py": b'"""ConvLab-3 stand-in: a dialog toolkit."""\n',
        "convlab-3.0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: convlab\n"
                                            b"Version: 3.0.1\nSummary: An Open-source Dialog "
                                            b"System Toolkit\n",
        "convlab-3.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                         b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{n},sha256={urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()}"
              f",{len(b)}" for n, b in files.items()]
    record.append("convlab-3.0.1.dist-info/RECORD,,")
    path = dest / "convlab-3.0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
        z.writestr("convlab-3.0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _git_copy(dest: Path) -> str:
    """This working tree (tracked and untracked, not ignored) as a git repository; its
    file:// URL, stamped into the copy's notebooks by `convlab publish`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    url = publish.check_url(dest.resolve().as_uri(), "main")[0]  # file://localhost/...
    subprocess.run([sys.executable, "-m", "convlab", "publish", "--root", str(dest),
                    "--repo", url, "--branch", "main"], check=True, capture_output=True)
    git = ["git", "-c", "user.name=convlab test", "-c", "user.email=test@localhost",
           "-c", "init.defaultBranch=main"]
    for cmd in (["init", "-q"], ["checkout", "-q", "-b", "main"], ["add", "-A"],
                ["commit", "-q", "-m", "course copy"]):
        subprocess.run(git + cmd, cwd=dest, check=True, capture_output=True)
    return url


_RUN_FIRST_CELLS = textwrap.dedent('''
    import json, sys
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(sys.argv[1], as_version=4)
    nb.cells = nb.cells[:int(sys.argv[2])]
    NotebookClient(nb, timeout=600, kernel_name="python3").execute(cwd=sys.argv[3])
    outs = [["".join(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
             for o in c.outputs] for c in nb.cells if c.cell_type == "code"]
    print("OUTPUTS " + json.dumps(outs))
''')


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_colab_like_fresh_environment_installs_the_course_and_doctor_says_ok(tmp_path):
    base = Path(getattr(sys, "_base_executable", sys.executable))
    assert sys.version_info >= (3, 11), "the Colab-like venv needs Python >= 3.11"
    t0 = time.monotonic()
    src = tmp_path / "course"
    url = _git_copy(src)
    t_copy = time.monotonic()
    venv = tmp_path / "colab"
    subprocess.run([str(base), "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    fakebin = tmp_path / "bin"  # no GPU here, even on a GPU machine: the simulator path
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (fakebin / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CONVLAB_MODE", "NUMBA_ENABLE_CUDASIM")}
    env["PATH"] = os.pathsep.join([str(fakebin), str(venv / "bin"), env.get("PATH", "")])
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_COMPILE"] = "1"  # no .pyc at install time: the slowest part on 2 cores

    def pip(*args):
        r = subprocess.run([str(py), "-m", "pip", *args], env=env, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    pip("install", "-q", *COLAB_PREINSTALLED, str(_fake_convlab3_wheel(tmp_path)))
    t_pre = time.monotonic()
    work = tmp_path / "content"  # the notebook's folder: nothing of the course in it
    work.mkdir()
    driver = tmp_path / "run_first_cells.py"
    driver.write_text(_RUN_FIRST_CELLS, encoding="utf-8")
    lesson = src / "notebooks" / "00_setup.ipynb"
    r = subprocess.run([str(py), str(driver), str(lesson), "6", str(work)], env=env,
                       cwd=work, capture_output=True, text=True, timeout=840)
    t_end = time.monotonic()
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    outs = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("OUTPUTS "))[8:])
    install, doctor = "".join(outs[0]), "".join(outs[1])
    assert "Uninstalling ConvLab-3" in install, install
    assert f"Installing the course from {url}" in install, install
    assert "verdict: OK" in install, install
    assert "Numba CUDA simulator" in doctor and "ran correctly in the simulator" in doctor
    assert "verdict: OK" in doctor, doctor
    assert "mode: " in "".join(outs[2])
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], env=env,
                            capture_output=True, text=True, check=True).stdout
    have = {d["name"].lower(): d["version"] for d in json.loads(listed)}
    assert have.get("convlab-course") and have.get("numba-cuda") == "0.30.4", have
    assert "convlab" not in have, "ConvLab-3 is still installed"
    assert have["numpy"] == "2.0.2" and have["numba"] == "0.60.0", "preinstalled pair changed"
    print(f"\nColab-like venv: git copy {t_copy - t0:.0f} s, venv + preinstall "
          f"{t_pre - t_copy:.0f} s, install cell + first cells {t_end - t_pre:.0f} s, "
          f"total {t_end - t0:.0f} s")

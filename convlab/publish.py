"""Publish the course at a repository URL: install cells, badges, README (``convlab publish``).

The course's home is stated once, in ``pyproject.toml`` (``[project.urls] Repository`` and
``[tool.convlab] branch``). `publish` writes a new URL there and stamps it into

- the first code cell of every notebook in ``notebooks/`` and ``solutions/`` (the install
  cell, `install_cell`): ``exercises/`` is then rebuilt from ``solutions/``, which copies
  the cell;
- the title cell's "Open in Colab" / "Open in Kaggle" badges (`badge_line`); a solution's
  badges open its exercise notebook, the one learners get;
- the README: the badges of the syllabus table and the block between the
  ``<!-- convlab:publish -->`` markers.

``check=True`` writes nothing and lists every file whose stamp disagrees with the URL
(CI runs it). `pack` writes the offline zip the install cell also looks for.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

DIST = "convlab-course"  # the distribution name (the import name is convlab)
WHEEL_PREFIX = DIST.replace("-", "_")
INSTALL_TITLE = "#@title Install cell"
BADGE_RE = re.compile(r"^\[!\[Open in (Colab|Kaggle)\]")
README_BEGIN, README_END = "<!-- convlab:publish -->", "<!-- /convlab:publish -->"
NOTEBOOK_NAME = re.compile(r"^\d\d_[\w\-]+\.ipynb$")
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"


class PublishError(ValueError):
    """A URL, branch or file that publish cannot work with."""


# ----------------------------------------------------------------------------------------
# The URL, in pyproject.toml


def course_url(root) -> tuple[str, str]:
    """(repository URL, branch) from ``root/pyproject.toml``."""
    text = (Path(root) / "pyproject.toml").read_text(encoding="utf-8")
    repo = _toml_value(text, "project.urls", "Repository")
    branch = _toml_value(text, "tool.convlab", "branch") or "main"
    if not repo:
        raise PublishError("pyproject.toml has no [project.urls] Repository")
    return repo, branch


def _section_span(text: str, section: str) -> tuple[int, int] | None:
    m = re.search(rf"^\[{re.escape(section)}\][ \t]*$", text, re.M)
    if not m:
        return None
    nxt = re.search(r"^\[", text[m.end():], re.M)
    return m.end(), (m.end() + nxt.start()) if nxt else len(text)


def _key_re(key: str) -> re.Pattern:
    return re.compile(rf'^({re.escape(key)}[ \t]*=[ \t]*)"([^"]*)"', re.M)


def _toml_value(text: str, section: str, key: str) -> str | None:
    span = _section_span(text, section)
    if span is None:
        return None
    m = _key_re(key).search(text, *span)
    return m.group(2) if m else None


def _set_toml_value(text: str, section: str, key: str, value: str) -> str:
    span = _section_span(text, section)
    if span is None:
        return text.rstrip("\n") + f'\n\n[{section}]\n{key} = "{value}"\n'
    m = _key_re(key).search(text, *span)
    if m:
        return text[:m.start(2)] + value + text[m.end(2):]
    return text[:span[0]] + f'\n{key} = "{value}"' + text[span[0]:]


def set_course_url(root, repo: str, branch: str) -> bool:
    """Write the URL and branch into pyproject.toml; True when it changed."""
    path = Path(root) / "pyproject.toml"
    old = path.read_text(encoding="utf-8")
    new = old
    for key in ("Homepage", "Repository"):
        new = _set_toml_value(new, "project.urls", key, repo)
    new = _set_toml_value(new, "tool.convlab", "branch", branch)
    if new != old:
        path.write_text(new, encoding="utf-8")
    return new != old


def check_url(repo: str, branch: str) -> tuple[str, str]:
    """The URL without a trailing slash or ``.git``; refuse what pip or a badge cannot use."""
    repo = repo.strip().rstrip("/")
    repo = repo[:-4] if repo.endswith(".git") else repo
    if repo.startswith("file:///"):  # a host, for packaging's and setuptools' URL checks
        repo = "file://localhost/" + repo[len("file:///"):]
    if not re.match(r"^(https?|file|ssh)://\S+$", repo):
        raise PublishError(
            f"the repository must be an https://, file:// or ssh:// URL, got {repo!r}")
    if '"' in repo or "\\" in repo:
        raise PublishError(f"the repository URL may not contain quotes or backslashes: {repo!r}")
    if not re.match(r"^[\w.\-/]+$", branch):
        raise PublishError(f"not a branch name: {branch!r}")
    return repo, branch


# ----------------------------------------------------------------------------------------
# What gets stamped

_INSTALL_CELL = '''\
#@title Install cell: run it first (on Colab or Kaggle it installs the course)
# Where this course's convlab is importable (make lab, the grader) it only runs setup().
# Elsewhere it installs the course first: from an offline pack (python -m convlab pack)
# uploaded here or added as a Kaggle dataset, else from REPO (the GPU extra when there is a
# GPU), then runs a short doctor().
REPO, BRANCH = "{repo}", "{branch}"
import importlib.util, os, sys
def _course_found():  # this course's convlab, not ConvLab-3 (a dialog toolkit, same name)
    spec = importlib.util.find_spec("convlab")
    return bool(spec and spec.origin) and os.path.isfile(
        os.path.join(os.path.dirname(spec.origin), "kernels", "conv01_naive.py"))
if not _course_found():
    import glob, subprocess, tempfile, zipfile
    def _pip(*args):
        r = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True)
        if r.returncode:
            print((r.stdout + r.stderr).decode(errors="replace")[-3000:])
        return r.returncode == 0
    if importlib.util.find_spec("convlab"):
        print("Uninstalling ConvLab-3, a dialog toolkit that is also called convlab")
        _pip("uninstall", "-y", "convlab")
    gpu = subprocess.run("nvidia-smi -L", shell=True, capture_output=True).returncode == 0
    kaggle = os.path.isdir("/kaggle/input")
    if kaggle and not gpu:
        print("Kaggle: no GPU. Settings > Accelerator > GPU, then run this cell again.")
    unpacked = os.path.join(tempfile.gettempdir(), "convlab-pack")
    for z in glob.glob("{dist}-*.zip") + glob.glob("/kaggle/input/*/{dist}-*.zip"):
        zipfile.ZipFile(z).extractall(unpacked)
    where = ["", "*/", unpacked + "/**/"] + ["/kaggle/input/" + "*/" * n for n in (1, 2, 3)]
    found = [w for d in where for w in glob.glob(d + "{wheel}-*.whl", recursive=True)]
    wheels = sorted(found, key=os.path.basename)
    extra = "[gpu]" if gpu else ""
    target, opts = f"{dist}{{extra}} @ git+{{REPO}}@{{BRANCH}}", []
    if wheels:
        target, deps = wheels[-1] + extra, os.path.join(os.path.dirname(wheels[-1]), "wheels")
        opts = ["--no-index", "--find-links", deps] if os.path.isdir(deps) else []
    print("Installing the course from", "the offline pack" if wheels else REPO, "...")
    if not _pip("install", "-q", target, *opts):
        hint = " (Kaggle: Settings > Internet on, or add the offline pack)" if kaggle else ""
        raise RuntimeError("could not install the course" + hint)
    importlib.invalidate_caches()
    [sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] == "convlab"]
    import convlab; convlab.setup(); convlab.doctor(short=True)
import convlab
convlab.setup()  # real GPU if present, else the simulator'''


def install_cell(repo: str, branch: str) -> str:
    """The source of every notebook's first code cell, for this repository and branch."""
    repo, branch = check_url(repo, branch)
    return _INSTALL_CELL.format(repo=repo, branch=branch, dist=DIST, wheel=WHEEL_PREFIX)


def _github(repo: str) -> str | None:
    m = re.match(r"^https?://(www\.)?github\.com/([^/]+/[^/]+)$", repo)
    return m.group(2) if m else None


def notebook_links(repo: str, branch: str, relpath: str) -> dict:
    """{'Colab': url, 'Kaggle': url} opening `relpath` of the repository.

    Colab opens notebooks from GitHub only; Kaggle imports a notebook from any URL, so for
    other hosts only the Kaggle link is made (from the ``/raw/`` URL that GitLab, Gitea and
    Forgejo serve).
    """
    repo, branch = check_url(repo, branch)
    gh = _github(repo)
    links = {}
    if gh:
        links["Colab"] = f"https://colab.research.google.com/github/{gh}/blob/{branch}/{relpath}"
        src = f"https://github.com/{gh}/blob/{branch}/{relpath}"
    else:
        src = f"{repo}/raw/{branch}/{relpath}"
    if repo.startswith(("http://", "https://")):
        links["Kaggle"] = f"https://kaggle.com/kernels/welcome?src={src}"
    return links


def badge_line(repo: str, branch: str, relpath: str) -> str:
    """Markdown "Open in Colab" / "Open in Kaggle" badges for `relpath` ('' if none apply)."""
    img = {"Colab": COLAB_BADGE, "Kaggle": KAGGLE_BADGE}
    return " ".join(f"[![Open in {k}]({img[k]})]({url})"
                    for k, url in notebook_links(repo, branch, relpath).items())


# ----------------------------------------------------------------------------------------
# Notebooks


def badge_target(root: Path, path: Path) -> str:
    """What a notebook's badges open: itself, or for a solution its exercise notebook."""
    rel = path.resolve().relative_to(root.resolve()).as_posix()
    return "exercises/" + rel[len("solutions/"):] if rel.startswith("solutions/") else rel


def stamp(nb, repo: str, branch: str, target: str) -> list[str]:
    """Stamp one notebook in place; return what changed ('install cell', 'badges')."""
    changed = []
    want = install_cell(repo, branch)
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = code[0] if code else None
    if first is None or not _is_setup_cell(first.source):
        first = nbformat.v4.new_code_cell("")
        first.pop("id", None)
        if _has_ids(nb):
            first["id"] = _free_id(nb, "install")
        pos = next((i + 1 for i, c in enumerate(nb.cells) if _title_cell(c)), 0)
        nb.cells.insert(pos, first)
    if first.source != want or first.metadata.get("cellView") != "form":
        first.source = want
        first.metadata["cellView"] = "form"  # Colab shows the #@title line, code folded
        changed.append("install cell")
    title = next((c for c in nb.cells if _title_cell(c)), None)
    if title is not None:
        text = _with_badges(title.source, badge_line(repo, branch, target))
        if text != title.source:
            title.source = text
            changed.append("badges")
    return changed


def _is_setup_cell(src: str) -> bool:
    """The install cell (any URL) or the plain ``import convlab; convlab.setup()`` cell."""
    return src.startswith(INSTALL_TITLE) or (
        "import convlab" in src and "convlab.setup(" in src and len(src.splitlines()) <= 3)


def _title_cell(cell) -> bool:
    return cell.cell_type == "markdown" and cell.source.lstrip().startswith("# ")


def _has_ids(nb) -> bool:
    return any("id" in c for c in nb.cells)


def _free_id(nb, base: str) -> str:
    ids = {c.get("id") for c in nb.cells}
    n = 0
    while f"{base}-{n}" in ids:
        n += 1
    return f"{base}-{n}"


def _with_badges(md: str, badges: str) -> str:
    """The title cell with exactly one badge line (or none) right under its heading."""
    lines = md.split("\n")
    kept, i = [], 0
    while i < len(lines):
        if BADGE_RE.match(lines[i]):
            i += 1
            if i < len(lines) and not lines[i].strip() and kept and not kept[-1].strip():
                i += 1  # the blank line that separated the badges from the text
            continue
        kept.append(lines[i])
        i += 1
    head = next(n for n, line in enumerate(kept) if line.startswith("# "))
    if badges:
        kept[head + 1:head + 1] = ["", badges] if head + 1 >= len(kept) or not kept[
            head + 1].strip() else ["", badges, ""]
    return "\n".join(kept)


def notebook_paths(root: Path) -> list[Path]:
    """The notebooks publish stamps: notebooks/ and solutions/ (exercises/ are built)."""
    out = []
    for folder in ("notebooks", "solutions"):
        d = root / folder
        if d.is_dir():
            out += sorted(p for p in d.glob("*.ipynb") if NOTEBOOK_NAME.match(p.name))
    return out


def _write_like(path: Path, nb, old_text: str) -> None:
    """Write nbformat's JSON, keeping the file's final newline (or its absence)."""
    text = nbformat.writes(nb)
    if old_text.endswith("\n") and not text.endswith("\n"):
        text += "\n"
    path.write_text(text, encoding="utf-8")


# ----------------------------------------------------------------------------------------
# README


def readme_block(repo: str, branch: str) -> str:
    """The README's block between the publish markers: clone, the two commands, pip."""
    repo, branch = check_url(repo, branch)
    folder = repo.rsplit("/", 1)[-1]
    return "\n".join([
        README_BEGIN,
        "```bash",
        f"git clone --branch {branch} {repo} && cd {folder}",
        "make lab     # creates .venv if missing, installs the course, starts JupyterLab on it",
        "make test    # creates .venv if missing, installs the course, runs ruff and the tests",
        "```",
        "",
        "Only the package, into an environment of your own (no notebooks; drop `[gpu]` "
        "without an NVIDIA GPU):",
        f'`pip install "{DIST}[gpu] @ git+{repo}@{branch}"`.',
        README_END,
    ])


def stamp_readme(text: str, repo: str, branch: str, lessons: dict) -> str:
    """README text with its publish block and syllabus badges for this URL.

    lessons: {"00": ("notebooks/00_setup.ipynb", "exercises/00_setup.ipynb" or None)}.
    A syllabus row (``| 00 | ...``) gets its badges as the last column.
    """
    if README_BEGIN in text and README_END in text:
        a = text.index(README_BEGIN)
        b = text.index(README_END, a) + len(README_END)
        text = text[:a] + readme_block(repo, branch) + text[b:]
    out, in_syllabus = [], False
    for line in text.split("\n"):
        if line.startswith("## "):
            in_syllabus = line.strip() == "## Syllabus"
        m = re.match(r"^\| (\d\d) \|", line) if in_syllabus else None
        if m and m.group(1) in lessons:
            cells = line.rstrip().rstrip("|").rstrip().split(" | ")
            links = _lesson_links(lessons[m.group(1)], repo, branch)
            if "Open in" in cells[-1] or "exercise:" in cells[-1]:
                cells[-1] = links
            else:
                cells.append(links)
            line = " | ".join(cells) + " |"
        out.append(line)
    return "\n".join(out)


def _lesson_links(paths: tuple, repo: str, branch: str) -> str:
    lesson, exercise = paths
    parts = [badge_line(repo, branch, lesson)] if lesson else []
    if exercise:
        links = notebook_links(repo, branch, exercise)
        if links:
            parts.append("exercise: " + " · ".join(f"[{k}]({u})" for k, u in links.items()))
    return " ".join(p for p in parts if p)


def lesson_index(root: Path) -> dict:
    """{"NN": (lesson notebook, exercise notebook)} as repository paths (None if absent)."""
    out: dict = {}
    for folder, slot in (("notebooks", 0), ("solutions", 1), ("exercises", 1)):
        d = root / folder
        for p in sorted(d.glob("*.ipynb")) if d.is_dir() else []:
            if NOTEBOOK_NAME.match(p.name):
                entry = list(out.get(p.name[:2], (None, None)))
                entry[slot] = f"notebooks/{p.name}" if slot == 0 else f"exercises/{p.name}"
                out[p.name[:2]] = tuple(entry)
    return out


# ----------------------------------------------------------------------------------------
# publish


@dataclass
class PublishReport:
    repo: str
    branch: str
    changed: list = field(default_factory=list)  # (file, what) stamped, or stale with check
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self, check: bool) -> str:
        lines = [f"problem: {p}" for p in self.problems]
        if check:
            lines += [f"stale: {f} ({what}; run `python -m convlab publish`)"
                      for f, what in self.changed]
            if self.ok:
                lines.append(f"every notebook and the README point at {self.repo} "
                             f"(branch {self.branch})")
        else:
            lines += [f"stamped {f} ({what})" for f, what in self.changed]
            lines.append(f"{len(self.changed)} file(s) stamped for {self.repo} "
                         f"(branch {self.branch})")
        return "\n".join(lines)


def publish(root=None, repo: str | None = None, branch: str | None = None,
            check: bool = False) -> PublishReport:
    """Stamp (or with check=True only compare) every notebook and the README.

    repo/branch default to pyproject.toml's; given, they are written there first (not with
    check). Exercises are rebuilt from the stamped solutions; with check, an exercise whose
    install cell or badges differ from its solution's stamp is stale too.
    """
    from .grading.build import build, repo_root

    root = repo_root(root)
    cur_repo, cur_branch = course_url(root)
    repo, branch = check_url(repo or cur_repo, branch or cur_branch)
    rep = PublishReport(repo, branch)
    if check and (repo, branch) != (cur_repo, cur_branch):
        rep.problems.append(f"pyproject.toml says {cur_repo} (branch {cur_branch}), "
                            f"not {repo} (branch {branch})")
    elif not check and set_course_url(root, repo, branch):
        rep.changed.append(("pyproject.toml", "[project.urls]"))
    paths = notebook_paths(root)
    if check:
        ex = root / "exercises"
        paths += sorted(p for p in ex.glob("*.ipynb") if NOTEBOOK_NAME.match(p.name)) \
            if ex.is_dir() else []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        old = path.read_text(encoding="utf-8")
        try:
            nb = nbformat.reads(old, as_version=4)
        except Exception as e:  # noqa: BLE001  (any unreadable notebook is one problem)
            rep.problems.append(f"{rel}: not a readable notebook ({e})")
            continue
        target = badge_target(root, path)
        what = stamp(nb, repo, branch, target)
        if what:
            rep.changed.append((rel, ", ".join(what)))
            if not check:
                _write_like(path, nb, old)
    readme = root / "README.md"
    if readme.exists():
        old = readme.read_text(encoding="utf-8")
        new = stamp_readme(old, repo, branch, lesson_index(root))
        if new != old:
            rep.changed.append(("README.md", "URL block, syllabus badges"))
            if not check:
                readme.write_text(new, encoding="utf-8")
    if check:
        rep.problems += [f"{f}: {what} disagree with {repo} (branch {branch})"
                         for f, what in rep.changed]
    elif (root / "solutions").is_dir():
        built = build(root)
        rep.problems += built.problems
        rep.changed += [(f, "rebuilt from its solution") for f in built.written]
    return rep


# ----------------------------------------------------------------------------------------
# pack: the offline fallback


def pack(root=None, out=None, deps: bool = False, python: str | None = None) -> Path:
    """Write ``convlab-course-VERSION.zip``: the wheel, notebooks/, exercises/, README.

    Upload it to Colab (the Files pane) or add it as a Kaggle dataset: the install cell
    installs the wheel from it instead of the repository. With deps=True the zip also holds
    ``wheels/``, every dependency (GPU extra included) downloaded for `python` (default:
    this interpreter's version, manylinux x86-64), so it installs with the internet off.
    Solutions are never packed.
    """
    from .grading.build import repo_root

    root = repo_root(root)
    if not (root / "pyproject.toml").exists():
        raise PublishError(f"{root} is not the course checkout (no pyproject.toml)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheel = build_wheel(root, tmp / "dist")
        version = wheel.name.split("-")[1]
        out = Path(out) if out else root / "dist" / f"{DIST}-{version}.zip"
        out.parent.mkdir(parents=True, exist_ok=True)
        wheel_dir = None
        if deps:
            wheel_dir = tmp / "wheels"
            _download_deps(wheel, wheel_dir, python)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            z.write(wheel, wheel.name)
            for folder in ("notebooks", "exercises"):
                for p in sorted((root / folder).glob("*.ipynb")):
                    z.write(p, f"{folder}/{p.name}")
            if (root / "README.md").exists():
                z.write(root / "README.md", "README.md")
            for p in sorted(wheel_dir.glob("*")) if wheel_dir else []:
                z.write(p, f"wheels/{p.name}")
    return out


SETUPTOOLS_MIN = 77  # pyproject's build-system: the license as an SPDX string (PEP 639)


def builds_here(version: str | None = None) -> bool:
    """Whether this environment's setuptools can build the course (then no build
    environment is downloaded); a venv's bundled setuptools may be too old to read the
    pyproject. `version`: setuptools' (default: the installed one)."""
    if version is None:
        try:
            import setuptools
        except ImportError:
            return False
        version = setuptools.__version__
    try:
        return int(version.split(".")[0]) >= SETUPTOOLS_MIN
    except ValueError:
        return False


def build_wheel(root: Path, dest: Path) -> Path:
    """``pip wheel`` of the checkout (no dependencies); the path of the wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest)]
    if builds_here():
        cmd.append("--no-build-isolation")
    # a copy of the checkout, so the build's egg-info and build/ never land in it
    src = dest.parent / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "dist", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        "artifacts", "node_modules"))
    r = subprocess.run(cmd + [str(src)], capture_output=True, text=True)
    wheels = sorted(dest.glob(f"{WHEEL_PREFIX}-*.whl"))
    if r.returncode or not wheels:
        raise PublishError(f"building the wheel failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return wheels[-1]


def _download_deps(wheel: Path, dest: Path, python: str | None) -> None:
    py = python or f"{sys.version_info[0]}{sys.version_info[1]}"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest),
           "--only-binary=:all:", "--python-version", py, "--platform", "manylinux2014_x86_64",
           "--platform", "manylinux_2_28_x86_64", f"{wheel}[gpu]"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise PublishError(f"downloading the dependencies failed:\n{r.stderr[-2000:]}")
    for w in dest.glob(f"{WHEEL_PREFIX}-*.whl"):
        w.unlink()  # the course wheel itself sits at the top of the zip

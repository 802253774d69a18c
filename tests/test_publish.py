"""convlab publish (the course URL into install cells, badges, README) and convlab pack."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from convlab import publish
from convlab.grading.build import build

ROOT = Path(__file__).resolve().parent.parent
NEW = "https://example.org/me/course"


def _copy_course(dest: Path) -> Path:
    """The files publish reads and writes, copied (notebooks without their outputs)."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in ("notebooks", "solutions", "exercises"):
        (dest / folder).mkdir()
        for p in sorted((ROOT / folder).glob("*.ipynb")):
            nb = nbformat.read(p, as_version=4)
            for c in nb.cells:
                if c.cell_type == "code":
                    c.outputs = []
            nbformat.write(nb, dest / folder / p.name)
    # the copy's exercises must be what build makes of the copy's solutions
    build(dest)
    return dest


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "convlab", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_the_repository_is_stamped_for_its_own_url():
    rep = publish.publish(ROOT, check=True)
    assert rep.ok, rep.text(True)
    repo, branch = publish.course_url(ROOT)
    assert repo.startswith("https://") and "github.com/convlab/convlab" not in repo.lower()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lessons = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("*.ipynb"))
    for num in lessons:  # a badge per lesson in the syllabus table
        row = next(line for line in readme.splitlines() if line.startswith(f"| {num} |"))
        assert "[![Open in Kaggle]" in row and f"notebooks/{num}_" in row, row


def test_publish_rewrites_every_notebook_and_check_catches_a_hand_edit(tmp_path):
    root = _copy_course(tmp_path)
    r = _cli("publish", "--root", str(root), "--repo", NEW, "--branch", "dev")
    assert r.returncode == 0, r.stdout + r.stderr
    assert publish.course_url(root) == (NEW, "dev")
    want = publish.install_cell(NEW, "dev")
    for folder in ("notebooks", "solutions", "exercises"):
        for p in sorted((root / folder).glob("*.ipynb")):
            nb = nbformat.read(p, as_version=4)
            assert next(c for c in nb.cells if c.cell_type == "code").source == want, p
            target = p.relative_to(root).as_posix().replace("solutions/", "exercises/")
            assert f"src={NEW}/raw/dev/{target})" in nb.cells[0].source, p
            assert "github.com/convlab-course" not in nb.cells[0].source
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert f'git+{NEW}@dev"' in readme and "convlab-course/convlab-course" not in readme
    assert build(root, check=True).ok, "exercises/ must match the stamped solutions"

    ok = _cli("publish", "--root", str(root), "--check")
    assert ok.returncode == 0, ok.stdout + ok.stderr

    edited = root / "exercises" / "05_coalescing.ipynb"
    nb = nbformat.read(edited, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.source = cell.source.replace(NEW, "https://github.com/someone/else")
    nbformat.write(nb, edited)
    bad = _cli("publish", "--root", str(root), "--check")
    assert bad.returncode == 1
    assert "stale: exercises/05_coalescing.ipynb (install cell" in bad.stdout, bad.stdout
    assert bad.stdout.count("stale:") == 1, bad.stdout


def test_check_refuses_a_url_other_than_pyprojects(tmp_path):
    root = _copy_course(tmp_path)
    rep = publish.publish(root, repo=NEW, check=True)
    assert not rep.ok and "pyproject.toml says" in rep.problems[0]
    assert publish.course_url(root) != (NEW, "main"), "check must write nothing"


def test_stamping_is_idempotent_and_keeps_the_title_text():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 05 · Coalescing\n\nWhy warps matter."),
                nbformat.v4.new_code_cell("import numpy as np")]
    assert publish.stamp(nb, NEW, "main", "notebooks/05_coalescing.ipynb") == [
        "install cell", "badges"]
    assert nb.cells[1].source.startswith(publish.INSTALL_TITLE)  # inserted after the title
    assert nb.cells[2].source == "import numpy as np"
    title = nb.cells[0].source
    assert title.startswith("# 05 · Coalescing\n\n[![Open in Kaggle]")
    assert title.endswith("\n\nWhy warps matter.")
    assert publish.stamp(nb, NEW, "main", "notebooks/05_coalescing.ipynb") == []
    assert publish.stamp(nb, "https://github.com/a/b", "main", "notebooks/05.ipynb") == [
        "install cell", "badges"]
    assert nb.cells[0].source.count("[![Open in Colab]") == 1
    assert "Why warps matter." in nb.cells[0].source and len(nb.cells) == 3


def test_links_and_badges():
    links = publish.notebook_links("https://github.com/a/b", "main", "notebooks/00_setup.ipynb")
    assert links == {
        "Colab": "https://colab.research.google.com/github/a/b/blob/main/notebooks/00_setup.ipynb",
        "Kaggle": "https://kaggle.com/kernels/welcome?src=https://github.com/a/b/blob/main/"
                  "notebooks/00_setup.ipynb"}
    assert list(publish.notebook_links(NEW, "main", "x.ipynb")) == ["Kaggle"]
    assert publish.badge_line("file:///tmp/course", "main", "x.ipynb") == ""


@pytest.mark.parametrize("repo, branch, match", [
    ("github.com/a/b", "main", "must be an https://"),
    ("https://github.com/a/b url", "main", "must be an https://"),
    ('https://github.com/a/b"+__import__("os")', "main", "may not contain quotes"),
    ("https://github.com/a/b", "main; rm -rf", "not a branch name"),
])
def test_bad_urls_and_branches_are_refused(repo, branch, match):
    with pytest.raises(publish.PublishError, match=match):
        publish.install_cell(repo, branch)


def test_urls_are_normalised():
    assert publish.check_url("https://github.com/a/b.git/", "main") == (
        "https://github.com/a/b", "main")
    assert publish.check_url("file:///srv/course", "main")[0] == "file://localhost/srv/course"


def test_the_distribution_is_not_pypis_convlab():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '\nname = "convlab-course"\n' in text and publish.DIST == "convlab-course"
    src = publish.install_cell(NEW, "main")
    # the course comes from its repository or a pack, never by the bare name from PyPI
    assert 'f"convlab-course{extra} @ git+{REPO}@{BRANCH}"' in src
    assert '"install", "-q", "convlab' not in src


def test_the_install_cell_is_python_and_names_the_url():
    src = publish.install_cell(NEW, "dev")
    compile(src, "install cell", "exec")
    assert f'REPO, BRANCH = "{NEW}", "dev"' in src
    assert src.rstrip().endswith("convlab.setup()  # real GPU if present, else the simulator")
    assert max(len(line) for line in src.splitlines()) <= 100


@pytest.mark.slow
def test_pack_writes_the_wheel_and_notebooks_but_no_solutions(tmp_path):
    out = tmp_path / "pack.zip"
    r = _cli("pack", "--root", str(ROOT), "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    names = zipfile.ZipFile(out).namelist()
    wheels = [n for n in names if n.endswith(".whl")]
    assert len(wheels) == 1 and wheels[0].startswith("convlab_course-"), names
    assert "notebooks/00_setup.ipynb" in names and "exercises/00_setup.ipynb" in names
    assert not any(n.startswith("solutions/") for n in names)
    with zipfile.ZipFile(out) as z:
        z.extract(wheels[0], tmp_path)
    inner = zipfile.ZipFile(tmp_path / wheels[0]).namelist()
    assert "convlab/publish.py" in inner and "convlab/results/h200.json" in inner
    data = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "convlab").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc", ".nbi", ".nbc")
                  and "__pycache__" not in p.parts)
    assert [d for d in data if d not in inner] == [], "package files missing from the wheel"
    assert not any(n.startswith(("tests/", "notebooks/", "solutions/")) for n in inner)
    meta = zipfile.ZipFile(tmp_path / wheels[0]).read(
        next(n for n in inner if n.endswith("METADATA"))).decode()
    assert "Name: convlab-course" in meta and "Project-URL: Repository, https://" in meta


def test_the_wheel_is_built_here_only_with_a_setuptools_that_reads_the_pyproject():
    import tomllib

    req = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert f"setuptools>={publish.SETUPTOOLS_MIN}" in req
    assert publish.builds_here("84.2.1") and publish.builds_here(f"{publish.SETUPTOOLS_MIN}.0")
    assert not publish.builds_here("65.5.0")  # Python 3.11's bundled one: isolated build
    assert not publish.builds_here("unknown")


def test_commands_do_not_compile_the_iri_grammar():
    """Every command (and so every grading) imports nbformat, whose jsonschema would build
    rfc3987-syntax's IRI grammar at import time (about a second) if it were allowed to."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "convlab", "publish",
                        "--check"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()
                if line.startswith("import time:")}
    assert "nbformat" in imported and "jsonschema" in imported  # the path it guards
    assert "rfc3987_syntax.syntax_helpers" not in imported and "lark" not in imported

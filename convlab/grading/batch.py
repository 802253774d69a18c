"""Grade a folder of submissions: ``python -m convlab grade-batch DIR``.

Every ``*.ipynb`` under DIR is one submission (a folder per student works too). All are
first copied into a folder only the grader can read, then each copy is graded in its own
process (``python -m convlab grade``), several at a time, so one broken submission - bad
JSON, a kernel crash, a grader bug - costs only that submission, and no submission's code
can see DIR or another submission. With an assignment named, every submission is graded
against it (one whose tasks are not that assignment's is an error row). Writes
``<out>/<name>.results.json`` for each and ``<out>/gradebook.csv`` for all of them; names
are unique (``a/b__c.ipynb`` and ``a__b/c.ipynb`` get different ones).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .gradescope import error_results, write_results


def find_submissions(folder, out_dir=None) -> list[Path]:
    folder = Path(folder)
    out_dir = Path(out_dir).resolve() if out_dir else None
    subs = []
    for p in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in p.parts:
            continue
        if out_dir and out_dir in p.resolve().parents:
            continue
        subs.append(p)
    return subs


def _name(path: Path, folder: Path) -> str:
    rel = path.relative_to(folder).with_suffix("")
    return "__".join(rel.parts)


def submission_names(subs, folder) -> dict:
    """path -> a unique gradebook name (``student__06``; ``~2``, ``~3``... on a clash)."""
    out, taken = {}, set()
    for p in subs:
        base = _name(p, Path(folder))
        name, k = base, 1
        while name.lower() in taken:
            k += 1
            name = f"{base}~{k}"
        taken.add(name.lower())
        out[p] = name
    return out


def grade_one_process(path: Path, out_json: Path, instructor=None, private_tests=None,
                      cell_timeout=None, total_timeout=None, mode="sim", assignment=None,
                      hide=(), gpu=False) -> dict:
    """Grade in a child process; always returns a results.json dict (and writes it)."""
    cmd = [sys.executable, "-m", "convlab", "grade", str(path), "--out", str(out_json),
           "--quiet", "--mode", mode]
    if gpu:
        cmd += ["--gpu"]
    if assignment:
        cmd += ["--assignment", str(assignment)]
    for h in hide:
        cmd += ["--hide", str(h)]
    if instructor:
        cmd += ["--instructor", str(instructor)]
    if private_tests:
        cmd += ["--private-tests", str(private_tests)]
    if cell_timeout:
        cmd += ["--cell-timeout", str(cell_timeout)]
    if total_timeout:
        cmd += ["--total-timeout", str(total_timeout)]
    limit = (total_timeout or 900) + 120
    if out_json.exists():
        out_json.unlink()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        status = proc.returncode
    except subprocess.TimeoutExpired:
        detail, status = [f"the grader itself ran over {limit:.0f} s"], -1
    try:
        data = json.loads(out_json.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        data = error_results("could not grade this submission: " + (
            " | ".join(detail) or f"grader exit status {status}"))
        write_results(data, out_json)
    return data


def _private_copies(subs, names, into: Path) -> dict:
    """path -> its copy in `into` (same file name, one folder per submission)."""
    out = {}
    for k, p in enumerate(subs):
        d = into / f"{k:05d}"
        d.mkdir()
        try:
            out[p] = Path(shutil.copyfile(p, d / p.name))
        except OSError:
            out[p] = p  # unreadable: its grading reports why
    return out


def grade_batch(folder, out_dir=None, *, jobs: int = 2, instructor=None, private_tests=None,
                cell_timeout=None, total_timeout=None, mode="sim", progress: bool = True,
                assignment=None, gpu=False):
    """Grade every notebook under `folder`; return the gradebook rows (dicts).

    gpu: run on the GPU and time the speed tasks, one submission at a time (timings of
    submissions sharing a GPU would disturb each other).
    """
    if gpu:
        jobs = 1
    folder = Path(folder)
    out_dir = Path(out_dir) if out_dir else folder / "graded"
    out_dir.mkdir(parents=True, exist_ok=True)
    subs = find_submissions(folder, out_dir)
    names = submission_names(subs, folder)
    rows: dict = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(subs), desc="grading", unit="notebook")
    private = Path(tempfile.mkdtemp(prefix="convlab-batch-"))
    copies = _private_copies(subs, names, private)
    hide = [str(folder.resolve()), str(out_dir.resolve())]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {}
        for p in subs:
            name = names[p]
            out_json = out_dir / f"{name}.results.json"
            futures[pool.submit(grade_one_process, copies[p], out_json, instructor,
                                private_tests, cell_timeout, total_timeout, mode, assignment,
                                hide, gpu)] = (name, p, out_json)
        for fut in as_completed(futures):
            name, p, out_json = futures[fut]
            try:
                data = fut.result()
            except Exception as e:  # noqa: BLE001  (never stop the batch)
                data = error_results(f"could not grade this submission: {e}")
                write_results(data, out_json)
            rows[name] = _row(name, p, data)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"{name}: {rows[name]['score']:g}")
    shutil.rmtree(private, ignore_errors=True)
    if bar is not None:
        bar.close()
    ordered = [rows[names[p]] for p in subs]
    write_gradebook(ordered, out_dir / "gradebook.csv")
    return ordered


def _row(name: str, path: Path, data: dict) -> dict:
    extra = data.get("extra_data", {})
    row = {"submission": name, "file": str(path), "score": data.get("score", 0),
           "max_score": extra.get("max_score", ""),
           "status": "error" if extra.get("error") else "graded",
           "error": extra.get("error", ""),
           "flags": "; ".join(f"{k}: {', '.join(v)}" for k, v in (extra.get("flags") or {}
                                                                     ).items())}
    for t in data.get("tests", []):
        if t.get("visibility") != "hidden":
            row[f"{t['name']}"] = t.get("score", 0)
    return row


def write_gradebook(rows: list, path) -> None:
    fixed = ["submission", "score", "max_score", "status"]
    tasks = sorted({k for r in rows for k in r} - set(fixed) - {"file", "error", "flags"})
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fixed + tasks + ["flags", "error", "file"],
                           restval="")
        w.writeheader()
        for r in rows:
            w.writerow(r)

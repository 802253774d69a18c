"""One harness for the measurements behind the lessons: groups of named sections.

A `Group` is the set of measurements stored in one results file (e.g. lessons04_06.json,
which lessons 04-06 read). Each of its sections is a function ``fn(ctx) -> JSON data``
that checks every variant against a reference before it times it, and takes every time
from ``ctx.clock`` (`GpuClock` on a GPU, `FakeClock` in a dry run). `run_group` runs the
chosen sections in order, each one once; a section that raises is recorded (its error,
with the traceback printed) and the run goes on; the file is written after every section,
so a run cut short keeps what finished. An existing file is updated: sections run again
replace their old entries, the others stay, and each run appends its provenance (date,
commit, command, device) to "runs".

Two layouts, the ones the lessons read:

- "sections": ``{"environment": {...}, "sections": {name: data}, "errors": {name: why},
  "section_s": {name: seconds}, "runs": [...]}``;
- "flat": the environment's entries and every section's data at the top level (a
  section marked `spread` adds its dict's entries themselves), failures under "failed".
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Skip(Exception):  # noqa: N818  (a signal, not an error)
    """Raised by a section that cannot run here (a library is missing): it is stored as
    ``{"skipped": reason}`` instead of an error."""


@dataclass
class Section:
    name: str
    fn: Callable
    lessons: tuple = ()
    optional: bool = False  # skipped once the run has spent its time budget
    spread: bool = False    # "flat" layout: the dict's entries go to the top level


@dataclass
class Group:
    """The measurements stored in one results file, ``<prefix>_<name>.json``
    (``<prefix>.json`` for the groups that share the main file, see `file`)."""

    name: str
    layout: str = "sections"
    about: str = ""
    file: str | None = None  # several groups sharing one file: <prefix>.json or <file>.json
    sections: list = field(default_factory=list)
    environment: Callable | None = None  # ctx -> extra entries of the environment

    def section(self, name: str, lessons=(), optional: bool = False, spread: bool = False):
        """Decorator: register ``fn(ctx)`` as section `name`, shown by `lessons`."""
        def deco(fn):
            self.sections.append(Section(name, fn, tuple(lessons), optional, spread))
            return fn
        return deco

    @property
    def lessons(self) -> list:
        return sorted({x for s in self.sections for x in s.lessons})

    def filename(self, prefix: str = "") -> str:
        if self.file is not None:
            return f"{prefix or self.file}.json"
        return f"{prefix}_{self.name}.json" if prefix else f"{self.name}.json"


@dataclass
class Context:
    """What a section gets: the clock, whether this is a dry run, and the results so far."""

    clock: object
    dry: bool = False
    out: Path | None = None
    prefix: str = ""
    workers: int = 1
    budget_s: float = float("inf")
    data: dict = field(default_factory=dict)
    group: Group | None = None
    t0: float = field(default_factory=time.time)

    def elapsed(self) -> float:
        return time.time() - self.t0

    def pick(self, gpu, dry):
        """`dry` in a dry run (tiny: the harness is being tested), else `gpu`."""
        return dry if self.dry else gpu

    def log(self, msg: str) -> None:
        print(f"  [{self.elapsed():6.1f}s] {msg}", flush=True)

    @property
    def env(self) -> dict:
        if self.group is not None and self.group.layout == "flat":
            return self.data
        return self.data.get("environment", {})

    def result(self, name: str):
        """The data of a section of this group that already ran (None if it did not)."""
        if self.group is not None and self.group.layout == "flat":
            return self.data.get(name)
        return self.data.get("sections", {}).get(name)

    def need(self, *what: str) -> None:
        """Skip the section unless each of `what` is here: a module name, or "torch.cuda"
        (PyTorch with a GPU) or "cuda" (a real GPU: not the simulator)."""
        from ..runtime import is_simulator

        for w in what:
            if w == "cuda":
                ok = not is_simulator()
            elif w == "torch.cuda":
                try:
                    ok = importlib.import_module("torch").cuda.is_available()
                except ImportError:
                    ok = False
            else:
                try:
                    importlib.import_module(w)
                    ok = True
                except ImportError:
                    ok = False
            if not ok:
                raise Skip(f"needs {w}")


def environment(ctx: Context) -> dict:
    """Device, compute capability, versions and date of this run (`ladder.environment`)."""
    from ..ladder import environment as env

    e = env()
    if ctx.dry:
        e["device"] = "simulator (dry run)"
    return e


def commit() -> str | None:
    """The checkout's commit (COMMIT in the environment wins: a copy without .git)."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, cwd=ROOT, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def card_prefix(device_name: str) -> str:
    """The results-file prefix of the card that measured them ("h200", "h100", "a100", ...,
    "gpu" for a name without a known model): a run on an H100 must not land in a file
    the lessons read as the H200's."""
    if isinstance(device_name, bytes):
        device_name = device_name.decode(errors="replace")
    m = re.search(r"\b([A-Z]{1,3}) ?(\d{1,4})\b", str(device_name).upper())
    return (m.group(1) + m.group(2)).lower() if m else "gpu"


def _store(group: Group, data: dict, s: Section, value) -> None:
    if group.layout == "sections":
        data.setdefault("sections", {})[s.name] = value
        data.setdefault("errors", {}).pop(s.name, None)
    else:
        if s.spread and isinstance(value, dict) and "skipped" not in value:
            data.update(value)
        else:
            data[s.name] = value
        data.get("failed", {}).pop(s.name, None)


def _fail(group: Group, data: dict, s: Section, why: str) -> None:
    data.setdefault("errors" if group.layout == "sections" else "failed", {})[s.name] = why


def save(data: dict, path: Path | None) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float) + "\n")
    tmp.replace(path)


def run_group(group: Group, ctx: Context, names=None, path: Path | None = None,
              command: str = "") -> dict:
    """Run the sections `names` of `group` (all when None), in the group's order; write
    the results to `path` after each (updating what is there); return the results."""
    data = {}
    if path is not None and path.exists():
        data = json.loads(path.read_text())
    if group.about and "about" not in data:
        data["about"] = group.about
    ctx.data, ctx.group = data, group
    chosen = [s for s in group.sections if names is None or s.name in names]
    env = environment(ctx)
    if group.environment is not None:
        env.update(group.environment(ctx))
    if group.layout == "sections":
        data["environment"] = env
    else:
        data.update(env)
    data.setdefault("runs", []).append(dict(
        date=env["date"], commit=commit(), command=command, device=env["device"],
        clock=ctx.clock.method, sections=[s.name for s in chosen]))
    save(data, path)
    print(f"=== {group.name} on {env['device']}: {', '.join(s.name for s in chosen)}",
          flush=True)
    for s in chosen:
        t = time.time()
        print(f"--- {s.name} ({ctx.elapsed():.0f} s)", flush=True)
        if s.optional and ctx.elapsed() > ctx.budget_s:
            _store(group, data, s, {"skipped": f"time ({ctx.elapsed():.0f} s elapsed)"})
        else:
            try:
                _store(group, data, s, s.fn(ctx))
            except Skip as e:
                print(f"  skipped: {e}")
                _store(group, data, s, {"skipped": str(e)})
            except Exception as e:  # noqa: BLE001  (one broken section must not stop the rest)
                traceback.print_exc(file=sys.stdout)
                _fail(group, data, s, f"{type(e).__name__}: {str(e)[:2000]}")
        data.setdefault("section_s", {})[s.name] = round(time.time() - t, 1)
        data["elapsed_s"] = round(ctx.elapsed(), 1)
        save(data, path)
    failed = data.get("errors" if group.layout == "sections" else "failed", {})
    bad = [s.name for s in chosen if s.name in failed]
    data["runs"][-1]["failed"] = bad
    save(data, path)
    print(f"=== {group.name}: {len(chosen) - len(bad)} of {len(chosen)} sections done"
          + (f", failed: {', '.join(bad)}" if bad else "")
          + (f"; wrote {path}" if path is not None else ""), flush=True)
    return data

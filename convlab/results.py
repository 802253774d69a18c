"""The one reader of the measurements stored in the package (convlab/results/*.json).

Lessons show these numbers when there is no GPU; kernels read their tuned tile shapes
from them. Every file is a JSON object written by a run on a real GPU, with its
provenance (device, versions, date) inside.

- `load(name)`: the whole file convlab/results/<name>.json.
- `section(name, key)`: one entry of a file's "sections" (the per-lesson measurement
  files keep one section per measurement).
- `tuned(family)`: the tile shapes an autotuning run chose, ``problem_key -> config``;
  the environment variable CONVLAB_TUNED names a fresh tuning file that overrides the
  stored one.
- `problem_key(p)`: a layer's shape as the key of those tables.

Nothing here imports the rest of convlab, so every layer may read stored results.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RESULTS_DIR = Path(__file__).parent / "results"
TUNED_ENV = "CONVLAB_TUNED"


def names() -> list:
    """The stored results files (without .json), sorted."""
    return sorted(p.stem for p in RESULTS_DIR.glob("*.json"))


def load(name: str = "h200") -> dict:
    """The committed measurements convlab/results/<name>.json (FileNotFoundError naming
    the known files if there is none)."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored results {path.name}; known: {names()}")
    return json.loads(path.read_text())


def section(name: str, key: str | None = None, path=None) -> dict:
    """One section of a per-lesson results file (all of the file when key is None).

    path: read this JSON file instead of the stored one (a fresh run's output).
    """
    data = json.loads(Path(path).read_text()) if path is not None else load(name)
    if key is None:
        return data
    sections = data.get("sections", {})
    if key not in sections:
        raise KeyError(f"{name} has no section {key!r}; sections: {sorted(sections)}")
    return sections[key]


def problem_key(p) -> str:
    """A layer's shape (a ConvParams) as a lookup key: 'N,C,H,W,K,R,S/stride/padding/dilation'."""
    return (f"{p.N},{p.C},{p.H},{p.W},{p.K},{p.R},{p.S}/{p.stride[0]},{p.stride[1]}/"
            f"{p.padding[0]},{p.padding[1]}/{p.dilation[0]},{p.dilation[1]}")


def tuned(family: str, name: str = "h200") -> dict:
    """The tile shapes chosen on a real GPU for `family` ('numba', 'cuda'):
    problem_key -> config dict; empty when there is no table.

    From the "tuned" entry of convlab/results/<name>.json, or of the JSON file named by
    the environment variable CONVLAB_TUNED (a fresh tuning run, before it is committed).
    """
    path = os.environ.get(TUNED_ENV)
    try:
        data = json.loads(Path(path).read_text()) if path else load(name)
    except (FileNotFoundError, ValueError):
        return {}
    return dict(data.get("tuned", {}).get(family, {}))

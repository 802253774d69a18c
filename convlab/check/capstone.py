"""The capstone's checker (lesson 13): a ladder run on a real GPU, checked for what it
claims (every layer present, the learner's kernel correct and timed beside cuDNN in the
same run, its % of the baseline consistent with the two times)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import CheckError
from .core import EPS, _close


def check_ladder(result, kernel: str, *, layers=("64ch 56x56", "128ch 28x28", "256ch 14x14"),
                 baseline: str = "cuDNN fp32", quiet=False) -> str:
    """Check a ladder made by ``convlab bench`` / ``ladder.run_ladder`` (a dict, or the path
    of its ladder.json) for the capstone: a real GPU, every named ResNet layer present, the
    row `kernel` checked against float64 within fp32 tolerance and timed beside the
    `baseline` in the same ladder, and its % of the baseline consistent with the two times.
    Prints one line per layer and the geometric mean; raises CheckError otherwise."""
    task = "capstone ladder"
    if not isinstance(result, dict):
        try:
            result = json.loads(Path(result).read_text())
        except (OSError, ValueError) as e:
            raise CheckError(f"{task}: cannot read {result}: {e}") from None
    device = str(result.get("device", ""))
    if not device or "sim" in device.lower():
        raise CheckError(f"{task} FAILED: the ladder must come from a real GPU (device "
                         f"{device!r}); run it where convlab.is_simulator() is False")
    lads = {lad["problem"].split(":")[0]: lad for lad in result.get("ladders", [])}
    lines, pcts = [], []
    for layer in layers:
        lad = lads.get(layer)
        if lad is None:
            raise CheckError(f"{task} FAILED: layer {layer!r} is missing; found "
                             f"{sorted(lads)} (run the ladder on problems.RESNET)")
        rows = {r["name"]: r for r in lad["rows"]}
        mine, base = rows.get(kernel), rows.get(baseline)
        if base is None:
            raise CheckError(f"{task} FAILED on {layer}: no {baseline} row in the same run")
        if mine is None:
            why = [f"{d['name']}: {d['error']}" if isinstance(d, dict) else d
                   for d in lad.get("not_timed", []) if kernel in str(d)]
            raise CheckError(f"{task} FAILED on {layer}: no row {kernel!r}" + (
                f" ({why[0]})" if why else " (was it passed in kernels=...?)"))
        red = 9 * int(layer.split("ch")[0])  # 3x3 filters over C channels
        tol = 8 * EPS["fp32"] * math.sqrt(red)
        if not (mine["max_rel_err"] <= tol and mine["ms"] > 0):
            raise CheckError(f"{task} FAILED on {layer}: {kernel} has max rel err "
                             f"{mine['max_rel_err']:.2e} (fp32 tolerance {tol:.1e}) and "
                             f"{mine['ms']} ms")
        pct = 100 * base["ms"] / mine["ms"]
        if mine.get("pct_of_baseline") is not None and not _close(
                pct, mine["pct_of_baseline"], 1e-6):
            raise CheckError(f"{task} FAILED on {layer}: % of {baseline} "
                             f"{mine['pct_of_baseline']:.3f} does not match the times "
                             f"({pct:.3f}): an edited ladder?")
        pcts.append(pct)
        lines.append(f"  {layer}: {kernel} {mine['ms']:.4f} ms = {pct:.0f}% of {baseline} "
                     f"({base['ms']:.4f} ms), max rel err {mine['max_rel_err']:.1e}")
    geo = math.exp(sum(math.log(p) for p in pcts) / len(pcts))
    line = (f"✓ {task}: {kernel} on {device} ({result.get('date', '?')}): geometric mean "
            f"{geo:.0f}% of {baseline}\n" + "\n".join(lines))
    if not quiet:
        print(line)
    return line

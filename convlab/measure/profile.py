"""Nsight Compute evidence for every rung of the conv ladder (`convlab profile`).

The tracer (`convlab.trace`) predicts sectors per request and bank conflicts from the
addresses a kernel touches; Nsight Compute (``ncu``) reads the hardware counters. This
module puts the two side by side for the lessons:

- `METRICS`: a small metric set that needs few replay passes: achieved occupancy,
  registers per thread, DRAM throughput (% of peak and bytes), global-load sectors per
  request in L1 and L2, shared-memory bank conflicts (loads and stores), issue-slot
  utilisation, and the warp stall reasons (the largest one is the "top stall").
- `profile_ladder`: runs ONE child Python process under
  ``ncu --clock-control none --profile-from-start off --csv --page raw``. The child
  compiles and warms up each rung outside the profiled range, then profiles one call of
  it, preceded by a tiny marker kernel, so that ncu's rows can be cut into rungs however
  many kernels a launcher starts (some rearrange the filters first).
- `parse_csv`, `attribute`, `summarize`: ncu's raw CSV -> rows -> per-rung main kernel
  (the longest one, ``gpu__time_duration.sum``) -> the numbers of `table`.
- `stored`, `table`: the H200 run stored in convlab/results/h200_profile.json, for
  learners without a GPU or without ncu.

Units: times in ns, bytes in bytes, percentages in % (ncu is asked for base units; scaled
units such as ``usecond`` or ``Mbyte`` are converted back when they appear).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import Unsupported

RESULT = "h200_profile"  # convlab/results/<RESULT>.json
MARKER = "convlab_profile_marker"  # the child's marker kernel (a substring of ncu's name)
CHILD_TAG = "@convlab-profile "  # prefix of the child's JSON lines on stdout
MISSING = ("no stored profile (convlab/results/h200_profile.json): run "
           "`python -m convlab profile --out DIR` on a GPU with Nsight Compute (ncu) "
           "and store DIR/h200_profile.json there")

TIME = "gpu__time_duration.sum"
# name in the results -> ncu metric (checked against the Nsight Compute metric names for
# compute capability 7.0-9.0)
BASE = {
    "time": TIME,
    "regs": "launch__registers_per_thread",
    "occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "occupancy_theory": "sm__maximum_warps_per_active_cycle_pct",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "l1_ld_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1_ld_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l2_rd_sectors": "lts__t_sectors_srcunit_tex_op_read.sum",
    "l2_rd_requests": "lts__t_requests_srcunit_tex_op_read.sum",
    "shared_ld_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "shared_st_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "shared_ld_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "shared_ld_requests": "smsp__sass_inst_executed_op_shared_ld.sum",
    "shared_st_requests": "smsp__sass_inst_executed_op_shared_st.sum",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
}
# Warps stalled for each reason per issued instruction; "selected" (the warp that issued)
# is collected but is no stall.
STALLS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
          "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc",
          "no_instruction", "not_selected", "selected", "short_scoreboard", "sleeping",
          "tex_throttle", "wait")


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


METRICS = tuple(BASE.values()) + tuple(stall_metric(r) for r in STALLS)

# ncu's scaled units -> factor to the base unit (ns, byte, sector, ...)
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
_COUNTED = ("byte", "sector", "request", "inst", "warp", "wavefront", "cycle")


def _scale(unit: str) -> float:
    """Factor from `unit` (as ncu prints it) to its base unit; 1.0 when unknown."""
    if unit in _TIME:
        return _TIME[unit]
    for base in _COUNTED:
        head = unit.split("/")[0]
        if head.endswith(base) and head[: -len(base)] in _PREFIX:
            return _PREFIX[head[: -len(base)]]
    return 1.0


def _number(text: str):
    """ncu's printed value as a float (thousands separators removed); None if not a number."""
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------
# ncu's raw CSV


def parse_csv(text: str) -> list:
    """The rows of ``ncu --csv --page raw`` output, in launch order (ncu's ID).

    One dict per profiled kernel: ``id``, ``kernel`` (the name as ncu printed it),
    ``block``, ``grid`` and ``metrics`` {metric name: float in base units, or None}.
    Lines before the header (``==PROF==`` messages, the program's own output) are skipped;
    the units row under the header is read, not taken for a kernel.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\",) in this output:\n"
                         + "\n".join(lines[-8:]))
    table = [r for r in csv.reader(io.StringIO("\n".join(lines[start:]))) if r]
    header = table[0]
    fixed = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
             "Stream", "Block Size", "Grid Size", "Device", "CC"}
    rows, units = [], {}
    for r in table[1:]:
        if len(r) != len(header):
            continue  # a line of program output that happens to follow the table
        rec = dict(zip(header, r, strict=True))
        if not rec["ID"].strip():  # the units row
            units = {k: v for k, v in rec.items() if k not in fixed}
            continue
        if not rec["ID"].strip().isdigit():
            continue
        metrics = {}
        for k, v in rec.items():
            if k in fixed:
                continue
            x = _number(v)
            metrics[k] = None if x is None else x * _scale(units.get(k, ""))
        rows.append(dict(id=int(rec["ID"]), kernel=rec.get("Kernel Name", ""),
                         block=rec.get("Block Size", ""), grid=rec.get("Grid Size", ""),
                         metrics=metrics))
    return sorted(rows, key=lambda row: row["id"])


def short_name(kernel: str) -> str:
    """A readable kernel name: no namespace, ABI tag, parameter list or return type
    ('cudapy::convlab::kernels::conv01_naive::k[abi:..](Array<..>)' -> 'k')."""
    s = re.sub(r"\[abi:[^\]]*\]", "", kernel)
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    s = s[:cut]
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(s):
        depth += ch == "<"
        depth -= ch == ">"
        if depth == 0 and s.startswith("::", i):
            parts.append(s[last:i])
            last = i + 2
    s = s[last:].strip()
    pre = s.split("<")[0]
    return s[pre.rfind(" ") + 1:] if " " in pre else s  # drop a return type ("void ")


def attribute(rows: list, rungs: list) -> dict:
    """Cut ncu's rows (in launch order) into rungs: {rung: [rows]}.

    rungs: the child's records, in the order it profiled them; a record with
    ``profiled`` true owns one profiled window. When the rows hold marker kernels, each
    marker opens the next window (and is dropped); without markers, the records' ``kernels``
    counts say how many rows each window has. Raises ValueError when the two disagree.
    """
    windows = [r for r in rungs if r.get("profiled")]
    marks = [i for i, row in enumerate(rows) if MARKER in row["kernel"]]
    if marks:
        if len(marks) != len(windows):
            raise ValueError(f"ncu reported {len(marks)} marker kernels for {len(windows)} "
                             "profiled rungs: the rows cannot be attributed")
        if marks[0] != 0:
            raise ValueError(f"{marks[0]} kernel(s) before the first marker: rows of no rung")
        bounds = marks + [len(rows)]
        out = {}
        for rec, a, b in zip(windows, bounds[:-1], bounds[1:], strict=True):
            seg = [row for row in rows[a + 1:b] if MARKER not in row["kernel"]]
            n = rec.get("kernels")
            if n is not None and n != len(seg):
                raise ValueError(f"{rec['rung']}: the child launched {n} kernel(s), ncu "
                                 f"profiled {len(seg)}")
            out[rec["rung"]] = seg
        return out
    if any(r.get("kernels") is None for r in windows):
        raise ValueError("no marker kernels in ncu's rows and no kernel counts to cut them by")
    need = sum(r["kernels"] for r in windows)
    if need != len(rows):
        raise ValueError(f"the child launched {need} kernels, ncu profiled {len(rows)}")
    out, at = {}, 0
    for rec in windows:
        out[rec["rung"]] = rows[at:at + rec["kernels"]]
        at += rec["kernels"]
    return out


def _ratio(a, b):
    return None if a is None or not b else a / b


def summarize(rows: list) -> dict:
    """The numbers of one rung from its rows: the main kernel is the longest one.

    Returns kernel (short name), kernel_full, kernels [(short name, ns)], and the derived
    values: regs, occupancy_pct, occupancy_theory_pct, dram_pct, dram_bytes,
    sectors_per_request (L1, global loads), l2_sectors_per_request (L2 reads from L1),
    shared_ld/st_conflicts_per_request, shared_ld_wavefronts_per_request, issue_pct,
    top_stall, top_stall_share (its share of all stall reasons but "selected"), stalls
    {reason: warps per issued instruction}, metrics (every raw value of the main kernel).
    """
    if not rows:
        raise ValueError("no kernels to summarize")
    main = max(rows, key=lambda row: row["metrics"].get(TIME) or 0.0)
    m = main["metrics"]
    g = {k: m.get(v) for k, v in BASE.items()}
    stalls = {r: m.get(stall_metric(r)) for r in STALLS if m.get(stall_metric(r)) is not None}
    stalled = {r: v for r, v in stalls.items() if r != "selected"}
    total = sum(stalled.values())
    top = max(stalled, key=stalled.get) if stalled else None
    dram = None if g["dram_read"] is None else g["dram_read"] + (g["dram_write"] or 0.0)
    return dict(
        kernel=short_name(main["kernel"]), kernel_full=main["kernel"],
        kernels=[(short_name(row["kernel"]), row["metrics"].get(TIME)) for row in rows],
        time_ns=g["time"], block=main["block"], grid=main["grid"],
        regs=g["regs"], occupancy_pct=g["occupancy"], occupancy_theory_pct=g["occupancy_theory"],
        dram_pct=g["dram_pct"], dram_bytes=dram,
        sectors_per_request=_ratio(g["l1_ld_sectors"], g["l1_ld_requests"]),
        l2_sectors_per_request=_ratio(g["l2_rd_sectors"], g["l2_rd_requests"]),
        shared_ld_conflicts_per_request=_ratio(g["shared_ld_conflicts"], g["shared_ld_requests"]),
        shared_st_conflicts_per_request=_ratio(g["shared_st_conflicts"], g["shared_st_requests"]),
        shared_ld_wavefronts_per_request=_ratio(g["shared_ld_wavefronts"],
                                                g["shared_ld_requests"]),
        shared_ld_conflicts=g["shared_ld_conflicts"], shared_st_conflicts=g["shared_st_conflicts"],
        issue_pct=g["issue_pct"], top_stall=top,
        top_stall_share=stalled[top] / total if top and total else None,
        stalls=stalls, metrics=m)


def build_result(csv_text: str, child_lines: list, layer: str, meta: dict | None = None) -> dict:
    """The results dict of one profiling run from ncu's CSV and the child's JSON records."""
    env = next((r["environment"] for r in child_lines if "environment" in r), {})
    recs = [r for r in child_lines if "rung" in r]
    per = attribute(parse_csv(csv_text), recs)
    out = dict(env, layer=layer, metrics_requested=list(METRICS), order=[r["rung"] for r in recs],
               rungs={}, errors={})
    out.update(meta or {})
    for r in recs:
        if r.get("error"):
            out["errors"][r["rung"]] = r["error"]
        elif not per.get(r["rung"]):
            out["errors"][r["rung"]] = "ncu profiled no kernel of this rung"
        else:
            out["rungs"][r["rung"]] = dict(summarize(per[r["rung"]]), problem=r.get("problem"))
    return out


# ----------------------------------------------------------------------------------------
# Running ncu


def require_ncu(ncu: str = "ncu") -> str:
    """The path of the ncu executable; `Unsupported` (with what to do) when there is none."""
    path = shutil.which(ncu)
    if path is None:
        raise Unsupported(f"Nsight Compute ({ncu!r}) is not on PATH: install Nsight Compute "
                          "(it ships with the CUDA toolkit) or pass its path, e.g. "
                          "ncu=/usr/local/cuda/bin/ncu; the stored H200 profile is "
                          "convlab.measure.profile.stored()")
    return path


def require_device() -> dict:
    """The driver's facts; `Unsupported` when no CUDA GPU is visible (ncu needs one)."""
    from ..runtime import driver_info

    drv = driver_info()
    if not drv.get("gpus"):
        raise Unsupported("profiling needs a CUDA GPU and there is none here ("
                          f"{drv.get('error') or 'the driver reports 0 GPUs'}); the stored "
                          "H200 profile is convlab.measure.profile.stored()")
    return drv


def ncu_command(ncu: str, log: str, metrics, child: list) -> list:
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv",
            "--page", "raw", "--print-units", "base", "--log-file", log,
            "--metrics", ",".join(metrics), *child]


def _ncu_version(ncu: str) -> str | None:
    try:
        r = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in r.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _unknown_metrics(log: str, metrics) -> set:
    """The requested metrics that ncu's error messages name (not on this GPU/version)."""
    bad = {m for m in metrics if m in log and re.search(
        r"(fail|not found|invalid|unknown|not available)[^\n]*" + re.escape(m)
        + r"|" + re.escape(m) + r"[^\n]*(not found|invalid|unknown|not available)",
        log, re.I)}
    return bad


def _run(cmd: list, env: dict, timeout_s: float) -> subprocess.CompletedProcess:
    """Run ncu and its child in a session of their own; on timeout kill that session."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        raise RuntimeError(f"ncu did not finish in {timeout_s:.0f} s (killed); profile fewer "
                           "rungs at a time (--rungs), each run adds to the results file") from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def profile_ladder(rungs=None, layer: str = "resnet128", out=None, ncu: str = "ncu",
                   timeout_s: float = 600, command: str = "") -> dict:
    """Profile each rung of `convlab.kernels.CONV_LADDER` (or the names in `rungs`) on
    `layer` under Nsight Compute; return the results (and write ``out/h200_profile.json``,
    updating the rungs it ran, when `out` is a folder).

    Raises `Unsupported` without ncu or without a GPU, RuntimeError when ncu fails (its
    log's tail in the message).
    """
    path = require_ncu(ncu)
    drv = require_device()
    names = list(rungs) if rungs else None
    metrics = list(METRICS)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="convlab_ncu_") as tmp:
        log = os.path.join(tmp, "ncu.csv")
        child = [sys.executable, "-m", "convlab.measure.profile", "--child", "--layer", layer]
        if names:
            child += ["--rungs", ",".join(names)]
        root = str(Path(__file__).resolve().parents[2])  # the child imports this convlab
        env = dict(os.environ, CONVLAB_MODE="gpu",
                   PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        for attempt in range(2):
            if os.path.exists(log):
                os.remove(log)
            r = _run(ncu_command(path, log, metrics, child), env, timeout_s)
            text = Path(log).read_text() if os.path.exists(log) else ""
            if '"ID",' not in text:  # an ncu that printed its report to stdout
                text = text + "\n" + r.stdout
            bad = _unknown_metrics(text + r.stderr, metrics)
            if r.returncode == 0 or not bad or attempt:
                break
            metrics = [m for m in metrics if m not in bad]  # retry once without them
    tail = "\n".join((text + "\n" + r.stderr).strip().splitlines()[-25:])
    if r.returncode != 0:
        raise RuntimeError(f"ncu exited with {r.returncode}:\n{tail}")
    lines = [json.loads(line[len(CHILD_TAG):]) for line in r.stdout.splitlines()
             if line.startswith(CHILD_TAG)]
    from .harness import commit

    meta = dict(ncu=_ncu_version(path), driver=drv.get("driver"), commit=commit(),
                command=command or "convlab.measure.profile.profile_ladder("
                f"rungs={names}, layer={layer!r})", wall_s=round(time.time() - t0, 1),
                metrics_dropped=sorted(set(METRICS) - set(metrics)))
    try:
        res = build_result(text, lines, layer, meta)
    except ValueError as e:
        raise RuntimeError(f"{e}\nncu's output ends:\n{tail}") from e
    if out is not None:
        res = _merge(Path(out) / f"{RESULT}.json", res)
    return res


def _merge(path: Path, res: dict) -> dict:
    """Write `res` into the results file at `path`: rungs run again replace theirs, the
    others stay; each run appends its provenance to "runs"."""
    from .harness import save

    old = json.loads(path.read_text()) if path.exists() else {}
    if old and old.get("layer") != res["layer"]:
        old = {}  # another layer: start over
    data = dict(old, **{k: v for k, v in res.items() if k not in ("rungs", "errors", "order")})
    data["rungs"] = {**old.get("rungs", {}), **res["rungs"]}
    data["errors"] = {k: v for k, v in {**old.get("errors", {}), **res["errors"]}.items()
                      if k not in res["rungs"]}
    data["order"] = list(dict.fromkeys(old.get("order", []) + res["order"]))
    data["runs"] = old.get("runs", []) + [dict(
        date=res.get("date"), commit=res.get("commit"), command=res.get("command"),
        device=res.get("device"), ncu=res.get("ncu"), rungs=res["order"])]
    save(data, path)
    return data


# ----------------------------------------------------------------------------------------
# The child: runs under ncu, one profiled window per rung


def _emit(record: dict) -> None:
    print(CHILD_TAG + json.dumps(record, default=str), flush=True)


def _child(layer: str, names) -> int:
    from .. import runtime

    runtime.setup("gpu")
    import numpy as np
    from numba import cuda

    from .. import check, kernels, problems
    from ..ladder import environment

    @cuda.jit
    def convlab_profile_marker(a):
        a[0] = 1.0

    _emit({"environment": environment()})
    prob = problems.conv_layer(layer)
    order = [n for n in kernels.CONV_LADDER if not names or n in names]
    rng = np.random.default_rng(0)
    x = cuda.to_device(check.random_array(prob.x_shape, rng))
    w = cuda.to_device(check.random_array(prob.w_shape, rng))
    y = cuda.device_array(prob.out_shape, np.float32)
    flag = cuda.device_array(1, np.float32)
    convlab_profile_marker[1, 1](flag)  # compiled outside the profiled range
    cuda.synchronize()
    for name in order:
        fn = kernels.CONV_LADDER[name]
        try:
            fn(x, w, y, **prob.kwargs)  # compile and warm up, not profiled
            cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (a rung that cannot run is reported)
            _emit({"rung": name, "error": f"{type(e).__name__}: {str(e)[:500]}"})
            continue
        cuda.profile_start()
        convlab_profile_marker[1, 1](flag)
        fn(x, w, y, **prob.kwargs)
        cuda.synchronize()
        cuda.profile_stop()
        _emit({"rung": name, "profiled": True, "problem": str(prob)})
    for n in names or ():
        if n not in kernels.CONV_LADDER:
            _emit({"rung": n, "error": f"not a rung of this ladder: {list(kernels.CONV_LADDER)}"})
    return 0


# ----------------------------------------------------------------------------------------
# Reading and showing


def stored(path=None):
    """The stored profile (convlab/results/h200_profile.json, or the JSON file `path`);
    None when there is none (`table(None)` says so)."""
    from .. import results

    try:
        if path is not None:
            return json.loads(Path(path).read_text())
        return results.load(RESULT)
    except FileNotFoundError:
        return None


def value(result, rung: str, key: str):
    """One number of one rung (e.g. 'sectors_per_request'); None when not profiled."""
    if not result:
        return None
    return result.get("rungs", {}).get(rung, {}).get(key)


def _fmt(v, spec: str) -> str:
    """`v` formatted by `spec`; a missing value is a dash of the same width."""
    width = re.match(r"\d*", spec).group()
    return format("-", f">{width}") if v is None else format(v, spec)


def table(result, rungs=None) -> str:
    """The profile as text: one line per rung (ladder order), its main kernel and numbers.

    Columns: registers per thread, achieved occupancy %, DRAM throughput % of peak and
    MB moved, global-load sectors per request (L1) and L2 read sectors per L2 request (not
    per warp request: the L1 splits and merges requests on the way),
    shared-memory bank conflicts per load / store request, issue-slot utilisation %, and
    the top stall reason with its share of the stall reasons.
    """
    if not result:
        return MISSING
    rows = result.get("rungs", {})
    names = list(rungs) if rungs else [n for n in result.get("order", rows) if n in rows]
    wr = max([4] + [len(n) for n in names])
    wk = min(28, max([6] + [len(rows[n]["kernel"]) for n in names if n in rows]))
    head = (f"{'rung':{wr}s} {'kernel':{wk}s} {'regs':>4s} {'occ%':>5s} {'DRAM%':>5s} "
            f"{'DRAM MB':>8s} {'sect/req':>8s} {'s/L2 req':>8s} {'bank ld':>7s} {'bank st':>7s} "
            f"{'issue%':>6s}  top stall")
    lines = [f"Nsight Compute on {result.get('device', '?')}, {result.get('layer', '?')} "
             f"({result.get('date', '?')}, ncu {result.get('ncu') or '?'})", head]
    for n in names:
        r = rows.get(n)
        if r is None:
            why = result.get("errors", {}).get(n, "not profiled")
            lines.append(f"{n:{wr}s} {why}")
            continue
        stall = "-" if r.get("top_stall") is None else (
            f"{r['top_stall']} ({_fmt(100 * (r.get('top_stall_share') or 0), '.0f')}%)")
        mb = None if r.get("dram_bytes") is None else r["dram_bytes"] / 1e6
        lines.append(
            f"{n:{wr}s} {r['kernel'][:wk]:{wk}s} {_fmt(r.get('regs'), '4.0f')} "
            f"{_fmt(r.get('occupancy_pct'), '5.1f')} {_fmt(r.get('dram_pct'), '5.1f')} "
            f"{_fmt(mb, '8.1f')} {_fmt(r.get('sectors_per_request'), '8.2f')} "
            f"{_fmt(r.get('l2_sectors_per_request'), '8.2f')} "
            f"{_fmt(r.get('shared_ld_conflicts_per_request'), '7.2f')} "
            f"{_fmt(r.get('shared_st_conflicts_per_request'), '7.2f')} "
            f"{_fmt(r.get('issue_pct'), '6.1f')}  {stall}")
    return "\n".join(lines)


def main(argv) -> int:
    """``python -m convlab profile [--rungs a,b] [--layer resnet128] [--out DIR]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="convlab profile", description=(
        "Run every conv ladder rung once under Nsight Compute (ncu), print the table and "
        "write DIR/h200_profile.json (the file convlab/results/ keeps for learners)."))
    ap.add_argument("--rungs", default=None, help="comma-separated rungs (default: all)")
    ap.add_argument("--layer", default="resnet128", help="a layer of convlab.problems")
    ap.add_argument("--out", default=None, help="folder for h200_profile.json")
    ap.add_argument("--ncu", default="ncu", help="the ncu executable")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the ncu run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    rungs = [r for r in args.rungs.split(",") if r] if args.rungs else None
    if args.child:
        return _child(args.layer, rungs)
    try:
        res = profile_ladder(rungs, args.layer, args.out, args.ncu, args.timeout,
                             command="python -m convlab profile " + " ".join(argv))
    except Unsupported as e:
        print(f"convlab profile: cannot profile here: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, ValueError, subprocess.SubprocessError) as e:
        print(f"convlab profile: {e}", file=sys.stderr)
        return 1
    print(table(res, rungs))
    if res.get("errors"):
        print("not profiled:", res["errors"])
    if args.out:
        print(f"wrote {Path(args.out) / (RESULT + '.json')}")
    return 1 if res.get("errors") and not res.get("rungs") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

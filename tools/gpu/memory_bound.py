"""The memory-bound kernels against the copy: the 3x3 filter on 4096^2 and both depthwise
layers, CUDA C (filter03_cuda, depthwise03_cuda, 04_strips, 05_window) over a few tilings
beside the Numba kernels (the best ones' defaults, the window kernel over a few tilings),
PyTorch, and a device-to-device copy of the same bytes in the same run.

    COMMIT=<tree> python3 tools/gpu/memory_bound.py   # table last; $OUT/<card>_memory_bound.json
    ONLY=filter python3 tools/gpu/memory_bound.py   # some sections: filter, dw512, dw32

Every variant is checked against float64 (poisoned output first), then timed with
`bench.time_gpu_queued` (launches queued behind a spin kernel, warm-up, median of 7
groups of 20). GB/s count the compulsory bytes: the filter reads the image once and
writes the output once (as lessons04_06.filter_4096); the depthwise layers move x + w + y
and rotate over enough buffer sets (> 200 MB) to miss the L2 (as lessons10_11.depthwise).
% of copy: of `bench.copy_bandwidth()` (the best copy of a 2 GiB buffer).
"""

import json
import os
import sys
import time

import numpy as np

import convlab

convlab.setup()
from numba import cuda  # noqa: E402

from convlab import baselines, bench, check, ladder, problems  # noqa: E402
from convlab import reference as ref  # noqa: E402
from convlab.kernels import (  # noqa: E402
    depthwise02_smem,
    depthwise03_cuda,
    depthwise04_strips_cuda,
    depthwise05_window_cuda,
    depthwise06_window,
    filter02_tiled,
    filter03_cuda,
)
from convlab.measure import harness  # noqa: E402

GAUSS = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16
FILTER_CONFIGS = [filter03_cuda.DEFAULT, *(dict(v=v, warps=w, pf=pf, minb=mb, alt=alt)
                                           for v, w, pf, mb, alt in (
    (16, 4, 2, 0, 1), (16, 4, 2, 0, 0), (8, 4, 2, 0, 1), (4, 4, 2, 0, 1), (4, 4, 6, 1, 1),
    (3, 8, 5, 0, 1), (2, 8, 2, 0, 1), (2, 8, 4, 0, 0), (2, 4, 4, 0, 1), (2, 16, 4, 0, 1),
    (1, 8, 3, 0, 1)))]
DW_CONFIGS = {  # per_sm: persistent blocks (at most what fits at once)
    "dw512": [{}, dict(g=4), dict(g=16), dict(g=24), dict(g=8, v=14), dict(g=8, threads=128),
              dict(per_sm=4), dict(per_sm=3), dict(g=16, per_sm=2), dict(g=4, per_sm=8)],
    "dw32": [{}, dict(tp=8), dict(tp=28, v=7), dict(tp=32), dict(tp=16, v=4),
             dict(tp=16, threads=128), dict(per_sm=4), dict(per_sm=3), dict(tp=8, per_sm=8),
             dict(tp=32, per_sm=2)],
}
STRIP_CONFIGS = {"dw512": [{}],  # depthwise04_strips_cuda: {} is its default
                 "dw32": [{}, dict(v=2, warps=4, pf=4), dict(v=2, warps=8, pf=4),
                          dict(v=2, warps=8, pf=2), dict(v=8, warps=4, pf=2),
                          dict(v=3, warps=8, pf=5), dict(v=4, warps=8, pf=6),
                          dict(v=4, warps=7, pf=6), dict(v=4, warps=4, pf=8),
                          dict(v=7, warps=4, pf=6), dict(v=7, warps=8, pf=6),
                          dict(v=8, warps=7, pf=6), dict(v=14, warps=8, pf=6),
                          dict(v=16, warps=7, pf=8), dict(v=4, warps=4, pf=6, alt=0)]}
NUMBA_WINDOW_CONFIGS = [{}, dict(min_blocks=None), dict(threads=128), dict(v=8),
                        dict(v=8, min_blocks=4)]  # depthwise06_window; {}: the default
WINDOW_CONFIGS = [{}, dict(threads=128), dict(threads=512), dict(v=8), dict(v=8, threads=128),
                  dict(v=2), dict(u=2), dict(u=4), dict(cs_stores=1), dict(u=2, cs_stores=1),
                  dict(u=4, cs_stores=1), dict(v=8, cs_stores=1)]  # {}: the default
ABOUT = ("The 3x3 filter on 4096^2 and the two depthwise layers (b32 512ch 14x14, b32 32ch "
         "112x112): the CUDA C and Numba kernels over tilings, PyTorch, and a D2D copy of the same "
         "bytes, each checked against float64 before it was timed (queued launches, median); % of "
         "the best D2D copy of 2 GiB.")
T0 = time.time()
TABLE = []
OUT = os.environ.get("OUT", ".")  # where <card>_memory_bound.json goes


def queued(fn):
    """(median GPU time in us, spread: (p90 - p10) / median) of queued launches."""
    t = bench.time_gpu_queued(fn, calls=20, repeat=7)
    return t.median_ms * 1e3, t.spread


def shifted_sum(x64, w64, stride, pad):
    """float64 depthwise conv (N, C, H, W) * (C, 1, R, S) by shifted slices (fast on big
    inputs); checked against reference.conv2d on a small case below."""
    N, C, H, W = x64.shape
    R, S = w64.shape[2:]
    P, Q = ref.conv2d_output_shape((H, W), (R, S), stride, pad)
    xp = np.zeros((N, C, H + 2 * pad, W + 2 * pad))
    xp[:, :, pad:pad + H, pad:pad + W] = x64
    y = np.zeros((N, C, P, Q))
    for r in range(R):
        for s in range(S):
            y += w64[None, :, 0, r, s, None, None] * xp[:, :, r:r + stride * (P - 1) + 1:stride,
                                                        s:s + stride * (Q - 1) + 1:stride]
    return y


def _small_reference_agrees():
    rng = np.random.default_rng(0)
    x = check.random_array((2, 3, 9, 8), rng).astype(np.float64)
    w = check.random_array((3, 1, 3, 3), rng).astype(np.float64)
    for st in (1, 2):
        assert np.allclose(shifted_sum(x, w, st, 1), ref.conv2d(x, w, stride=st, padding=1,
                                                                 groups=3))


def row(section, name, timing, nbytes, copy, ok, **extra):
    us, spread = timing
    gbps = nbytes / (us * 1e-6) / 1e9
    r = dict(section=section, name=name, us=us, spread=spread, gbps=gbps,
             pct_copy=100 * gbps / copy, ok=ok, **extra)
    TABLE.append(r)
    print(f"  {section:6s} {name:34s} {us:8.1f} us {gbps:6.0f} GB/s {r['pct_copy']:5.1f}%",
          flush=True)
    return r


def timed(section, name, fn, read, expected, absref, nbytes, copy, **extra):
    """Check fn's output (`read()` after a poisoned run), then time it; a failure is a row."""
    try:
        fn()
        cuda.synchronize()
        comp = check.compare(read(), expected, absref, 9)
        if not comp.ok:
            raise check.CheckError(comp.summary())
        return row(section, name, queued(fn), nbytes, copy, True,
                   max_rel_err=comp.max_rel, **extra)
    except Exception as e:  # noqa: BLE001  (a variant that fails is data)
        TABLE.append(dict(section=section, name=name, ok=False, error=f"{type(e).__name__}: "
                                                                      f"{str(e)[:300]}"))
        print(f"  {section:6s} {name:34s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


def filter_section(copy):
    n = problems.image_size()
    rng = np.random.default_rng(3)
    img = check.random_array((n, n), rng)
    i64 = img.astype(np.float64)
    expected = shifted_sum(i64[None, None], GAUSS.astype(np.float64)[None, None], 1, 1)[0, 0]
    absref = shifted_sum(np.abs(i64)[None, None], GAUSS.astype(np.float64)[None, None],
                         1, 1)[0, 0]
    small = check.random_array((37, 45), rng)
    assert np.allclose(shifted_sum(small.astype(np.float64)[None, None],
                                   GAUSS.astype(np.float64)[None, None], 1, 1)[0, 0],
                       ref.filter2d(small.astype(np.float64), GAUSS.astype(np.float64)))
    nbytes = 2 * img.nbytes
    d_img, d_out = cuda.to_device(img), cuda.device_array((n, n), np.float32)
    d_taps = cuda.to_device(GAUSS)

    def read():
        return d_out.copy_to_host()

    def poison():
        d_out.copy_to_device(check.poisoned((n, n)))

    variants = [(f"filter03_cuda v{c['v']} w{c['warps']} pf{c['pf']} mb{c['minb']} "
                 f"alt{c['alt']}"
                 + (" (default)" if c == filter03_cuda.DEFAULT else ""),
                 lambda c=c: filter03_cuda.launch(d_img, GAUSS, d_out, **c), c)
                for c in FILTER_CONFIGS]
    variants.append(("filter02_tiled default (Numba)", lambda: filter02_tiled.launch(
        d_img, d_taps, d_out, taps=GAUSS, **filter02_tiled.TILE), filter02_tiled.TILE))
    # the window kernel runs the filter as a depthwise layer of one plane (N = C = 1)
    d_img4, d_out4 = d_img.reshape(1, 1, n, n), d_out.reshape(1, 1, n, n)
    d_w4 = cuda.to_device(GAUSS[None, None])
    for mod, configs, tag in ((depthwise05_window_cuda, ({}, dict(u=2), dict(v=8),
                                                         dict(cs_stores=1)), ""),
                              (depthwise06_window, ({}, dict(min_blocks=6)), " (Numba)")):
        for c in configs:
            t = {**mod.DEFAULT, **c}
            variants.append((mod.__name__.rsplit(".", 1)[-1] + " "
                             + " ".join(f"{k}{v}" for k, v in t.items()) + " (as a filter)"
                             + tag, lambda c=c, m=mod: m.launch(d_img4, d_w4, d_out4, 1, 1, 1,
                                                                1, **c), t))
    for name, fn, cfg in variants:
        poison()
        timed("filter", name, fn, read, expected, absref, nbytes, copy, config=cfg)
    d_copy = cuda.device_array((n, n), np.float32)
    row("filter", "copy same bytes (D2D)", queued(lambda: d_copy.copy_to_device(d_img)),
        nbytes, copy, True)


def depthwise_section(layer, copy, torch):
    prob = problems.depthwise_layer(layer)
    C = prob.C
    rng = np.random.default_rng(11)
    x = check.random_array(prob.x_shape, rng)
    w = check.random_array(prob.w_shape, rng)
    expected = shifted_sum(x.astype(np.float64), w.astype(np.float64), 1, 1)
    absref = shifted_sum(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), 1, 1)
    out_shape = expected.shape
    nbytes = x.nbytes + w.nbytes + expected.size * 4
    nsets = max(2, int(np.ceil(200e6 / nbytes)))
    dxs = [cuda.to_device(x) for _ in range(nsets)]
    dys = [cuda.device_array(out_shape, np.float32) for _ in range(nsets)]
    dwt = cuda.to_device(w)
    state = [0]

    def rotating(call):
        def f():
            i = state[0] % nsets
            state[0] += 1
            call(i)
        return f

    def read():
        return dys[(state[0] - 1) % nsets].copy_to_host()  # the set the last call wrote

    sec = layer
    for mod, configs, tag in ((depthwise03_cuda, DW_CONFIGS[layer], ""),
                              (depthwise04_strips_cuda, STRIP_CONFIGS[layer], ""),
                              (depthwise05_window_cuda, WINDOW_CONFIGS, ""),
                              (depthwise06_window, NUMBA_WINDOW_CONFIGS, " (Numba)")):
        name = mod.__name__.rsplit(".", 1)[-1]
        for cfg in configs:
            try:  # the tiling the launcher settles on: its plan's, else its defaults and cfg
                t = mod.plan(dxs[0], dwt, dys[0], 1, 1, 1, C, **{**getattr(mod, "DEFAULT", {}),
                                                                  **cfg})[-1]
                t = t if isinstance(t, dict) else {**mod.DEFAULT, **cfg}
                label = f"{name} " + " ".join(f"{k}{v}" for k, v in t.items())
            except Exception as e:  # noqa: BLE001  (timed() records the failure)
                t, label = cfg, f"{name} {cfg} ({type(e).__name__})"
            for d in dys:
                d.copy_to_device(check.poisoned(out_shape))
            timed(sec, label + (" (default)" if not cfg else "") + tag, rotating(
                lambda i, c=cfg, m=mod: m.launch(dxs[i], dwt, dys[i], 1, 1, 1, C, **c)),
                read, expected, absref, nbytes, copy, config=t, rotating_sets=nsets)
    for d in dys:
        d.copy_to_device(check.poisoned(out_shape))
    timed(sec, "depthwise02_smem default (Numba)", rotating(lambda i: depthwise02_smem.launch(
        dxs[i], dwt, dys[i], 1, 1)), read, expected, absref, nbytes, copy, rotating_sets=nsets)
    if torch is not None:
        F = torch.nn.functional
        txs = [torch.as_tensor(d, device="cuda") for d in dxs]
        tw = torch.as_tensor(dwt, device="cuda")
        hold = {}

        def read_t():
            return hold["y"].cpu().numpy()

        kernels = baselines.library_kernels(lambda: F.conv2d(txs[0], tw, padding=1, groups=C))
        timed(sec, "PyTorch conv2d (groups=C)", rotating(lambda i: hold.__setitem__(
            "y", F.conv2d(txs[i], tw, padding=1, groups=C))), read_t, expected, absref, nbytes,
            copy, rotating_sets=nsets, library_kernels=kernels)
        del txs
    M = min(nbytes // 8, x.size)
    srcs = [d.reshape(d.size)[:M] for d in dxs]
    dcs = [cuda.device_array(M, np.float32) for _ in range(nsets)]
    row(sec, "copy same bytes (D2D)", queued(rotating(lambda i: dcs[i].copy_to_device(
        srcs[i]))), 8 * M, copy, True, rotating_sets=nsets)


def save(copy):
    """Write what has been measured so far (each section adds to it; a step cut off by its time
    limit keeps the sections that finished)."""
    name = getattr(cuda.get_current_device(), "name", "unknown")
    env = ladder.environment()
    res = dict(environment=env,
               run=dict(date=env["date"], commit=harness.commit() or "unknown",
                        command="python3 tools/gpu/memory_bound.py",
                        clock="cuda events (queued launches, median)"),
               about=ABOUT, copy_gbps=copy,
               device=name.decode() if isinstance(name, bytes) else str(name),
               seconds=time.time() - T0, rows=TABLE)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{harness.card_prefix(res['device'])}_memory_bound.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    return path


def main():
    _small_reference_agrees()
    copy = bench.copy_bandwidth(repeat=5)
    print(f"copy bandwidth (best D2D of 2 GiB): {copy:.0f} GB/s", flush=True)
    torch = baselines.set_torch_precision("fp32") if baselines.torch_available() else None
    only = os.environ.get("ONLY", "filter,dw512,dw32").split(",")  # the sections to run
    sections = {"filter": lambda: filter_section(copy),
                "dw512": lambda: depthwise_section("dw512", copy, torch),
                "dw32": lambda: depthwise_section("dw32", copy, torch)}
    path = None  # (no section named in ONLY: nothing written)
    for name, run in sections.items():
        if name in only:
            run()
            path = save(copy)
            print(f"({time.time() - T0:.0f} s)", flush=True)
    print(f"\n{'section':6s} {'variant':44s} {'us':>8s} {'GB/s':>6s} {'% copy':>7s}")
    for r in TABLE:
        if r.get("ok"):
            print(f"{r['section']:6s} {r['name']:44s} {r['us']:8.1f} {r['gbps']:6.0f} "
                  f"{r['pct_copy']:6.1f}%")
        else:
            print(f"{r['section']:6s} {r['name']:44s} FAILED {r.get('error', '')[:60]}")
    for sec, mine in (("filter", "filter03_cuda"), ("dw512", "depthwise0"),
                      ("dw32", "depthwise0")):
        rows = [r for r in TABLE if r["section"] == sec and r.get("ok")]
        best = max((r for r in rows if r["name"].startswith(mine)), key=lambda r: r["gbps"],
                   default=None)
        same = next((r for r in rows if r["name"].startswith("copy same bytes")), None)
        if best and same:
            print(f"best {sec}: {best['name']}: {best['pct_copy']:.1f}% of copy, "
                  f"{100 * best['gbps'] / same['gbps']:.1f}% of the same-bytes copy")
    print(f"copy {copy:.0f} GB/s; {time.time() - T0:.0f} s; {path}")


if __name__ == "__main__":
    main()
    # With Numba, CuPy and PyTorch in one process, the interpreter's exit ended with "double
    # free or corruption" (rc 134) after everything above was written and printed: leave
    # without the exit handlers, so the step's rc says whether the measurement ran.
    sys.stdout.flush()
    os._exit(0)

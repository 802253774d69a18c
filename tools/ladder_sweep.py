"""Check and time every conv-ladder variant on the three race layers, on a real GPU.

    . tools/device_env.sh; python3 tools/ladder_sweep.py $OUT

Writes $OUT/sweep.json (every variant: ms, TFLOP/s, max rel err, registers) and prints
a table per layer. Each variant is checked against PyTorch's float64 conv on the GPU
before it is timed; cuDNN fp32 (TF32 off, with the algorithm it ran) and cuBLAS on the
same GEMM shape are timed in the same run.
"""

import json
import os
import sys
import time
import traceback

import convlab

convlab.setup("gpu")
import numpy as np  # noqa: E402
import torch  # noqa: E402

from convlab import baselines, bench, check, ladder, problems  # noqa: E402
from convlab.kernels import conv01_naive as c1  # noqa: E402
from convlab.kernels import conv02_coalesced as c2  # noqa: E402
from convlab.kernels import conv03_tiled as c3  # noqa: E402
from convlab.kernels import conv04_register_blocked as c4  # noqa: E402
from convlab.kernels import conv05_implicit_gemm as c5  # noqa: E402
from convlab.kernels import conv06_implicit_gemm_double_buffered as c6  # noqa: E402
from convlab.kernels import conv07_implicit_gemm_warp_tiled as c7  # noqa: E402
from convlab.kernels import conv09_implicit_gemm_cuda as c9  # noqa: E402
from convlab.runtime import cuda  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
ONLY = os.environ.get("SWEEP_ONLY", "")
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def variants(prob):
    v = [("naive", c1.conv2d_naive), ("coalesced", c2.conv2d_coalesced)]
    for kpt, cb in ((1, 4), (1, 8), (4, 4)):
        v.append((f"tiled k{kpt} c{cb}",
                  lambda x, w, o, kpt=kpt, cb=cb, **kw: c3.launch(x, w, o, kpt=kpt, cb=cb, **kw)))
    for kpt, pix, cb in ((16, 4, 2), (16, 4, 4), (8, 4, 2), (16, 2, 4)):
        v.append((f"regblk k{kpt} p{pix} c{cb}",
                  lambda x, w, o, kpt=kpt, pix=pix, cb=cb, **kw:
                  c4.launch(x, w, o, kpt=kpt, pix=pix, cb=cb, **kw)))
    cfgs = [
        c5.Config(64, 128, 8), c5.Config(64, 128, 16), c5.Config(64, 64, 8, 4, 4),
        c5.Config(64, 64, 16, 4, 4), c5.Config(64, 64, 8), c5.Config(64, 64, 16),
        c5.Config(32, 64, 8, 4, 4), c5.Config(32, 64, 16, 4, 4)]
    for label, mod in (("igemm", c5), ("dbuf", c6), ("warp", c7)):
        for cfg in cfgs:
            v.append((f"{label} {cfg}", mod.launcher_for(cfg)))
        v.append((f"{label} default", getattr(mod, "conv2d_implicit_gemm" + {
            "igemm": "", "dbuf": "_double_buffered", "warp": "_warp_tiled"}[label])))
    v.append(("cuda default", c9.conv2d_implicit_gemm_cuda))
    return v


def main():
    res = dict(date=time.strftime("%Y-%m-%d %H:%M"), device=torch.cuda.get_device_name(),
               versions=dict(torch=torch.__version__, numpy=np.__version__), layers={})
    t0 = time.time()
    try:
        if os.environ.get("SKIP_CEIL"):
            raise RuntimeError("ceilings skipped")
        res["ceilings"] = bench.measure_ceilings()
        print("ceilings", {k: v for k, v in res["ceilings"].items() if k != "copy_tried"},
              f"({time.time() - t0:.0f} s)", flush=True)
        print("copies", res["ceilings"]["copy_tried"], flush=True)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    c = cuda()
    for key in ("resnet64", "resnet128", "resnet256"):
        prob = problems.conv_layer(key)
        rng = np.random.default_rng(1)
        x = check.random_array(prob.x_shape, rng)
        w = check.random_array(prob.w_shape, rng)
        tx, tw = torch.from_numpy(x).cuda().double(), torch.from_numpy(w).cuda().double()
        exp = torch.nn.functional.conv2d(tx, tw, padding=1).cpu().numpy()
        absref = torch.nn.functional.conv2d(tx.abs(), tw.abs(), padding=1).cpu().numpy()
        red = prob.C * 9
        xd, wd = c.to_device(x), c.to_device(w)
        rows = {}
        for name, fn in variants(prob):
            if ONLY and not any(s in name for s in ONLY.split(",")):
                continue
            t1 = time.time()
            try:
                out = c.to_device(check.poisoned(exp.shape))
                fn(xd, wd, out, padding=1)
                c.synchronize()
                comp = check.compare(out.copy_to_host(), exp, absref, red)
                if not comp.ok:
                    rows[name] = dict(error="WRONG: " + comp.summary()[:200])
                    print(f"  {name:<28} WRONG {comp.summary()[:100]}", flush=True)
                    continue
                tm = bench.time_gpu(fn, xd, wd, out, padding=1, repeat=9)
                rows[name] = dict(ms=tm.median_ms, spread=tm.spread,
                                  tflops=tm.tflops(prob.flops), max_rel=comp.max_rel,
                                  secs=time.time() - t1)
                print(f"  {name:<28} {tm.median_ms:8.4f} ms {tm.tflops(prob.flops):6.2f} TF/s"
                      f"  ({time.time() - t1:.1f} s)", flush=True)
            except Exception as e:  # noqa: BLE001
                rows[name] = dict(error=f"{type(e).__name__}: {e}"[:300])
                print(f"  {name:<28} ERROR {type(e).__name__}: {str(e)[:150]}", flush=True)
        # libraries: cuDNN fp32 timed, what it ran, cuBLAS on the same GEMM shape
        impl = baselines.cudnn_conv_impl(prob, "fp32")
        state = impl.prepare(x, w)
        ms = bench.time_gpu(impl.run, state, repeat=15).median_ms
        facts = ladder.library_facts(prob)
        rows["cuDNN fp32"] = dict(ms=ms, tflops=prob.flops / ms / 1e9, **facts["cudnn_fp32"])
        rows["cuBLAS same GEMM"] = facts["same_gemm"]
        print(f"  cuDNN fp32 {ms:.4f} ms ({rows['cuDNN fp32']['algorithm']}) "
              f"cuBLAS same GEMM {facts['same_gemm']['ms']:.4f} ms", flush=True)
        res["layers"][key] = rows
        json.dump(res, open(os.path.join(OUT, "sweep.json"), "w"), indent=1)
        print(f"{key} done ({time.time() - t0:.0f} s)", flush=True)
    # short table last
    print("\nvariant                       " + "  ".join(f"{k:>10}" for k in res["layers"]))
    names = list(next(iter(res["layers"].values())))
    for n in names:
        cells = []
        for k in res["layers"]:
            r = res["layers"][k].get(n, {})
            cells.append(f"{r['ms']:10.4f}" if "ms" in r else f"{'err':>10}")
        print(f"{n:<30}" + "  ".join(cells))


if __name__ == "__main__":
    main()

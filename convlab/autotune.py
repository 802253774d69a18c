"""Autotuning: try tile shapes, check each, time each, keep the best.

A kernel factory (``make_launcher(config)``) and a list of candidate configurations go
in; every candidate is compiled, checked against a float64 reference on the problem's
own random inputs (a wrong kernel is reported and never timed), timed with CUDA events
(`bench.time_gpu`), and the fastest correct one comes back with the whole table.

    from convlab import autotune, problems
    from convlab.kernels import conv07_implicit_gemm_pipelined as c7
    res = autotune.tune(c7.launcher_for, c7.CANDIDATES, problems.conv_layer("resnet128"))
    res.best, res.table()

Under the simulator nothing can be timed: `tune` checks the candidates (on tiny
problems) and returns them untimed (``Result.timed`` is False, ``best`` is None);
`stored` returns the choices made on the H200 (convlab/results/h200.json), which
`conv08_implicit_gemm_tuned` and `conv09_implicit_gemm_cuda` use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import bench, check
from . import reference as ref


@dataclass
class Trial:
    config: object
    ok: bool
    ms: float | None = None
    tflops: float | None = None
    max_rel_err: float | None = None
    error: str | None = None


@dataclass
class Result:
    problem: str
    trials: list = field(default_factory=list)
    timed: bool = True

    @property
    def best(self):
        timed = [t for t in self.trials if t.ok and t.ms is not None]
        return min(timed, key=lambda t: t.ms).config if timed else None

    def table(self) -> str:
        lines = [self.problem, f"{'config':<34}{'ms':>9}{'TFLOP/s':>9}{'rel err':>9}"]
        if not self.timed:
            lines.insert(1, "(simulator: checked, not timed)")
        for t in sorted(self.trials, key=lambda t: (t.ms is None, t.ms or 0)):
            if t.ok and t.ms is not None:
                lines.append(f"{str(t.config):<34}{t.ms:9.4f}{t.tflops:9.2f}"
                             f"{t.max_rel_err:9.1e}")
            elif t.ok:
                lines.append(f"{str(t.config):<34}{'correct':>9}{'':>9}{t.max_rel_err:9.1e}")
            else:
                lines.append(f"{str(t.config):<34}  {t.error or 'failed'}"[:120])
        return "\n".join(lines)


def tune(make_launcher: Callable, configs, problem, *, seed: int = 0, repeat: int = 10,
         verbose: bool = False) -> Result:
    """Check then time ``make_launcher(cfg)`` for every cfg on `problem` (a ConvProblem)."""
    from .runtime import cuda, is_simulator

    c = cuda()
    rng = np.random.default_rng(seed)
    x = check.random_array(problem.x_shape, rng)
    w = check.random_array(problem.w_shape, rng)
    kw = problem.kwargs
    expected = ref.conv2d_im2col(x.astype(np.float64), w.astype(np.float64), **kw)
    absref = ref.conv2d_im2col(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), **kw)
    red = ref.conv_params(x.shape, w.shape, **kw).reduction
    xd, wd = c.to_device(x), c.to_device(w)
    res = Result(str(problem))
    for cfg in configs:
        trial = Trial(cfg, False)
        res.trials.append(trial)
        try:
            launch = make_launcher(cfg)
            out = c.to_device(check.poisoned(problem.out_shape))
            launch(xd, wd, out, **kw)
            c.synchronize()
            comp = check.compare(out.copy_to_host(), expected, absref, red)
            trial.max_rel_err = comp.max_rel
            if not comp.ok:
                trial.error = "wrong: " + comp.summary()
                continue
            trial.ok = True
            if is_simulator():
                continue
            t = bench.time_gpu(launch, xd, wd, out, repeat=repeat, **kw)
            trial.ms, trial.tflops = t.median_ms, t.tflops(problem.flops)
        except Exception as e:  # noqa: BLE001  (a config that cannot run is one row of the table)
            trial.error = f"{type(e).__name__}: {e}"
        if verbose:
            print(f"  {cfg}: " + (f"{trial.ms:.4f} ms" if trial.ms else str(trial.error)))
    res.timed = not is_simulator()
    return res


def problem_key(p) -> str:
    """A layer's shape as a lookup key: 'N,C,H,W,K,R,S/stride/padding/dilation'."""
    return (f"{p.N},{p.C},{p.H},{p.W},{p.K},{p.R},{p.S}/{p.stride[0]},{p.stride[1]}/"
            f"{p.padding[0]},{p.padding[1]}/{p.dilation[0]},{p.dilation[1]}")


def stored(family: str, name: str = "h200") -> dict:
    """The tile shapes chosen on a real GPU: problem_key -> config dict (may be empty).

    From convlab/results/<name>.json, or from the JSON file named by the environment
    variable CONVLAB_TUNED (a fresh tuning run, before it is committed).
    """
    import json
    import os

    path = os.environ.get("CONVLAB_TUNED")
    try:
        data = json.loads(open(path).read()) if path else bench.stored_results(name)
    except (FileNotFoundError, ValueError):
        return {}
    return dict(data.get("tuned", {}).get(family, {}))

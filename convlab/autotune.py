"""Autotuning: try tile shapes, check each, time each, keep the best.

A kernel factory (``make_launcher(config)``) and a list of candidate configurations go
in; every candidate is compiled, checked against a float64 reference on the problem's
own random inputs (a wrong kernel is reported and never timed), timed with CUDA events
(`bench.time_gpu`), and the fastest correct one comes back with the whole table.

    from convlab import autotune, problems
    from convlab.kernels import conv07_implicit_gemm_warp_tiled as c7
    res = autotune.tune(c7.launcher_for, c7.CANDIDATES, problems.conv_layer("resnet128"))
    res.best, res.table()

Numba compiles one kernel at a time per process, so a long candidate list compiles in
parallel: ``tune(..., workers=4)`` spreads the candidates over 4 processes, each compiling
and checking its share while the others do, then timing them while it holds a lock that
lets only one process use the GPU at a time (the timings never overlap).

Under the simulator nothing can be timed: `tune` checks the candidates (on tiny
problems) and returns them untimed (``Result.timed`` is False, ``best`` is None);
`stored` returns the choices made on the H200 (convlab/results/h200.json, read by
`convlab.results.tuned`, which `conv08_implicit_gemm_tuned` and `conv09_implicit_gemm_cuda`
use).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import bench, check, results
from . import reference as ref


@dataclass
class Trial:
    config: object
    ok: bool
    ms: float | None = None
    tflops: float | None = None
    max_rel_err: float | None = None
    error: str | None = None
    regs: int | None = None        # registers per thread, where the launcher tells
    host_us: float | None = None   # Python time per call (launch cost), when timed
    spread: float | None = None


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
         verbose: bool = False, workers: int = 1, clock=None):
    """Check then time ``make_launcher(cfg)`` for every cfg on `problem` (a ConvProblem);
    a `Result`. With a list of problems: one Result per problem, each config compiled once.

    workers > 1: compile and check in that many processes at once (spawned; make_launcher
    and the configs must pickle: a module-level function, dataclass configs), timing one
    process at a time. clock: an object whose ``time_gpu(fn, *args, repeat=, **kw)``
    returns a `bench.Timing` (`convlab.measure.FakeClock` for dry runs); default CUDA
    events, and under the simulator no timing at all.
    """
    from .runtime import is_simulator

    probs = list(problem) if isinstance(problem, list | tuple) else [problem]
    configs = list(configs)
    workers = max(1, min(workers, len(configs)))
    if workers == 1:
        per_problem = _trials(make_launcher, configs, probs, seed, repeat, clock, verbose)
    else:
        per_problem = _parallel(make_launcher, configs, probs, seed, repeat, clock, verbose,
                                workers)
    timed = clock is not None or not is_simulator()
    res = [Result(str(p), trials, timed=timed) for p, trials in zip(probs, per_problem,
                                                                     strict=True)]
    return res if isinstance(problem, list | tuple) else res[0]


def _case(problem, seed):
    """Device inputs, float64 reference, |reference| and reduction length of `problem`."""
    from .runtime import cuda

    c = cuda()
    rng = np.random.default_rng(seed)
    case = check.reference_case(check.random_array(problem.x_shape, rng),
                                check.random_array(problem.w_shape, rng), op=ref.conv2d_im2col,
                                **problem.kwargs)
    x, w = case["inputs"]
    return c.to_device(x), c.to_device(w), case["expected"], case["absref"], case["reduction"]


def _trials(make_launcher, configs, probs, seed, repeat, clock, verbose, lock=None) -> list:
    """Compile every config once and check it on every problem, then (holding `lock`, if
    any) time the good ones; a list of trials per problem."""
    from .runtime import cuda, is_simulator

    c = cuda()
    cases = [_case(p, seed) for p in probs]
    out_trials = [[] for _ in probs]
    ready = []
    for cfg in configs:
        try:
            launch, err = make_launcher(cfg), None
        except Exception as e:  # noqa: BLE001  (a config that cannot compile is one row)
            launch, err = None, f"{type(e).__name__}: {e}"
        for k, (prob, (xd, wd, expected, absref, red)) in enumerate(zip(probs, cases,
                                                                        strict=True)):
            trial = Trial(cfg, False, error=err)
            out_trials[k].append(trial)
            if launch is None:
                continue
            try:
                out = c.to_device(check.poisoned(prob.out_shape))
                launch(xd, wd, out, **prob.kwargs)
                c.synchronize()
                comp = check.compare(out.copy_to_host(), expected, absref, red)
                trial.max_rel_err = comp.max_rel
                if not comp.ok:
                    trial.error = "wrong: " + comp.summary()
                    continue
                trial.ok = True
                trial.regs = registers(launch)
                ready.append((trial, launch, prob, (xd, wd, out)))
            except Exception as e:  # noqa: BLE001  (a config that cannot run is one row)
                trial.error = f"{type(e).__name__}: {e}"
    timer = clock.time_gpu if clock is not None else None
    if timer is None and not is_simulator():
        timer = bench.time_gpu
    with lock if lock is not None else contextlib.nullcontext():
        for trial, launch, prob, args in ready if timer is not None else []:
            try:
                t = timer(launch, *args, repeat=repeat, **prob.kwargs)
                trial.ms, trial.tflops, trial.spread = (t.median_ms, t.tflops(prob.flops),
                                                        t.spread)
                if clock is None or not clock.fake:
                    trial.host_us = _host_us(launch, args, prob.kwargs)
            except Exception as e:  # noqa: BLE001
                trial.ok, trial.error = False, f"timing: {type(e).__name__}: {e}"
    if verbose:
        for prob, trials in zip(probs, out_trials, strict=True):
            for t in trials:
                print(f"  {prob.name} {t.config}: "
                      + (f"{t.ms:.4f} ms" if t.ms else str(t.error or "correct")))
    return out_trials


def registers(launch) -> int | None:
    """Registers per thread of a Numba launcher's kernel (None where it does not say)."""
    k = getattr(launch, "kernel", None)
    try:
        return int(max(k.get_regs_per_thread().values())) if k is not None else None
    except Exception:  # noqa: BLE001  (the simulator and CUDA C launchers cannot tell)
        return None


def _host_us(launch, args, kw, calls: int = 30) -> float:
    """Python time per call, no synchronization inside the loop (µs): when it approaches
    the GPU time, back-to-back timing measures the launcher, not the kernel."""
    from .runtime import cuda

    c = cuda()
    c.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        launch(*args, **kw)
    dt = time.perf_counter() - t0
    c.synchronize()
    return 1e6 * dt / calls


_LOCK = None


def _worker_init(mode: str, lock) -> None:
    """A fresh worker process: the same runtime as the parent (GPU or simulator), before
    anything imports numba; the lock that serializes timing."""
    global _LOCK
    from . import runtime

    runtime.setup(mode)
    _LOCK = lock


def _worker(make_launcher, configs, probs, seed, repeat, clock, verbose) -> list:
    return _trials(make_launcher, configs, probs, seed, repeat, clock, verbose, _LOCK)


def _parallel(make_launcher, configs, probs, seed, repeat, clock, verbose, workers) -> list:
    """`_trials` over `workers` spawned processes; trials come back in config order."""
    import concurrent.futures as cf
    import multiprocessing as mp

    from . import runtime

    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    shares = [list(range(i, len(configs), workers)) for i in range(workers)]
    trials = [[None] * len(configs) for _ in probs]
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init,
                                initargs=(runtime.mode(), lock)) as ex:
        futs = {ex.submit(_worker, make_launcher, [configs[i] for i in share], probs, seed,
                          repeat, clock, verbose): share for share in shares}
        for fut in cf.as_completed(futs):
            share = futs[fut]
            try:
                got = fut.result()
            except Exception as e:  # noqa: BLE001  (a worker that died: its configs fail)
                got = [[Trial(configs[i], False, error=f"worker: {type(e).__name__}: {e}")
                        for i in share] for _ in probs]
            for k, per in enumerate(got):
                for i, t in zip(share, per, strict=True):
                    trials[k][i] = t
    return trials


problem_key = results.problem_key


def stored(family: str, name: str = "h200") -> dict:
    """The tile shapes chosen on a real GPU: problem_key -> config dict (may be empty);
    see `convlab.results.tuned` (CONVLAB_TUNED names a fresh tuning file)."""
    return results.tuned(family, name)

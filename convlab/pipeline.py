"""Lesson 10: keep the CPU and the GPU busy at the same time.

The work: batches of real JPEG files (Grace Hopper's portrait from matplotlib's sample
data, re-encoded in memory at several sizes and qualities: nothing is downloaded) are
decoded and resized on the CPU, in threads, then sent to the GPU, which converts them to
normalized float NCHW, runs a 7x7 stride-2 convolution (the course's coalesced kernel of
lesson 05, 3 -> K channels), a ReLU and a global average pool, and sends back K features
per image.

Two ways to run the same work:

- `run_serial`: decode batch b, copy it (pageable memory), convolve, copy back, then
  batch b + 1. The GPU idles while the CPU decodes and the CPU idles while the GPU works.
- `run_overlapped`: while the GPU works on batch b, the CPU decodes batch b + 1. Each of
  two "slots" has its own pinned (page-locked) host buffers and device buffers; copies
  are asynchronous (`copy_to_device(..., stream=s)` returns at once, which only pinned
  memory allows). The GPU work goes into three streams, one per kind of work (copies in,
  compute, copies out), ordered by events, so the batches' kernels run first in, first
  out while a copy runs beside them. (Giving each slot its own stream instead lets two
  batches' kernels share the GPU, which delays the batch the CPU is waiting for: the
  H200 timeline of lesson 10 shows it.) The speed-up is at most
  (decode + GPU) / max(decode, GPU): 2x when both stages take as long.

Both record when each stage of each batch ran (`Span`s: host clocks for the CPU, CUDA
events for the GPU, placed on the host clock through an anchor event) for
`draw_timeline`. `MultiGpu` splits a batch across every visible GPU (one is fine) and
checks the result against one device.
"""

from __future__ import annotations

import io
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from .runtime import cuda, is_simulator

MEAN = np.array([0.485, 0.456, 0.406], np.float32)  # ImageNet's per-channel statistics
STD = np.array([0.229, 0.224, 0.225], np.float32)
STEM = dict(R=7, stride=2, padding=3)  # the GPU stage's convolution


# ----------------------------------------------------------------------------------------
# The CPU stage: JPEG files in memory, decoded in threads


def jpeg_corpus(n: int, seed: int = 0, scales=(1.0, 0.75, 1.25, 0.6),
                qualities=(75, 90, 95), distinct: int = 24) -> list:
    """n JPEG files (bytes) made from the sample photo: random crops, mirrored or not, at
    several scales (a 1.25 scale is 750x640) and qualities; at most `distinct` different
    files, repeated (decoding the same bytes twice costs the same)."""
    from PIL import Image

    from .images import _load_rgb

    rgb = Image.fromarray(_load_rgb())
    rng = np.random.default_rng(seed)
    files = []
    for i in range(min(n, distinct)):
        scale, q = scales[i % len(scales)], qualities[(i // len(scales)) % len(qualities)]
        W, H = rgb.size
        dx, dy = (int(v) for v in rng.integers(0, 48, 2))
        im = rgb.crop((dx, dy, W - 48 + dx, H - 48 + dy))
        if i % 2:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        im = im.resize((max(16, int(im.width * scale)), max(16, int(im.height * scale))),
                       Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=q)
        files.append(buf.getvalue())
    return [files[i % len(files)] for i in range(n)]


def decode(data: bytes, side: int, draft: bool = True) -> np.ndarray:
    """One JPEG -> (side, side, 3) uint8: centre square crop, bilinear resize.

    draft=True lets libjpeg decode at 1/2, 1/4 or 1/8 scale when the image is at least
    twice as large as needed (its DCT can drop the high frequencies before the inverse
    transform): far less work than decoding every pixel and throwing most away.
    """
    from PIL import Image

    im = Image.open(io.BytesIO(data))
    if draft:
        w, h = im.size
        s = min(w, h)
        im.draft("RGB", (max(side, int(side * w / s)), max(side, int(side * h / s))))
    im = im.convert("RGB")
    w, h = im.size
    s = min(w, h)
    im = im.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
    im = im.resize((side, side), Image.Resampling.BILINEAR)
    return np.asarray(im)


def decode_into(files: list, out: np.ndarray, pool: ThreadPoolExecutor | None = None,
                draft: bool = True) -> np.ndarray:
    """Decode len(files) JPEGs into out (B, side, side, 3) uint8, in the pool's threads
    (Pillow releases the GIL while it decodes and resizes, so threads run in parallel)."""
    side = out.shape[1]

    def one(i):
        out[i] = decode(files[i], side, draft)

    if pool is None:
        for i in range(len(files)):
            one(i)
    else:
        list(pool.map(one, range(len(files))))
    return out


def decode_threads(threads: int | None = None) -> int:
    """Threads for decoding: the given number, else one per CPU core (at most 16)."""
    return int(threads) if threads else max(1, min(16, os.cpu_count() or 1))


# ----------------------------------------------------------------------------------------
# The GPU stage

_K: dict = {}
nb_cuda = None  # numba.cuda once _kernels() ran: a global, so the simulator can swap it


def _kernels():
    global nb_cuda
    if _K:
        return _K
    nb_cuda = cuda()
    from numba import float32, uint32

    @nb_cuda.jit
    def u8_to_nchw(img, x, mean, std):
        # img (B, S, S, 3) uint8 NHWC -> x (B, 3, S, S) float32, normalized; thread x on
        # image columns, so a warp writes 32 neighbours of one row of one channel
        col = nb_cuda.blockIdx.x * nb_cuda.blockDim.x + nb_cuda.threadIdx.x
        row = nb_cuda.blockIdx.y * nb_cuda.blockDim.y + nb_cuda.threadIdx.y
        b = nb_cuda.blockIdx.z
        S = x.shape[2]
        if row < S and col < S:
            for ch in range(3):
                v = float32(img[b, row, col, ch]) * float32(1.0 / 255.0)
                x[b, ch, row, col] = (v - mean[ch]) / std[ch]

    @nb_cuda.jit
    def relu_mean(y, feat):
        # one block per (image, channel): mean of max(y, 0) over the plane, tree reduction
        nk = nb_cuda.blockIdx.x
        K = y.shape[1]
        n, k = nk // K, nk % K
        PQ = uint32(y.shape[2] * y.shape[3])
        Q = uint32(y.shape[3])
        part = nb_cuda.shared.array(128, float32)
        t = uint32(nb_cuda.threadIdx.x)
        nt = uint32(nb_cuda.blockDim.x)
        acc = float32(0.0)
        i = t
        while i < PQ:
            acc += max(y[n, k, i // Q, i % Q], float32(0.0))
            i += nt
        part[t] = acc
        nb_cuda.syncthreads()
        step = nt // uint32(2)
        while step > 0:
            if t < step:
                part[t] += part[t + step]
            nb_cuda.syncthreads()
            step //= uint32(2)
        if t == 0:
            feat[n, k] = part[0] / float32(PQ)

    _K.update(u8_to_nchw=u8_to_nchw, relu_mean=relu_mean)
    return _K


def stem_weights(k: int, seed: int = 0) -> np.ndarray:
    """The GPU stage's conv filters (k, 3, 7, 7), random but fixed by the seed."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((k, 3, STEM["R"], STEM["R"])) / math.sqrt(3 * 49)).astype(
        np.float32)


def stem_out_side(side: int) -> int:
    return (side + 2 * STEM["padding"] - STEM["R"]) // STEM["stride"] + 1


class GpuStage:
    """uint8 NHWC batch on the device -> float NCHW -> conv 7x7/2 (3 -> k) -> ReLU ->
    global average pool -> (batch, k) features, all queued on one stream.

    The conv is the course's coalesced direct kernel (lesson 05), launched on the given
    stream (its launcher uses the default stream, which would wait for every other
    stream). Owns its intermediate buffers, so two stages can run at the same time.
    """

    def __init__(self, batch: int, side: int, k: int, seed: int = 0):
        from .kernels import conv02_coalesced

        c = cuda()
        self.batch, self.side, self.k = batch, side, k
        self.P = stem_out_side(side)
        self.w = stem_weights(k, seed)
        self.d_w = c.to_device(self.w)
        self.d_x = c.device_array((batch, 3, side, side), np.float32)
        self.d_y = c.device_array((batch, k, self.P, self.P), np.float32)
        self.d_mean, self.d_std = c.to_device(MEAN), c.to_device(STD)
        self._conv = conv02_coalesced.make_kernel(STEM["R"], STEM["R"])
        # the simulator pays per thread, idle or not: small blocks there
        sim = is_simulator()
        self._block = 32 if sim else conv02_coalesced.THREADS
        self._u8_block = (8, 4) if sim else (32, 8)
        self.pool_threads = 8 if sim else 128

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.k * self.P * self.P * 3 * STEM["R"] ** 2

    def run(self, d_u8, d_feat, stream=0):
        """Queue the whole stage on `stream` (returns at once on a GPU)."""
        k = _kernels()
        B, S = self.batch, self.side
        ux, uy = self._u8_block
        k["u8_to_nchw"][(math.ceil(S / ux), math.ceil(S / uy), B), self._u8_block, stream](
            d_u8, self.d_x, self.d_mean, self.d_std)
        st, pad, i32 = STEM["stride"], STEM["padding"], np.int32
        C, P, bt = self.d_x.shape[1], self.P, self._block
        args = [i32(v) for v in (C, S, S, self.k, P, P, st, st, pad, pad, 1, 1)]
        self._conv[(math.ceil(P * P / bt), self.k, B), bt, stream](
            self.d_x.reshape(self.d_x.size), self.d_w.reshape(self.d_w.size),
            self.d_y.reshape(self.d_y.size), *args)
        k["relu_mean"][B * self.k, self.pool_threads, stream](self.d_y, d_feat)


def reference_features(u8: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The GPU stage on the CPU in float64: normalize, conv 7x7/2, ReLU, mean."""
    from . import reference as ref

    x = (u8.astype(np.float64) / 255.0 - MEAN) / STD  # B S S 3
    x = x.transpose(0, 3, 1, 2)
    y = ref.conv2d(x, w.astype(np.float64), stride=STEM["stride"], padding=STEM["padding"])
    return np.maximum(y, 0).mean(axis=(2, 3))


def check_features(u8, w, feats, images: int = 2, rtol: float = 1e-4) -> float:
    """Compare the first `images` feature rows with the float64 reference; return the max
    relative error (relative to the largest |feature|) or raise AssertionError."""
    exp = reference_features(u8[:images], w)
    got = np.asarray(feats[:images], np.float64)
    if not np.isfinite(got).all():
        raise AssertionError("the GPU stage produced NaN/Inf features")
    err = float(np.abs(got - exp).max() / max(np.abs(exp).max(), 1e-30))
    if not err <= rtol:
        raise AssertionError(f"GPU features differ from the reference: max rel err {err:.2e} "
                             f"> {rtol:.0e}")
    return err


# ----------------------------------------------------------------------------------------
# Running the pipeline, serially and overlapped


@dataclass
class Span:
    """Stage `lane` of batch `batch` ran from `start` to `end` (seconds, host clock)."""

    lane: str
    batch: int
    start: float
    end: float


@dataclass
class RunResult:
    name: str
    images: int
    seconds: float
    spans: list = field(default_factory=list)
    features: np.ndarray | None = field(default=None, repr=False)

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds

    def summary(self) -> dict:
        return dict(name=self.name, images=self.images, seconds=self.seconds,
                    images_per_s=self.images_per_s)

    def spans_dict(self) -> list:
        t0 = min(s.start for s in self.spans) if self.spans else 0.0
        return [dict(asdict(s), start=s.start - t0, end=s.end - t0) for s in self.spans]


def _batches(files: list, batch: int) -> list:
    return [files[i:i + batch] for i in range(0, len(files), batch)]


def run_serial(files: list, stage: GpuStage, threads: int | None = 1, draft: bool = True,
               name: str | None = None) -> RunResult:
    """Decode, copy (pageable), compute, copy back, one batch after another."""
    c = cuda()
    B, S = stage.batch, stage.side
    host = np.empty((B, S, S, 3), np.uint8)  # ordinary (pageable) memory
    d_u8 = c.device_array((B, S, S, 3), np.uint8)
    d_feat = c.device_array((B, stage.k), np.float32)
    batches = _batches(files, B)
    feats = np.empty((len(batches) * B, stage.k), np.float32)
    spans = []
    pool = ThreadPoolExecutor(threads) if threads and threads > 1 else None
    c.synchronize()
    t_start = time.perf_counter()
    try:
        for b, chunk in enumerate(batches):
            t0 = time.perf_counter()
            decode_into(chunk, host[:len(chunk)], pool, draft)
            t1 = time.perf_counter()
            d_u8.copy_to_device(host)  # synchronous: returns when the copy is done
            t2 = time.perf_counter()
            stage.run(d_u8, d_feat)
            c.synchronize()
            t3 = time.perf_counter()
            feats[b * B:(b + 1) * B] = d_feat.copy_to_host()
            t4 = time.perf_counter()
            spans += [Span("CPU decode", b, t0, t1), Span("copy to GPU", b, t1, t2),
                      Span("GPU compute", b, t2, t3), Span("copy to CPU", b, t3, t4)]
    finally:
        if pool:
            pool.shutdown()
    seconds = time.perf_counter() - t_start
    label = name or f"serial ({threads or 1} decode thread{'s' if (threads or 1) > 1 else ''}" \
                    f"{', draft' if draft else ''})"
    return RunResult(label, len(files), seconds, spans, feats[:len(files)])


class _Slot:
    """One batch in flight: pinned host buffers, device buffers, a stream, events."""

    def __init__(self, stage: GpuStage):
        c = cuda()
        B, S, K = stage.batch, stage.side, stage.k
        self.stage = stage
        self.host = c.pinned_array((B, S, S, 3), np.uint8)
        self.host_feat = c.pinned_array((B, K), np.float32)
        self.d_u8 = c.device_array((B, S, S, 3), np.uint8)
        self.d_feat = c.device_array((B, K), np.float32)
        self.stream = c.stream()
        # copy in start/end, compute start/end, copy out start/end
        self.events = [c.event() for _ in range(6)]
        self.host_marks: list = []
        self.batch = None


def run_overlapped(files: list, stages: list, threads: int | None = None, draft: bool = True,
                   name: str | None = None, streams: str = "by-kind") -> RunResult:
    """The same work with the CPU decoding batch b + 1 while the GPU works on batch b.

    stages: one GpuStage per slot (two: double buffering). Each slot has pinned host
    buffers (the copies must be asynchronous) and its own device buffers; before the CPU
    decodes into a slot it waits until the slot's previous batch has left the GPU.

    streams: 'by-kind' (default): one stream for copies in, one for compute, one for copies
    out, ordered by events: the batches' kernels run one batch after another (first in,
    first out) while the next batch's copy can run beside them. 'per-slot': each slot
    queues all its work into its own stream; then two batches' kernels may share the GPU,
    which delays the older batch, the one the CPU waits for (measured on the H200 in
    lesson 10: the timeline shows it).
    """
    if streams not in ("by-kind", "per-slot"):
        raise ValueError(f"streams must be 'by-kind' or 'per-slot', got {streams!r}")
    c = cuda()
    slots = [_Slot(s) for s in stages]
    if streams == "by-kind":
        s_in, s_run, s_out = c.stream(), c.stream(), c.stream()
    B, K = stages[0].batch, stages[0].k
    batches = _batches(files, B)
    feats = np.empty((len(batches) * B, K), np.float32)
    spans: list = []
    gpu_marks: list = []
    threads = decode_threads(threads)
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    anchor = c.event()
    c.synchronize()
    anchor.record()
    anchor.synchronize()
    t_anchor = time.perf_counter()
    t_start = t_anchor

    def collect(slot):
        slot.events[5].synchronize()  # the slot's previous batch is finished
        b = slot.batch
        feats[b * B:(b + 1) * B] = slot.host_feat
        gpu_marks.append((b, slot.events, slot.host_marks))
        slot.events = [c.event() for _ in range(6)]
        slot.batch = None

    try:
        for b, chunk in enumerate(batches):
            slot = slots[b % len(slots)]
            if slot.batch is not None:
                collect(slot)
            t0 = time.perf_counter()
            decode_into(chunk, slot.host[:len(chunk)], pool, draft)  # GPU busy meanwhile
            t1 = time.perf_counter()
            spans.append(Span("CPU decode", b, t0, t1))
            ev = slot.events
            if streams == "per-slot":
                a_in = a_run = a_out = slot.stream
            else:
                a_in, a_run, a_out = s_in, s_run, s_out
            marks = [time.perf_counter()]
            ev[0].record(a_in)
            slot.d_u8.copy_to_device(slot.host, stream=a_in)  # async: pinned memory
            ev[1].record(a_in)
            ev[1].wait(a_run)  # compute starts after this batch's copy is in ...
            ev[2].record(a_run)  # ... and after the previous batch's compute (FIFO)
            slot.stage.run(slot.d_u8, slot.d_feat, a_run)
            ev[3].record(a_run)
            ev[3].wait(a_out)
            ev[4].record(a_out)
            slot.d_feat.copy_to_host(slot.host_feat, stream=a_out)
            ev[5].record(a_out)
            marks.append(time.perf_counter())
            slot.host_marks = marks
            slot.batch = b
        for slot in sorted(slots, key=lambda sl: -1 if sl.batch is None else sl.batch):
            if slot.batch is not None:
                collect(slot)
    finally:
        if pool:
            pool.shutdown()
    seconds = time.perf_counter() - t_start
    for b, ev, marks in gpu_marks:
        ms = [anchor.elapsed_time(e) for e in ev]
        if min(ms) < 0:  # the simulator's events have no clock: spread the host's marks
            t_a, t_b = marks
            times = [t_a + (t_b - t_a) * i / 5 for i in range(6)]
        else:
            times = [t_anchor + m / 1e3 for m in ms]
        spans += [Span("copy to GPU", b, times[0], times[1]),
                  Span("GPU compute", b, times[2], times[3]),
                  Span("copy to CPU", b, times[4], times[5])]
    how = "3 streams by kind of work" if streams == "by-kind" else f"{len(slots)} streams, " \
                                                                  "one per slot"
    label = name or f"overlapped ({threads} decode threads{', draft' if draft else ''}, " \
                    f"pinned, {how})"
    return RunResult(label, len(files), seconds, spans, feats[:len(files)])


def stage_times(files: list, stage: GpuStage, threads: int | None = None, draft=True,
                repeat: int = 3) -> dict:
    """Median seconds per batch of the CPU stage (decode in threads) and of the GPU stage
    (copy in from pinned memory, compute, copy out; CUDA events), measured apart."""
    slot = _Slot(stage)
    threads = decode_threads(threads)
    chunk = files[:stage.batch]
    dec, gpu = [], []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeat):
            t0 = time.perf_counter()
            decode_into(chunk, slot.host[:len(chunk)], pool, draft)
            dec.append(time.perf_counter() - t0)
    for _ in range(repeat + 1):
        ev = slot.events
        ev[0].record(slot.stream)
        slot.d_u8.copy_to_device(slot.host, stream=slot.stream)
        stage.run(slot.d_u8, slot.d_feat, slot.stream)
        slot.d_feat.copy_to_host(slot.host_feat, stream=slot.stream)
        ev[5].record(slot.stream)
        ev[5].synchronize()
        gpu.append(ev[0].elapsed_time(ev[5]) / 1e3)
    gpu = gpu[1:]  # the first run compiles the kernels
    d, g = float(np.median(dec)), float(np.median(gpu))
    out = dict(decode_s=d, gpu_s=g, threads=threads)
    if g > 0:
        out["bound"] = (d + g) / max(d, g)
    return out


def overlap_bound(decode_s: float, gpu_s: float) -> float:
    """Best speed-up of overlapping two stages over running them one after the other."""
    return (decode_s + gpu_s) / max(decode_s, gpu_s)


# ----------------------------------------------------------------------------------------
# Streams: a copy overlapping a kernel


def copy_compute_overlap(nbytes: int = 64 << 20, spin_ms: float = 5.0) -> dict:
    """GPU time of a host->device copy and a kernel: in one stream, in two streams from
    pinned memory, in two streams from pageable memory, and each alone (the copy from pinned
    and from pageable memory; CUDA events; ms)."""
    from .bench import require_gpu
    from .measure.timing import _kernels as measure_kernels
    from .measure.timing import _spin_ns_per_iter

    require_gpu("copy_compute_overlap")
    c = cuda()
    spin = measure_kernels()["spin"]
    iters = int(spin_ms * 1e6 / _spin_ns_per_iter())
    buf = c.to_device(np.ones(1, np.float32))
    n = nbytes // 4
    pinned = c.pinned_array(n, np.float32)
    pinned[:] = 1.0
    pageable = np.ones(n, np.float32)
    dev = c.device_array(n, np.float32)
    s1, s2 = c.stream(), c.stream()
    res = {}
    for label, host, two in (("one stream, pinned", pinned, False),
                             ("two streams, pinned", pinned, True),
                             ("two streams, pageable", pageable, True)):
        times = []
        for _ in range(4):
            c.synchronize()
            start, end1, end2 = c.event(), c.event(), c.event()
            start.record(s1)
            if two:
                start.wait(s2)  # s2's work starts after `start` too
            spin[1, 1, s1](buf, iters)
            dev.copy_to_device(host, stream=s2 if two else s1)
            end1.record(s1)
            end2.record(s2)
            end1.synchronize()
            end2.synchronize()
            times.append(max(start.elapsed_time(end1), start.elapsed_time(end2)
                             if two else 0.0))
        res[label] = float(np.median(times[1:]))
    for label, run in (("copy alone", lambda: dev.copy_to_device(pinned)),
                       ("pageable copy alone", lambda: dev.copy_to_device(pageable)),
                       ("kernel alone", lambda: spin[1, 1](buf, iters))):
        t = []
        for _ in range(3):
            start, end = c.event(), c.event()
            start.record()
            run()
            end.record()
            end.synchronize()
            t.append(start.elapsed_time(end))
        res[label] = float(np.median(t))
    res["bytes"] = nbytes
    return res


def pinned_vs_pageable(sizes=(1 << 20, 16 << 20, 256 << 20), repeat: int = 5) -> list:
    """Host->device and device->host GB/s, pageable vs pinned (lesson 04's measurement)."""
    from .measure.timing import transfer_table

    return transfer_table(sizes, repeat=repeat)


# ----------------------------------------------------------------------------------------
# Several GPUs: split the batch


def visible_gpus() -> int:
    """How many GPUs this process can use (the simulator has one)."""
    return len(cuda().gpus)


def split_batch(n: int, parts: int) -> list:
    """Contiguous (start, stop) ranges covering 0..n, min(n, parts) of them, sizes
    differing by at most one."""
    parts = max(1, min(int(parts), int(n)))
    q, r = divmod(int(n), parts)
    out, a = [], 0
    for i in range(parts):
        b = a + q + (1 if i < r else 0)
        out.append((a, b))
        a = b
    return out


class MultiGpu:
    """The GPU stage with the batch split across devices, one part per device.

    devices: device ids (default: every visible GPU). The same id may appear twice (two
    parts on one GPU, each with its own buffers and stream): that is how the split is
    tested on a machine with one GPU. Each part lives in its device's context.
    """

    def __init__(self, batch: int, side: int, k: int, devices=None, seed: int = 0):
        c = cuda()
        self.devices = list(range(visible_gpus()) if devices is None else devices)
        self.parts = split_batch(batch, len(self.devices))
        self.devices = self.devices[:len(self.parts)]
        self.batch, self.side, self.k = batch, side, k
        self.host = c.pinned_array((batch, side, side, 3), np.uint8)
        self.host_feat = c.pinned_array((batch, k), np.float32)
        self.work = []
        for dev, (a, b) in zip(self.devices, self.parts, strict=True):
            with c.gpus[dev]:
                stage = GpuStage(b - a, side, k, seed)
                self.work.append(dict(dev=dev, part=(a, b), stage=stage, stream=c.stream(),
                                      d_u8=c.device_array((b - a, side, side, 3), np.uint8),
                                      d_feat=c.device_array((b - a, k), np.float32)))

    def run(self, u8: np.ndarray | None = None) -> np.ndarray:
        """Features of the batch in self.host (or copied from u8) from all devices."""
        c = cuda()
        if u8 is not None:
            self.host[:] = u8
        for wk in self.work:  # queue every part first: the devices work at the same time
            a, b = wk["part"]
            with c.gpus[wk["dev"]]:
                s = wk["stream"]
                wk["d_u8"].copy_to_device(self.host[a:b], stream=s)
                wk["stage"].run(wk["d_u8"], wk["d_feat"], s)
                wk["d_feat"].copy_to_host(self.host_feat[a:b], stream=s)
        for wk in self.work:
            with c.gpus[wk["dev"]]:
                wk["stream"].synchronize()
        return np.array(self.host_feat)

    def time(self, repeat: int = 5) -> float:
        """Median wall seconds of one `run` (after a warm-up run)."""
        self.run()
        t = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self.run()
            t.append(time.perf_counter() - t0)
        return float(np.median(t))


def check_split(u8: np.ndarray, k: int, devices=None, seed: int = 0) -> dict:
    """Run a batch on one device and split across `devices`; the features must agree
    (to rounding: every part runs the same kernels on the same images)."""
    B, S = u8.shape[:2]
    one = MultiGpu(B, S, k, devices=[0 if devices is None else list(devices)[0]], seed=seed)
    many = MultiGpu(B, S, k, devices=devices, seed=seed)
    f1, fn = one.run(u8), many.run(u8)
    if not (np.isfinite(fn).all() and np.allclose(f1, fn, rtol=1e-5, atol=1e-6)):
        raise AssertionError(f"split across {many.devices} disagrees with one device: max "
                             f"diff {np.nanmax(np.abs(f1 - fn)):.3g}")
    return dict(devices=many.devices, parts=many.parts,
                max_abs_diff=float(np.abs(f1 - fn).max()))


# ----------------------------------------------------------------------------------------
# The timeline picture

LANES = ("CPU decode", "copy to GPU", "GPU compute", "copy to CPU")


def _levels(rows: list) -> dict:
    """Stack bars that overlap in time within a lane: id(row) -> (level, levels in lane)."""
    out = {}
    for lane in {r["lane"] for r in rows}:
        ends: list = []
        mine = sorted((r for r in rows if r["lane"] == lane), key=lambda r: r["start"])
        lv = {}
        for r in mine:
            free = [i for i, e in enumerate(ends) if e <= r["start"] + 1e-9]
            i = free[0] if free else len(ends)
            if i == len(ends):
                ends.append(r["end"])
            else:
                ends[i] = r["end"]
            lv[id(r)] = i
        for r in mine:
            out[id(r)] = (lv[id(r)], len(ends))
    return out


def draw_timeline(spans, title: str = "", ax=None, lanes=LANES, t_max: float | None = None):
    """A Gantt chart of Spans (or their dicts): one row per stage, one colour per batch.

    Bars of one stage that overlap in time (two batches on the GPU at once) are drawn
    side by side in thinner sub-rows, so concurrency shows.
    """
    import matplotlib.pyplot as plt

    rows = [s if isinstance(s, dict) else asdict(s) for s in spans]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 2.4))
    t0 = min(r["start"] for r in rows)
    span_ms = (t_max or max(r["end"] for r in rows) - t0) * 1e3
    cmap = plt.get_cmap("tab10")
    levels = _levels([r for r in rows if r["lane"] in lanes])
    for r in rows:
        if r["lane"] not in lanes:
            continue
        y = len(lanes) - 1 - lanes.index(r["lane"])
        level, n = levels[id(r)]
        h = 0.76 / n
        y0 = y + 0.38 - (level + 1) * h
        a, b = (r["start"] - t0) * 1e3, (r["end"] - t0) * 1e3
        ax.broken_barh([(a, max(b - a, 1e-3))], (y0, h),
                       facecolors=cmap(r["batch"] % 10), edgecolor="0.25", linewidth=0.4)
        if b - a > 0.03 * span_ms:
            ax.text((a + b) / 2, y0 + h / 2, str(r["batch"]), ha="center", va="center",
                    fontsize=7)
    ax.set_yticks(range(len(lanes)), list(reversed(lanes)))
    ax.set_xlabel("ms since the first batch started")
    if t_max:
        ax.set_xlim(0, t_max * 1e3)
    ax.set_title(title, fontsize=9)
    return ax


def draw_timelines(runs: list, titles: list | None = None):
    """Several runs' timelines on one time axis, stacked (e.g. serial above overlapped)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.2 * len(runs) + 0.3), squeeze=False)
    spans = [[s if isinstance(s, dict) else asdict(s) for s in r] for r in runs]
    t_max = max(max(x["end"] for x in sp) - min(x["start"] for x in sp) for sp in spans)
    for i, (ax, sp) in enumerate(zip(axes[:, 0], spans, strict=True)):
        draw_timeline(sp, (titles or [""] * len(runs))[i], ax=ax, t_max=t_max)
    fig.tight_layout()
    return fig

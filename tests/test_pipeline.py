"""Lesson 10's pipeline: JPEG corpus and decoding, the GPU stage against its reference,
serial and overlapped runs giving the same features, the batch split, the timeline; the
exercise checkers against right and wrong answers. GPU-only parts are marked."""

import io

import numpy as np
import pytest

import convlab
from convlab import check, pipeline, problems

convlab.setup()

SIDE, K = 12, 2


@pytest.fixture(scope="module")
def files():
    return pipeline.jpeg_corpus(6, seed=1)


def test_corpus_is_real_varied_jpeg(files):
    from PIL import Image

    assert all(f[:2] == b"\xff\xd8" for f in files)  # JPEG start-of-image marker
    sizes = {Image.open(io.BytesIO(f)).size for f in files}
    assert len(sizes) >= 3  # several scales
    assert len(set(files)) == len(files)


def test_decode_threads_match_sequential(files):
    a = np.empty((len(files), SIDE, SIDE, 3), np.uint8)
    b = np.empty_like(a)
    from concurrent.futures import ThreadPoolExecutor

    pipeline.decode_into(files, a)
    with ThreadPoolExecutor(3) as pool:
        pipeline.decode_into(files, b, pool)
    assert np.array_equal(a, b)
    full = pipeline.decode(files[0], 64, draft=False).astype(float)
    draft = pipeline.decode(files[0], 64, draft=True).astype(float)
    assert full.shape == draft.shape == (64, 64, 3)
    assert np.abs(full - draft).mean() < 12  # the same picture, decoded at a lower scale
    assert full.std() > 20  # a photo, not a constant


def test_gpu_stage_matches_reference(files):
    from numba import cuda

    u8 = np.empty((2, SIDE, SIDE, 3), np.uint8)
    pipeline.decode_into(files[:2], u8)
    stage = pipeline.GpuStage(2, SIDE, K, seed=3)
    feat = cuda.to_device(check.poisoned((2, K)))
    stage.run(cuda.to_device(u8), feat)
    got = feat.copy_to_host()
    assert pipeline.check_features(u8, stage.w, got) < 1e-4
    with pytest.raises(AssertionError):
        pipeline.check_features(u8, stage.w, got[::-1].copy())  # images swapped


def test_serial_and_overlapped_agree(files):
    stage = pipeline.GpuStage(2, SIDE, K)
    ser = pipeline.run_serial(files, stage, threads=2)
    ovl = pipeline.run_overlapped(files, [pipeline.GpuStage(2, SIDE, K) for _ in range(2)], 2)
    per_slot = pipeline.run_overlapped(files, [pipeline.GpuStage(2, SIDE, K) for _ in range(2)],
                                       2, streams="per-slot")
    assert ser.features.shape == (6, K) and np.isfinite(ser.features).all()
    assert np.array_equal(ser.features, ovl.features)
    assert np.array_equal(ser.features, per_slot.features)
    with pytest.raises(ValueError):
        pipeline.run_overlapped(files, [], streams="one")
    for run in (ser, ovl, per_slot):
        lanes = {(s.lane, s.batch) for s in run.spans}
        assert lanes == {(lane, b) for lane in pipeline.LANES for b in range(3)}
        assert all(s.end >= s.start for s in run.spans)
        assert run.images_per_s > 0
    rows = ovl.spans_dict()
    assert min(r["start"] for r in rows) == 0.0


def test_timeline_picture(files):
    import matplotlib

    matplotlib.use("Agg")
    spans = [pipeline.Span(lane, b, b * 1.0 + i * 0.2, b * 1.0 + i * 0.2 + 0.15)
             for b in range(3) for i, lane in enumerate(pipeline.LANES)]
    fig = pipeline.draw_timelines([spans, spans], ["a", "b"])
    assert len(fig.axes) == 2
    assert len(fig.axes[0].collections) == 12  # one bar per stage and batch
    both = [pipeline.Span("GPU compute", 0, 0.0, 2.0), pipeline.Span("GPU compute", 1, 1.0, 2.0),
            pipeline.Span("GPU compute", 2, 2.0, 3.0)]
    lv = pipeline._levels([vars(s) for s in both])
    assert sorted(lv.values()) == [(0, 2), (0, 2), (1, 2)]  # batch 1 ran beside batch 0


def test_split_batch():
    for n in range(1, 40):
        for parts in range(1, 9):
            spans = pipeline.split_batch(n, parts)
            sizes = [b - a for a, b in spans]
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
            assert len(spans) == min(n, parts) and min(sizes) >= 1
            assert max(sizes) - min(sizes) <= 1
    check.check_partition(lambda n, w: pipeline.split_batch(n, w), quiet=True)


def test_multi_gpu_split_checks_against_one_device(files):
    u8 = np.empty((3, SIDE, SIDE, 3), np.uint8)
    pipeline.decode_into(files[:3], u8)
    r = pipeline.check_split(u8, K, devices=[0, 0])
    assert r["parts"] == [(0, 2), (2, 3)] and r["max_abs_diff"] == 0.0
    assert pipeline.visible_gpus() >= 1
    m = pipeline.MultiGpu(3, SIDE, K)  # every visible device
    assert len(m.parts) == min(3, pipeline.visible_gpus())


def test_overlap_bound_and_sizes():
    assert pipeline.overlap_bound(1.0, 1.0) == 2.0
    assert pipeline.overlap_bound(3.0, 1.0) == pytest.approx(4 / 3)
    assert problems.pipeline_sizes(real=True)["batch"] == 32
    assert pipeline.stem_out_side(224) == 112


# ---- the exercise checkers, against right and wrong answers


def _pipeline_time(times, slots=None):
    t = np.asarray(times, float)
    B, S = t.shape
    end = np.zeros((B, S))
    for b in range(B):
        for s in range(S):
            start = max(end[b, s - 1] if s else 0, end[b - 1, s] if b else 0)
            if s == 0 and slots and b >= slots:
                start = max(start, end[b - slots, -1])
            end[b, s] = start + t[b, s]
    return end[-1, -1]


def test_pipeline_time_checker():
    check.check_pipeline_time(_pipeline_time, quiet=True)
    with pytest.raises(check.CheckError, match="serial"):
        check.check_pipeline_time(lambda t, slots=None: float(np.sum(t)), quiet=True)
    with pytest.raises(check.CheckError, match="slots"):
        check.check_pipeline_time(lambda t, slots=None: _pipeline_time(t), quiet=True)
    # `b > slots` for `b >= slots`: one slot too many, named on the small case first
    with pytest.raises(check.CheckError, match=r"FAILED on times \[\[2\.0, 2\.0, 2\.0\], .*\], "
                       r"slots=1: got 14, expected 24 \(that is slots=2: batch b waits for "
                       r"batch b - 1"):
        check.check_pipeline_time(lambda t, slots=None: _pipeline_time(
            t, None if slots is None else slots + 1), quiet=True)


def _weighted(n, speeds):
    sizes = [0] * len(speeds)
    for _ in range(n):
        i = min(range(len(speeds)), key=lambda j: (sizes[j] + 1) / speeds[j])
        sizes[i] += 1
    out, a = [], 0
    for s in sizes:
        out.append((a, a + s))
        a += s
    return out


def test_weighted_split_checker():
    check.check_weighted_split(_weighted, quiet=True)
    with pytest.raises(check.CheckError):  # an even split ignores the speeds
        check.check_weighted_split(
            lambda n, sp: [(a, b) for a, b in pipeline.split_batch(n, len(sp))]
            + [(n, n)] * (len(sp) - min(n, len(sp))), quiet=True)


@pytest.mark.gpu
def test_gpu_stage_real_size_and_split():
    sz = problems.pipeline_sizes()
    fs = pipeline.jpeg_corpus(sz["batch"])
    u8 = np.empty((sz["batch"], sz["side"], sz["side"], 3), np.uint8)
    pipeline.decode_into(fs, u8)
    r = pipeline.check_split(u8, sz["k"])
    assert r["max_abs_diff"] < 1e-5
    m = pipeline.MultiGpu(sz["batch"], sz["side"], sz["k"])
    pipeline.check_features(u8, m.work[0]["stage"].w, m.run(u8), images=2)


@pytest.mark.gpu
def test_two_streams_overlap_a_copy_with_a_kernel():
    r = pipeline.copy_compute_overlap(32 << 20, 3.0)
    assert r["two streams, pinned"] < 0.9 * r["one stream, pinned"]

"""convlab.viz, convlab.widgets, convlab.images: pictures render and say the right thing."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from convlab import images, viz, widgets  # noqa: E402
from convlab import reference as ref  # noqa: E402


def _texts(fig):
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title]
                    + ([fig._suptitle] if fig._suptitle else []))


def test_photo_is_a_real_float32_image():
    p = images.photo()
    assert p.shape == (600, 512) and p.dtype == np.float32
    assert 0.0 <= p.min() < 0.1 and 0.9 < p.max() <= 1.0 and p.std() > 0.1
    assert images.photo(40, crop="face").shape == (40, 40)
    assert images.photo((30, 20), gray=False).shape == (30, 20, 3)
    with pytest.raises(ValueError):
        images.photo(crop="nose")


def test_window_cells_follow_stride_and_dilation():
    cells = viz.window_cells((1, 2), 3, stride=2, padding=1, dilation=2)
    assert cells[0] == (2, 4) and cells[-1] == (6, 8) and len(cells) == 9


def test_draw_conv_window_and_its_refusal():
    fig = viz.draw_conv_window(7, 6, 3, stride=2, padding=1, dilation=1, pos=(1, 2))
    assert "y[1, 2]" in _texts(fig) and "stride 2" in _texts(fig)
    with pytest.raises(ValueError):
        viz.draw_conv_window(5, 5, 3, pos=(3, 0))  # output is 3x3


def test_loop_addresses_by_hand():
    # x (1, 4, 4), 3x3 filter: order pqcrs starts with the window of output (0, 0)
    a = viz.loop_addresses("pqcrs", C=1, H=4, W=4, R=3, S=3, steps=9)
    assert a.tolist() == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    b = viz.loop_addresses("crspq", C=1, H=4, W=4, R=3, S=3, steps=4)
    assert b.tolist() == [0, 1, 4, 5]  # tap (0, 0) over the 2x2 outputs
    with pytest.raises(ValueError):
        viz.loop_addresses("pqcr")


def test_pictures_render():
    figs = [viz.draw_nchw((2, 3, 3, 4)), viz.draw_im2col(2, 4, 4, 3, 2),
            viz.draw_loop_order(), viz.draw_blocking(), viz.draw_flat_tile(3, 10, 3, 4),
            viz.show_images([np.ones((4, 4)), -np.ones((4, 4))], ["a", "b"]),
            viz.plot_timings([("slow", 100.0, 1.0), ("fast", 1.0, 100.0)], baseline="slow"),
            viz.plot_thread_sweep({"v": [(1, 10.0), (2, 8.0)]}),
            viz.plot_batch_crossover([1, 2, 4], {"cpu": [1, 2, 4], "gpu": [3, 3, 3]})]
    for f in figs:  # every picture draws marks, not just an empty frame
        assert sum(len(ax.patches) + len(ax.lines) + len(ax.images) + len(ax.collections)
                   for ax in f.axes) > 0
    assert [ax.get_title() for ax in figs[5].axes if ax.images] == ["a", "b"]
    sweep = figs[7].axes[0].lines[0]
    assert sweep.get_xdata().tolist() == [1, 2] and sweep.get_ydata().tolist() == [1.0, 1.25]
    assert sweep.get_label() == "v (1 thread: 10 ms)"
    per_image = {ln.get_label(): ln.get_ydata().tolist() for ln in figs[8].axes[0].lines}
    assert per_image == {"cpu": [1.0, 1.0, 1.0], "gpu": [3.0, 1.5, 0.75]}
    assert "offset ((1·3+1)·3+2)·4+1 = 57" in _texts(figs[0])
    assert "one loop of 34 = 8 vectors + 2" in _texts(figs[4])
    assert "×100" in _texts(figs[6]) and "speed-up over slow" in figs[6].axes[0].get_xlabel()


def test_roofline_labels_the_cpu_ceiling():
    ax = viz.roofline([("gemm", 100.0, 150.0)], 20.0, 200.0, peak_label="BLAS SGEMM")
    text = _texts(ax.figure)
    assert "BLAS SGEMM: 200 GFLOP/s" in text and "memory: 20 GB/s" in text
    assert ax.get_ylabel() == "GFLOP/s"


def test_explorer_frame_formula_matches_the_filter():
    rng = np.random.default_rng(0)
    img = rng.random((9, 11)).astype(np.float32)
    k = rng.standard_normal((3, 3)).astype(np.float32)
    out = ref.filter2d(img, k)
    for pos in [(0, 0), (4, 5), (8, 10)]:
        win, prod = widgets.window_terms(img, k, pos)
        assert prod.sum() == pytest.approx(out[pos], abs=1e-5)
        assert widgets.formula(img, k, pos).endswith(f"= {prod.sum():.4f}")
    with pytest.raises(ValueError):
        widgets.render_frame(img, k, (9, 0))


def test_explorer_redraws_when_the_slider_moves():
    pytest.importorskip("ipywidgets")
    box = widgets.build_explorer(images.photo(16, crop="face"), widgets.default_filters())
    c = box.controls
    first = c["picture"].value
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    c["row"].value = 5
    assert c["picture"].value != first and "y[5, 0]" in c["formula"].value
    c["play"].value = 16 * 3 + 7  # the play counter walks the raster
    assert (c["row"].value, c["column"].value) == (3, 7)
    c["filter"].value = "box 3×3 (mean)"
    assert "y[3, 7]" in c["formula"].value
    bundle = box._repr_mimebundle_()
    assert "could not be displayed" in bundle["text/plain"]
    assert "data:image/png;base64," in bundle["text/html"]
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_explorer_outside_a_kernel_prints_a_note_and_returns_a_picture(capsys):
    fig = widgets.filter_explorer(images.photo(12, crop="face"))
    assert "could not be displayed" in capsys.readouterr().out
    assert len(fig.axes) == 3


def test_draw_plane_tiles_marks_zeros_and_one_copy_pass():
    fig = viz.draw_plane_tiles(G=2, H=3, W=4, pad=1, threads=5, v=2)
    top, bottom = fig.axes
    # 2 planes x 12 values in global memory; 2 tiles of 5x6 in shared memory
    assert sum(1 for p in top.patches if p.get_fill()) == 24
    zeros = [t for t in bottom.texts if t.get_text() == "0"]
    assert len(zeros) == 2 * (5 * 6 - 3 * 4)
    red = [p for p in bottom.patches
           if not p.get_fill() and p.get_width() == 1 and p.get_height() == 1]
    assert len(red) == 5  # the first copy pass lands on 5 cells of tile 0


def test_draw_row_strips_frames_one_window_and_the_edge_lanes():
    fig = viz.draw_row_strips(H=9, V=2, lanes=8, show=1)
    ax = fig.axes[0]
    assert sum(1 for p in ax.patches if p.get_fill()) == 9 * 8  # one cell per lane and row
    labels = [t.get_text() for t in ax.texts if t.get_text().startswith("strip")]
    assert labels == ["strip 0 ↓", "strip 1 ↑", "strip 2 ↓", "strip 3 ↑", "strip 4 ↓"]
    frames = [p for p in ax.patches if not p.get_fill()]
    assert sorted(round(p.get_height()) for p in frames) == [4, 4, 4]  # rows 1..4: V + 2
    assert "reads the dashed 4 rows" in ax.get_title()


def test_window_picture_covers_every_flat_tap_with_its_filter_rows_run():
    from convlab.kernels import depthwise05_window_cuda as D

    H, W, first = 5, 14, 40  # outputs (2, 12), (2, 13), (3, 0), (3, 1): a run crosses rows
    fig = viz.draw_window_loads(D.window_runs(W, 3, 3, 4, 4), H=H, W=W, v=4, first=first)
    ax = fig.axes[0]
    cells = {(round(p.get_y()), round(p.get_x())): p.get_facecolor() for p in ax.patches
             if p.get_fill()}
    for o in range(4):
        for r in range(3):
            for s in range(3):
                f = first + o + (r - 1) * W + (s - 1)  # flat tap, whatever the row
                assert cells[divmod(f, W)] == matplotlib.colors.to_rgba(viz.CHANNEL_COLORS[r])
    hatched = {(round(p.get_y()), round(p.get_x())) for p in ax.patches if p.get_hatch()}
    runs = D.window_runs(W, 3, 3, 4, 4)
    mine, next_thread = ({f0 + lo + i for lo, n in runs for i in range(4 * n)}
                         for f0 in (first, first + 4))
    # by hand: row runs [24, 32) [36, 48) [52, 60) against [28, 36) [40, 52) [56, 64)
    assert hatched == {divmod(f, W) for f in mine & next_thread} and len(hatched) == 4 + 8 + 4
    frames = [p for p in ax.patches if not p.get_fill() and not p.get_hatch()]
    assert len(frames) == 4  # the outputs' frames
    assert "the 7 16-byte vectors" in ax.get_title()


# ---------------------------------------------------------------------------------------
# Lessons 07-09's pictures and their counts


def test_chunk_loads_picture_loads_every_float_once_and_stores_it_transposed():
    BM, BK, threads = 8, 8, 8
    owners = viz.chunk_owners(BM, BK, threads)
    floats = [(m, k0 + j) for (m, k0) in owners for j in range(4)]
    assert sorted(floats) == [(m, k) for m in range(BM) for k in range(BK)]  # once each
    assert sorted(list(owners.values()).count(t) for t in range(threads)) == [2] * threads
    fig = viz.draw_chunk_loads(BM, BK, threads)
    left, right = fig.axes

    def cells(ax):
        return {(round(p.get_x()), round(p.get_y())): p.get_facecolor() for p in ax.patches
                if p.get_fill()}

    g, s = cells(left), cells(right)  # global: (k, m) -> colour; shared: (m, k) -> colour
    assert len(g) == len(s) == BM * BK
    assert all(g[k, m] == s[m, k] for (k, m) in g)  # As[k][m] holds A[m][k]
    frames = [p for p in left.patches if not p.get_fill()]
    assert len(frames) == BM * BK // 4 and all(round(p.get_width()) == 4 for p in frames)


def test_register_block_counts_loads_and_refuses_bad_threads():
    fig = viz.draw_register_block(BM=16, BN=16, BK=4, TM=4, TN=4, thread=(1, 2))
    assert "4 + 4 = 8 loads, 16 FMAs: 2.0 FMAs per load" in _texts(fig)
    fig = viz.draw_register_block(BM=32, BN=32, BK=4, TM=8, TN=8, thread=(0, 0), split=True)
    assert "two runs of 4" in _texts(fig) and "4.0 FMAs per load" in _texts(fig)
    with pytest.raises(ValueError):
        viz.draw_register_block(BM=16, BN=16, TM=4, TN=4, thread=(4, 0))


def test_occupancy_by_hand():
    # 143 registers -> 18 x 256 per warp = 4608; 65536 // 4608 = 14 warps: one 8-warp block
    assert viz.occupancy(143, 256) == dict(blocks=1, warps=8, occupancy=0.125,
                                           limited_by="registers")
    # 32 registers: the 64-warp limit binds, not the registers
    o = viz.occupancy(32, 128)
    assert o["warps"] == 64 and o["limited_by"] == "warps"
    assert viz.occupancy(128, 128)["warps"] == 16 and viz.occupancy(300, 128)["blocks"] == 0
    assert viz.occupancy(32, 128, smem_per_block=100 * 1024)["limited_by"] == "shared memory"
    assert viz.plot_occupancy([("a", 64), ("b", 200, 256)]).axes


def test_vector_reads_count_wavefronts():
    assert viz.vector_read_wavefronts(8, split=False) == 2
    assert viz.vector_read_wavefronts(8, split=True) == 1
    assert viz.vector_read_wavefronts(16, split=False) == 4
    assert "2 wavefronts" in _texts(viz.draw_vector_reads(8))


def test_implicit_gemm_slab_has_the_right_pixels():
    fig = viz.draw_implicit_gemm(C=2, H=4, W=4, tap=(1, 0), BK=2, BN=8)
    slab = [t.get_text() for t in fig.axes[2].texts]
    # tap (1, 0), pad 1: output (p, q) reads input (p, q - 1); column 0 is padding
    assert slab[:8] == ["0", "a0", "a1", "a2", "0", "a4", "a5", "a6"]
    with pytest.raises(ValueError):
        viz.draw_implicit_gemm(tap=(3, 0))


def test_double_buffering_timeline_is_shorter():
    # one buffer: 4 x (load 1 + FMAs 1) = 8; two: load 0, then 4 FMA steps = 5
    fig = viz.draw_double_buffering(load_us=1.0, compute_us=1.0, sync_us=0.0, n=4)
    assert "(1.60x shorter here)" in _texts(fig)
    assert "4 slabs in 8 time units" in _texts(fig) and "4 slabs in 5 time units" in _texts(fig)


def test_split_k_picture_has_a_block_and_a_slice_per_part_and_names_the_last_block():
    fig = viz.draw_split_k(tiles=2, parts=3, last=(2, 0))
    ax = fig.axes[0]
    texts = _texts(fig)
    assert sum(t.startswith("block (") for t in (x.get_text() for x in ax.texts)) == 6
    assert sum(x.get_text() == "ws[1]" for x in ax.texts) == 2
    assert "y = ws[0] + ws[1] + ws[2]" in texts
    assert "added by block (0,2)" in texts and "added by block (1,0)" in texts
    assert "2 tiles x 3 parts = 6 blocks" in texts


# ---------------------------------------------------------------------------------------
# Lesson 12's pictures


def test_format_bits_are_drawn_to_scale():
    fig = viz.plot_formats(("fp32", "fp16"))
    assert len(fig.axes[0].patches) == 32 + 16  # one box per bit
    assert "16 bits: 5 exponent, 10 mantissa" in _texts(fig)


def test_fragment_owner_picture_follows_the_ptx_layout():
    texts = [t.get_text() for t in viz.plot_fragment_owners().axes[0].texts]
    assert len(texts) == 16 * 8
    assert texts[9 * 8 + 3] == "5\nc3"  # row 9, column 3: lane 4*(9%8) + 3//2, register 2+1
    assert viz.mma_m16n8_owner(9, 3) == (5, 3)


def test_wmma_tiling_shows_every_fragment():
    from convlab.kernels.wmma01_gemm_cuda import GEMM_DEFAULT as cfg

    ax = viz.plot_wmma_tiling().axes[0]
    frags = [p for p in ax.patches if (p.get_width(), p.get_height()) == (16, 16)]
    assert len(frags) == cfg.BM * cfg.BN // 256
    assert f"{cfg.warps} warps" in ax.get_title()


def test_mma_shapes_count_the_multiply_adds():
    fig = viz.plot_mma_shapes()
    assert len(fig.axes[0].patches) == len(viz.MMA_SHAPES)
    text = _texts(fig)
    assert "64 multiply-adds" in text and f"{64 * 256 * 16:,} multiply-adds" in text


def test_show_diff_shows_only_what_the_rung_adds():
    def before(a):
        x = a + 1
        y = x * 2
        return y

    def after(a):
        x = a + 1
        y = x * 3
        return y

    text = viz.show_diff(before, after, context=0).data
    changed = [ln[0] + ln[1:].strip() for ln in text.splitlines()
               if ln[:1] in "+-" and ln[:3] not in ("---", "+++") and " def " not in ln]
    assert changed == ["-y = x * 2", "+y = x * 3"]


def test_warp_tiles_picture_counts_what_a_warp_covers():
    fig = viz.draw_warp_tiles(TX=16, TY=8)
    rows, patches = (ax.get_title() for ax in fig.axes[:2])
    assert "16 thread columns (pixels) x 2 rows" in rows
    assert "8 thread columns (pixels) x 4 rows" in patches

"""convlab.viz, convlab.widgets, convlab.images: pictures render and say the right thing."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from convlab import images, viz, widgets  # noqa: E402
from convlab import reference as ref  # noqa: E402


def _texts(fig):
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title])


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
            viz.plot_thread_sweep({"v": [(1, 10.0), (2, 5.0)]}),
            viz.plot_batch_crossover([1, 2, 4], {"cpu": [1, 2, 4], "gpu": [3, 3, 3]})]
    for f in figs:
        assert f.axes
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

"""Pictures the lessons share: images, sliding windows, layouts, im2col, timings, rooflines.

Every function draws with matplotlib and returns the figure (or axes), so a notebook cell
shows it and a test can inspect it. Nothing here imports numba. Lesson developers add
functions here when a picture is used by more than one notebook.

- images: `show_images`
- convolution geometry: `draw_conv_window`, `draw_nchw`, `draw_im2col`
- access patterns: `loop_addresses`, `draw_loop_order`, `draw_blocking`, `draw_flat_tile`
- parallel work: `draw_split_k`
- measurements: `plot_timings`, `plot_thread_sweep`, `plot_batch_crossover`, `roofline`
  (one plotter, one or several compute roofs)
- precisions and tensor cores: `plot_formats`, `plot_accuracy_speed`, `plot_mma_shapes`,
  `plot_fragment_owners` (`mma_m16n8_owner`), `plot_wmma_tiling`
- the capstone: `plot_capstone_roofline`, `plot_capstone_ladder`, `plot_census`
"""

from __future__ import annotations

import numpy as np

from . import reference as ref
from .formats import FORMATS

# One colour per input channel / filter, shared by all pictures.
CHANNEL_COLORS = ["#8ecae6", "#ffb703", "#b5e48c", "#f4a3c0", "#cdb4db", "#f9c74f"]
HIGHLIGHT = "#d62828"


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _grid(ax, x0, y0, rows, cols, color="white", labels=None, size=1.0, fontsize=7,
          edge="0.35", lw=0.6):
    """Draw rows×cols unit squares with their top-left corner at (x0, y0) (y grows down)."""
    plt = _plt()
    for i in range(rows):
        for j in range(cols):
            c = color[i][j] if isinstance(color, (list, np.ndarray)) else color
            ax.add_patch(plt.Rectangle((x0 + j * size, y0 + i * size), size, size, fc=c,
                                       ec=edge, lw=lw))
            if labels is not None:
                lab = labels[i][j]
                if lab is not None and lab != "":
                    ax.text(x0 + (j + 0.5) * size, y0 + (i + 0.5) * size, str(lab),
                            ha="center", va="center", fontsize=fontsize)


def _frame(ax, x0, y0, rows, cols, color=HIGHLIGHT, lw=2.2, size=1.0, **kw):
    plt = _plt()
    ax.add_patch(plt.Rectangle((x0, y0), cols * size, rows * size, fill=False, ec=color, lw=lw,
                               **kw))


def _finish(ax, title=None):
    ax.set_aspect("equal")
    ax.invert_yaxis()
    ax.axis("off")
    ax.autoscale_view()
    if title:
        ax.set_title(title, fontsize=10)


# ----------------------------------------------------------------------------------------
# Images


def show_images(images, titles=None, cmap="gray", ncols=None, size=3.2, symmetric=None,
                suptitle=None):
    """Show 2-D arrays side by side; returns the figure.

    symmetric: centre the colour scale on 0 with a diverging map (default: for any image
    with negative values, e.g. a Sobel response), so that the sign is visible.
    """
    plt = _plt()
    images = list(images)
    n = len(images)
    ncols = ncols or min(n, 4)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows * 1.05),
                             squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.axis("off")
        if k >= n:
            continue
        img = np.asarray(images[k])
        sym = symmetric if symmetric is not None else bool(np.nanmin(img) < 0)
        if sym:
            m = float(np.nanmax(np.abs(img))) or 1.0
            ax.imshow(img, cmap="RdBu_r", vmin=-m, vmax=m, interpolation="nearest")
        else:
            ax.imshow(img, cmap=cmap, interpolation="nearest")
        if titles is not None:
            ax.set_title(titles[k], fontsize=9)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------
# Convolution geometry


def window_cells(pos, kernel_hw, stride=1, padding=0, dilation=1):
    """Padded-input coordinates (row, col) read for output pixel pos=(i, j)."""
    (R, S), (sh, sw), (dh, dw) = ref.pair(kernel_hw), ref.pair(stride), ref.pair(dilation)
    i, j = pos
    return [(i * sh + r * dh, j * sw + s * dw) for r in range(R) for s in range(S)]


def draw_conv_window(H=5, W=5, kernel_hw=3, stride=1, padding=0, dilation=1, pos=(0, 0),
                     axes=None, title=None):
    """The input (with its zero-padding ring), the cells one output reads, and that output.

    Left: the H×W input (white), the padding (grey), the R×S window for output pos (red,
    with gaps when dilated). Right: the P×Q output with pos marked. Returns the figure.
    """
    plt = _plt()
    (R, S), (ph, pw) = ref.pair(kernel_hw), ref.pair(padding)
    P, Q = ref.conv2d_output_shape((H, W), (R, S), stride, padding, dilation)
    if not (0 <= pos[0] < P and 0 <= pos[1] < Q):
        raise ValueError(f"pos {pos} is outside the {P}x{Q} output")
    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.6),
                                 gridspec_kw=dict(width_ratios=[H + 2 * ph + 1, P + 1]))
    else:
        fig = axes[0].figure
    a_in, a_out = axes
    Hp, Wp = H + 2 * ph, W + 2 * pw
    colors = [["#e6e6e6" if (i < ph or i >= ph + H or j < pw or j >= pw + W) else "white"
               for j in range(Wp)] for i in range(Hp)]
    cells = window_cells(pos, (R, S), stride, padding, dilation)
    for (i, j) in cells:
        colors[i][j] = "#f7b2b2"
    labels = [["0" if colors[i][j] == "#e6e6e6" else "" for j in range(Wp)] for i in range(Hp)]
    _grid(a_in, 0, 0, Hp, Wp, colors, labels, fontsize=6)
    for (i, j) in cells:
        _frame(a_in, j, i, 1, 1, lw=1.5)
    if ph or pw:
        _frame(a_in, pw, ph, H, W, color="k", lw=1.2, ls="--")
    _finish(a_in, f"input {H}×{W}" + (f", padding {padding}" if ph or pw else "")
            + (f", stride {stride}" if ref.pair(stride) != (1, 1) else "")
            + (f", dilation {dilation}" if ref.pair(dilation) != (1, 1) else ""))
    oc = [["white"] * Q for _ in range(P)]
    oc[pos[0]][pos[1]] = "#f7b2b2"
    _grid(a_out, 0, 0, P, Q, oc)
    _frame(a_out, pos[1], pos[0], 1, 1, lw=1.5)
    _finish(a_out, f"output {P}×{Q}: y[{pos[0]}, {pos[1]}]")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_nchw(shape=(2, 3, 3, 4), highlight=None):
    """An NCHW tensor as planes, and the same elements as one line of memory.

    highlight: (n, c, h, w) of one element, shown in both with its flat offset
    ((n·C + c)·H + h)·W + w. Returns the figure.
    """
    plt = _plt()
    N, C, H, W = shape
    highlight = highlight or (N - 1, min(1, C - 1), H - 1, min(1, W - 1))
    n0, c0, h0, w0 = highlight
    off0 = ((n0 * C + c0) * H + h0) * W + w0
    total = N * C * H * W
    fig = plt.figure(figsize=(min(13, 1.2 + 0.16 * total), 4.2))
    ax = fig.add_axes([0.02, 0.36, 0.96, 0.6])
    ax2 = fig.add_axes([0.02, 0.02, 0.96, 0.3])
    x = 0.0
    for n in range(N):
        for c in range(C):
            col = CHANNEL_COLORS[c % len(CHANNEL_COLORS)]
            labels = [[f"{((n * C + c) * H + h) * W + w}" for w in range(W)] for h in range(H)]
            _grid(ax, x, 0, H, W, col, labels, fontsize=6)
            if (n, c) == (n0, c0):
                _frame(ax, x + w0, h0, 1, 1)
            ax.text(x + W / 2, -0.4, f"n={n}, c={c}", ha="center", fontsize=7)
            x += W + 0.6
        x += 1.0
    _finish(ax)
    ax.set_title(f"NCHW tensor {shape}: each plane is one image's channel (cells show offsets)",
                 fontsize=10, pad=16)
    for k in range(total):
        c = (k // (H * W)) % C
        _grid(ax2, k, 0, 1, 1, CHANNEL_COLORS[c % len(CHANNEL_COLORS)])
    _frame(ax2, off0, 0, 1, 1)
    ax2.annotate(f"x[{n0},{c0},{h0},{w0}] at offset (({n0}·{C}+{c0})·{H}+{h0})·{W}+{w0} = "
                 f"{off0}", (off0 + 0.5, 1.0), (max(0, off0 - total * 0.35), 2.6),
                 fontsize=8, arrowprops=dict(arrowstyle="->", color=HIGHLIGHT))
    for k in range(0, total, H * W):
        ax2.text(k, -0.5, str(k), fontsize=6)
    ax2.set_ylim(3.2, -1.0)
    ax2.set_xlim(-0.5, total + 0.5)
    ax2.set_aspect("equal")
    ax2.axis("off")
    ax2.set_title("the same tensor in memory: w fastest, then h, c, n", fontsize=9)
    return fig


def draw_im2col(C=2, H=4, W=4, kernel_hw=3, K=2, padding=0, patch=None):
    """im2col as a picture: each patch becomes a column, each filter a row.

    Input pixels are labelled by channel letter and index (a0…, b0…); the chosen patch is
    framed in the input and as its column; the filter matrix (K × C·R·S) times the column
    matrix (C·R·S × P·Q) gives the K × P·Q output. Returns the figure.
    """
    plt = _plt()
    R, S = ref.pair(kernel_hw)
    P, Q = ref.conv2d_output_shape((H, W), (R, S), 1, padding)
    patch = patch or (P - 1, min(1, Q - 1))
    pi, pj = patch
    letters = "abcdefgh"
    names = np.empty((1, C, H, W), dtype=object)
    for c in range(C):
        for i in range(H):
            for j in range(W):
                names[0, c, i, j] = f"{letters[c]}{i * W + j}"
    # im2col on labels: reuse the reference's index arithmetic on an index array
    idx = np.arange(C * H * W, dtype=np.float64).reshape(1, C, H, W) + 1
    cols = ref.im2col(idx, (R, S), 1, padding)  # 0 = padding
    flat = names.reshape(-1)
    col_lab = [["0" if v == 0 else flat[int(v) - 1] for v in row] for row in cols]
    col_col = [[("#eeeeee" if v == 0 else CHANNEL_COLORS[((int(v) - 1) // (H * W)) % 6])
                for v in row] for row in cols]
    fig, ax = plt.subplots(figsize=(11, 0.42 * C * R * S + 1.8))
    # input channels
    x = 0.0
    for c in range(C):
        _grid(ax, x, 0, H, W, CHANNEL_COLORS[c], names[0, c], fontsize=6)
        _frame(ax, x + pj - padding, pi - padding, R, S)
        ax.text(x + W / 2, -0.5, f"channel {c}", ha="center", fontsize=8)
        x += W + 0.5
    # filter matrix
    fx = x + 1.5
    fy = C * R * S / 2 + 2
    wc = [[CHANNEL_COLORS[(j // (R * S)) % 6] for j in range(C * R * S)] for _ in range(K)]
    sz = 0.55
    _grid(ax, fx, fy, K, C * R * S, wc, None, size=sz)
    for k in range(K):
        ax.text(fx - 0.3, fy + (k + 0.5) * sz, f"filter {k}", ha="right", va="center", fontsize=7)
    ax.text(fx + C * R * S * sz / 2, fy - 0.4, f"filters → rows: W  ({K} × {C * R * S})",
            ha="center", fontsize=8)
    # column matrix
    cx = fx + C * R * S * sz + 1.2
    _grid(ax, cx, 0, C * R * S, P * Q, col_col, col_lab, size=0.9, fontsize=6)
    jcol = pi * Q + pj
    _frame(ax, cx + jcol * 0.9, 0, C * R * S, 1, size=0.9)
    ax.text(cx + P * Q * 0.45, -0.5, f"patches → columns: im2col(x)  ({C * R * S} × {P * Q})",
            ha="center", fontsize=8)
    # output
    ox = cx + P * Q * 0.9 + 1.2
    oc = [["white"] * (P * Q) for _ in range(K)]
    for k in range(K):
        oc[k][jcol] = "#f7b2b2"
    _grid(ax, ox, fy, K, P * Q, oc, [[f"y{k}" for _ in range(P * Q)] for k in range(K)],
          size=0.9, fontsize=6)
    ax.text(ox + P * Q * 0.45, fy - 0.4, f"= Y  ({K} × {P * Q})", ha="center", fontsize=8)
    ax.text(fx + C * R * S * sz + 0.6, fy + K * sz / 2, "×", fontsize=14, ha="center",
            va="center")
    _finish(ax, f"im2col: {C}×{H}×{W} input, {K} filters of {C}×{R}×{S}: every pixel appears "
                f"in up to {R * S} columns; one GEMM computes all {K * P * Q} outputs")
    width, height = ox + P * Q * 0.9, max(C * R * S * 0.9, H) + 1.0
    fig.set_size_inches(11, max(3.0, 11 * height / width + 0.6))
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------
# Access patterns (lesson 03)


def loop_addresses(order: str, C=2, H=6, W=6, R=3, S=3, steps=120) -> np.ndarray:
    """Flat offsets into x (C, H, W, no padding, stride 1) read by a direct conv's loops.

    order: loop nest from outer to inner, written with the letters p q c r s (output
    row/column, input channel, filter row/column), e.g. 'pqcrs' (the definition: one
    output at a time) or 'crspq' (a whole output plane per filter tap). Returns the first
    `steps` offsets.
    """
    P, Q = H - R + 1, W - S + 1
    if sorted(order) != sorted("pqcrs"):
        raise ValueError(f"order must be a permutation of 'pqcrs', got {order!r}")
    ext = dict(p=P, q=Q, c=C, r=R, s=S)
    out = []
    for idx in np.ndindex(*[ext[ch] for ch in order]):
        v = dict(zip(order, idx, strict=True))
        out.append((v["c"] * H + v["p"] + v["r"]) * W + v["q"] + v["s"])
        if len(out) >= steps:
            break
    return np.array(out)


def draw_loop_order(orders=("pqcrs", "crspq"), C=2, H=12, W=12, R=3, S=3, steps=160,
                    line_floats=16):
    """Offsets the innermost loops read, in order, for each loop nest; returns the figure.

    A staircase of +1 steps is streaming (SIMD lanes and cache lines used fully); big jumps
    are a new cache line or page per read. Horizontal lines mark 64-byte cache lines
    (`line_floats` float32 each).
    """
    plt = _plt()
    fig, axes = plt.subplots(1, len(orders), figsize=(5.2 * len(orders), 3.4), sharey=True,
                             squeeze=False)
    for ax, order in zip(axes[0], orders, strict=True):
        a = loop_addresses(order, C, H, W, R, S, steps)
        jumps = np.abs(np.diff(a))
        unit = float(np.mean(jumps == 1))
        changes = int(np.sum(np.diff(a // line_floats) != 0))
        ax.step(np.arange(len(a)), a, where="post", lw=1.2)
        for y in range(0, int(a.max()) + line_floats, line_floats):
            ax.axhline(y, color="0.85", lw=0.5, zorder=0)
        inner = dict(p=H - R + 1, q=W - S + 1, c=C, r=R, s=S)[order[-1]]
        what = ("independent outputs" if order[-1] in "pq" else "products into one sum")
        ax.set_title(f"loops {' > '.join(order)}: innermost runs {inner}× ({what})\n"
                     f"{100 * unit:.0f}% of steps are +1; {changes} cache-line switches",
                     fontsize=9)
        ax.set_xlabel("read number")
    axes[0][0].set_ylabel("offset into x (floats)")
    fig.tight_layout()
    return fig


def draw_blocking(P=8, Q=8, K=6, rows=2, kblock=3, C=3, R=3):
    """Cache blocking: one task computes `kblock` filters × `rows` output rows.

    Left: the C input planes with the (rows + R − 1) input rows that task reads; middle:
    the kblock filters; right: the K output planes with the task's tile. Each input row
    is loaded once and used by all kblock filters while it is in L1.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 3.0))
    H, Wd, sz = P + R - 1, Q + R - 1, 0.4
    r0 = 2  # first output row of the task
    x = 0.0
    for c in range(C):
        colors = [[CHANNEL_COLORS[c] if r0 <= i < r0 + rows + R - 1 else "white"
                   for _ in range(Wd)] for i in range(H)]
        _grid(ax, x, 0, H, Wd, colors, size=sz, lw=0.4)
        x += Wd * sz + 0.25
    ax.text(x / 2, H * sz + 0.5, f"input: {C} channels, the {rows + R - 1} rows one task reads",
            ha="center", va="top", fontsize=8)
    x += 0.6
    fx = x
    for k in range(kblock):
        for c in range(C):
            _grid(ax, x + c * (R * 0.25 + 0.05), k * (R * 0.25 + 0.25), R, R,
                  CHANNEL_COLORS[c], size=0.25, lw=0.4)
    x += C * (R * 0.25 + 0.05) + 0.6
    ax.text((fx + x - 0.6) / 2, H * sz + 0.5, f"{kblock} filters", ha="center", va="top",
            fontsize=8)
    ox = x
    for k in range(K):
        inb = k < kblock
        colors = [["#f7b2b2" if inb and r0 <= i < r0 + rows else "white" for _ in range(Q)]
                  for i in range(P)]
        _grid(ax, x, 0, P, Q, colors, size=0.3, lw=0.4)
        if inb:
            _frame(ax, x, r0 * 0.3, rows, Q, size=0.3, lw=1.5)
        x += Q * 0.3 + 0.2
    ax.text((ox + x) / 2, H * sz + 0.5, f"output: {K} planes; framed: {kblock} filters × {rows} "
            "rows = one task", ha="center", va="top", fontsize=8)
    _finish(ax, "cache blocking: a task's input rows stay in L1 while every filter of its block "
                "uses them")
    return fig


def draw_flat_tile(rows=3, Q=8, S=3, vector=4):
    """A tile of `rows` output rows stored with the input's row stride Wp = Q + S − 1.

    Top: row by row, each row's loop of Q ends in a partial SIMD vector (hatched) when Q is
    not a multiple of `vector`. Bottom: the same tile as one long row of rows·Wp − (S − 1)
    elements, cut into whole vectors; the S − 1 extra columns per row (grey) are computed
    and dropped.
    """
    plt = _plt()
    Wp = Q + S - 1
    fig, (a0, a1) = plt.subplots(2, 1, figsize=(min(12, 0.32 * rows * Wp + 2), 3.6),
                                 gridspec_kw=dict(height_ratios=[rows, 1.6]))
    full = Q // vector * vector
    for p in range(rows):
        colors = [["#8ecae6" if q < full else "#ffb703" for q in range(Q)]
                  + ["#dddddd"] * (S - 1)]
        _grid(a0, 0, p, 1, Wp, colors, [[f"{p * Wp + q}" for q in range(Wp)]], fontsize=6)
        for v0 in range(0, full, vector):
            _frame(a0, v0, p, 1, vector, color="k", lw=1.2)
    _finish(a0, f"row by row: {Q} outputs = {Q // vector} vectors of {vector} + a remainder "
                f"of {Q - full} (orange, scalar code) in every row; grey: not computed")
    L = (rows - 1) * Wp + Q
    colors = [["#dddddd" if i % Wp >= Q else "#8ecae6" for i in range(L)]]
    _grid(a1, 0, 0, 1, L, colors, [[str(i) for i in range(L)]], fontsize=5)
    for v0 in range(0, L - L % vector, vector):
        _frame(a1, v0, 0, 1, vector, color="k", lw=1.2)
    if L % vector:
        _frame(a1, L - L % vector, 0, 1, L % vector, color="#d62828", lw=1.2)
    _finish(a1, f"flat: one loop of {L} = {L // vector} vectors + {L % vector} per tile; grey: "
                f"the {S - 1} extra columns of each row (computed, dropped)")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------
# Measurements


def plot_timings(rows, title="", unit="ms", log=True, baseline=None):
    """Horizontal bars for [(label, ms[, GFLOP/s]), ...], fastest at the bottom.

    baseline: a label; each bar is annotated with its speed relative to that row.
    """
    plt = _plt()
    labels = [r[0] for r in rows]
    ms = np.array([r[1] for r in rows], dtype=float)
    base = ms[labels.index(baseline)] if baseline in labels else None
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.2))
    y = np.arange(len(rows))[::-1]
    ax.barh(y, ms, color=[CHANNEL_COLORS[i % 6] for i in range(len(rows))], ec="0.3")
    ax.set_yticks(y, labels)
    if log:
        ax.set_xscale("log")
    for yi, r, m in zip(y, rows, ms, strict=True):
        txt = (f" {m / 1e3:,.1f} s" if unit == "ms" and m >= 1e3 else f" {m:.3g} {unit}")
        if len(r) > 2 and r[2] is not None:
            txt += f", {r[2]:.3g} GFLOP/s"
        if base is not None:
            ratio = base / m
            txt += f", ×{ratio:,.0f}" if ratio >= 10 else f", ×{ratio:.2g}"
        ax.text(m, yi, txt, va="center", fontsize=8)
    ax.set_xlabel(f"time ({unit}, {'log scale' if log else 'linear'})"
                  + (f"; ×: speed-up over {baseline}" if base is not None else ""))
    ax.set_xlim(right=ms.max() * (30 if log else 1.6))
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_thread_sweep(results: dict, title="speed-up with threads"):
    """results: name -> [(threads, ms), ...]; plots speed-up over each one's 1-thread time."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    tmax = 1
    for name, pts in results.items():
        pts = sorted(pts)
        t = np.array([p[0] for p in pts])
        ms = np.array([p[1] for p in pts], dtype=float)
        ax.plot(t, ms[0] / ms, "o-", label=f"{name} (1 thread: {ms[0]:.3g} ms)")
        tmax = max(tmax, int(t.max()))
    ax.plot([1, tmax], [1, tmax], "k--", lw=0.8, label="ideal (linear)")
    ax.set_xlabel("threads")
    ax.set_ylabel("speed-up over 1 thread")
    ax.set_xticks(sorted({p[0] for pts in results.values() for p in pts}))
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_batch_crossover(batches, series: dict, title="time per image vs batch size"):
    """series: name -> ms per call at each batch; plots ms per image, log-log."""
    plt = _plt()
    b = np.asarray(batches, dtype=float)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, ms in series.items():
        ms = np.asarray(ms, dtype=float)
        ax.loglog(b, ms / b, "o-", label=name)
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per image")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def roofline(points, bandwidth_gbps: float, peak, peak_label: str = "fp32 peak",
             title: str = "roofline", ax=None, unit: str = "GFLOP/s"):
    """The roofline: a memory slope (`bandwidth_gbps`, GB/s) under one or several compute
    roofs, and the measured points. Returns the axes.

    peak: one compute ceiling (named `peak_label`) or a dict {label: ceiling} of several
    (fp32 CUDA cores, fp16 tensor cores...), in `unit` ('GFLOP/s' or 'TFLOP/s').
    points: ``(label, FLOP per byte, performance)`` tuples, each annotated, or dicts with
    keys ``ai``, ``tflops`` / ``gflops`` (per `unit`) and ``family``, drawn one marker
    and one legend entry per family.
    """
    plt = _plt()
    scale = {"GFLOP/s": 1.0, "TFLOP/s": 1e-3}[unit]  # GB/s x FLOP/byte -> unit
    roofs = dict(peak) if isinstance(peak, dict) else {peak_label: peak}
    roofs = {k: v for k, v in roofs.items() if v}
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.2) if len(roofs) == 1 else (9, 5))
    ridges = [p / (bandwidth_gbps * scale) for p in roofs.values()]
    ais = [p["ai"] if isinstance(p, dict) else p[1] for p in points]
    lo, hi = min(ais + ridges + [0.5]) / 4, max(ais + ridges) * 8
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    for (label, top), ridge, ls in zip(roofs.items(), ridges, ("-", "--", ":", "-."),
                                       strict=False):
        ax.loglog(grid, np.minimum(top, grid * bandwidth_gbps * scale), "k", ls=ls, lw=2)
        ax.annotate(f"{label}: {top:.4g} {unit}", (ridge * 1.2, top * 1.08), fontsize=8)
    ax.annotate(f"memory: {bandwidth_gbps:.4g} GB/s",
                (lo * 1.3, lo * 1.3 * bandwidth_gbps * scale * 1.25), fontsize=8, rotation=28)
    key = "tflops" if unit == "TFLOP/s" else "gflops"
    fams = list(dict.fromkeys(p["family"] for p in points if isinstance(p, dict)))
    for i, fam in enumerate(fams):
        ps = [p for p in points if isinstance(p, dict) and p["family"] == fam]
        ax.plot([p["ai"] for p in ps], [p[key] for p in ps], "osD^vP*X"[i % 8], ms=6,
                color=plt.cm.tab10.colors[i % 10], alpha=0.85, label=fam, ls="")
    for p in points:
        if not isinstance(p, dict):
            label, ai, perf = p
            ax.plot(ai, perf, "o")
            ax.annotate(label, (ai, perf), textcoords="offset points", xytext=(5, -10),
                        fontsize=8)
    if fams:
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3, which="both")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of compulsory traffic)")
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    return ax


# ----------------------------------------------------------------------------------------
# GPU pictures (lessons 04-06): threads -> outputs, layouts, halo tiles, banks

WARP_COLORS = ["#8ecae6", "#219ebc", "#ffb703", "#fb8500", "#b5e48c", "#52b69a",
               "#f4a3c0", "#c9184a"]


def draw_execution_model(P=10, Q=40, block=(32, 4), mapping="coalesced", show=(0, 1)):
    """The grid of blocks over a P x Q output, and which output each thread computes.

    block: (threads along x, threads along y). mapping='coalesced': thread x walks output
    columns (a warp = 32 neighbouring outputs of a row); 'naive': thread x walks output
    rows (a warp = 32 outputs of a column), as in conv01_naive. show: (block x, block y)
    of the block whose warps are coloured. Threads that fall outside the output idle
    (hatched). Returns the figure.
    """
    plt = _plt()
    bx, by = block
    along_q = mapping == "coalesced"
    nbx = -(-Q // bx) if along_q else -(-P // bx)
    nby = -(-P // by) if along_q else -(-Q // by)
    # cover the output with the blocks' footprint, including idle threads
    rows = nby * by if along_q else nbx * bx
    cols = nbx * bx if along_q else nby * by
    fig, ax = plt.subplots(figsize=(max(8, min(14, 0.25 * cols + 2)),
                                    min(9, 0.25 * rows + 1.8)))
    for p in range(rows):
        for q in range(cols):
            if along_q:
                gx, gy, tx, ty = q // bx, p // by, q % bx, p % by
            else:
                gx, gy, tx, ty = p // bx, q // by, p % bx, q % by
            tid = ty * bx + tx
            inside = p < P and q < Q
            if (gx, gy) == tuple(show):
                fc = WARP_COLORS[(tid // 32) % len(WARP_COLORS)]
            else:
                fc = "0.93" if (gx + gy) % 2 else "0.82"
            ax.add_patch(plt.Rectangle((q, p), 1, 1, fc=fc if inside else "white", ec="0.6",
                                       lw=0.3, hatch=None if inside else "////"))
    for gy in range(nby):
        for gx in range(nbx):
            if along_q:
                _frame(ax, gx * bx, gy * by, by, bx, color="0.2", lw=1.2)
            else:
                _frame(ax, gy * by, gx * bx, bx, by, color="0.2", lw=1.2)
    _frame(ax, 0, 0, P, Q, color=HIGHLIGHT, lw=2)
    _finish(ax)
    nwarps = -(-bx * by // 32)
    what = ("thread x -> output column q: a warp is 32 neighbours in a row"
            if along_q else "thread x -> output row p: a warp is 32 outputs of a column")
    ax.set_title(f"grid of {nbx}x{nby} blocks of {bx}x{by} threads over a {P}x{Q} output "
                 f"(red); block {tuple(show)}: its {nwarps} warps in colour\n{what}; "
                 "hatched: threads with no output (they return early)", fontsize=9)
    return fig


def draw_layouts(C=3, H=2, W=4, warp=4):
    """NCHW and NHWC of one image in memory, and the addresses that `warp` neighbouring
    threads read when thread i takes output column i of channel 0. Returns the figure."""
    plt = _plt()
    n = C * H * W
    fig, axes = plt.subplots(2, 1, figsize=(min(14, 0.5 * n + 2), 3.2))
    for ax, layout in zip(axes, ("NCHW", "NHWC"), strict=True):
        for k in range(n):
            if layout == "NCHW":
                c, h, w = k // (H * W), (k // W) % H, k % W
            else:
                h, w, c = k // (W * C), (k // C) % W, k % C
            read = c == 0 and h == 0 and w < warp
            _grid(ax, k, 0, 1, 1, CHANNEL_COLORS[c % len(CHANNEL_COLORS)],
                  [[f"{'chw'[0]}{c}\n{h},{w}"]], fontsize=5)
            if read:
                _frame(ax, k, 0, 1, 1, lw=2)
        idx = [k for k in range(n) if (k < warp if layout == "NCHW" else
                                        (k % C == 0 and k // C < warp))]
        span = idx[-1] - idx[0] + 1
        _finish(ax)
        ax.set_title(f"{layout}: threads 0..{warp - 1} read x[c=0, h=0, w=0..{warp - 1}] "
                     f"(red): {'contiguous' if span == warp else f'one float in every {C}'}, "
                     f"spread over {span} floats", fontsize=9)
    fig.tight_layout()
    return fig


def draw_halo_tile(H=12, W=20, tile=(8, 4), kernel_hw=3, block=(1, 1), v=1, pad=0):
    """A block's output tile, the input tile it stages in shared memory (tile + halo), and
    that tile as laid out in shared memory (row pitch = width + pad).

    tile: (output columns, output rows) per block; v: outputs per thread down a column
    (the thread of column 0 is marked). Returns the figure.
    """
    plt = _plt()
    R, S = ref.pair(kernel_hw, "kernel size")
    tw, th = tile
    bx, by = block
    hr, hs = R // 2, S // 2
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.6),
                                  gridspec_kw=dict(width_ratios=[W + 2 * hs + 2, tw + S + pad]))
    # the image with its zero-padding ring
    for i in range(-hr, H + hr):
        for j in range(-hs, W + hs):
            inside = 0 <= i < H and 0 <= j < W
            ax.add_patch(plt.Rectangle((j, i), 1, 1, fc="white" if inside else "0.9",
                                       ec="0.75", lw=0.3))
    y0, x0 = by * th, bx * tw
    for i in range(y0 - hr, y0 + th + hr):
        for j in range(x0 - hs, x0 + tw + hs):
            halo = not (y0 <= i < y0 + th and x0 <= j < x0 + tw)
            ax.add_patch(plt.Rectangle((j, i), 1, 1, fc="#ffb703" if halo else "#8ecae6",
                                       ec="0.5", lw=0.4, alpha=0.9))
    _frame(ax, x0, y0, th, tw, lw=2.2)
    _frame(ax, x0 - hs, y0 - hr, th + 2 * hr, tw + 2 * hs, color="#023047", lw=1.6)
    ax.text(x0 + tw / 2, y0 - hr - 0.6, "input tile = output tile + halo", ha="center",
            fontsize=8, color="#023047")
    _finish(ax, f"image {H}x{W} (grey ring: zero padding), block {block}: output tile "
                f"{tw}x{th} (red), halo {hr} rows / {hs} columns (orange)")
    # the shared-memory copy
    hi, wi = th + R - 1, tw + S - 1
    for i in range(hi):
        for j in range(wi + pad):
            if j >= wi:
                fc = "0.85"
            else:
                halo = not (hr <= i < hr + th and hs <= j < hs + tw)
                fc = "#ffb703" if halo else "#8ecae6"
            ax2.add_patch(plt.Rectangle((j, i), 1, 1, fc=fc, ec="0.5", lw=0.4))
    for r in range(min(v, th)):
        ax2.add_patch(plt.Rectangle((hs, hr + r), 1, 1, fill=False, ec=HIGHLIGHT, lw=1.6))
    _frame(ax2, 0, 0, min(v, th) + R - 1, S, color=HIGHLIGHT, lw=1, ls="--")
    _finish(ax2, f"in shared memory: {hi}x{wi}" + (f" + {pad} padding column(s)" if pad else "")
             + f"\nthread 0's {min(v, th)} output(s) (red) read the dashed window")
    fig.tight_layout()
    return fig


def draw_plane_tiles(G=3, H=5, W=5, pad=1, threads=8, v=2):
    """Depthwise through shared memory: G whole planes, contiguous in global memory (top),
    copied by consecutive threads into G zero-padded tiles in shared memory (bottom).

    threads: the width of one copy pass (framed in red on both sides); v: outputs per thread
    down a column (thread 0's read window is dashed). Returns the figure.
    """
    plt = _plt()
    n = G * H * W
    Hp, Wp = H + 2 * pad, W + 2 * pad
    width = max(n, G * (Wp + 1))
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(min(14, 0.22 * width + 2), 4.2),
                                  gridspec_kw=dict(height_ratios=[1.2, Hp + 1.5]))
    colors = [[CHANNEL_COLORS[i // (H * W) % len(CHANNEL_COLORS)] for i in range(n)]]
    _grid(ax, 0, 0, 1, n, color=colors)
    for g in range(G):
        ax.text(g * H * W + H * W / 2, 1.8, f"plane {g} ({H}x{W})", ha="center", fontsize=8)
    _frame(ax, 0, 0, 1, min(threads, n), lw=1.8)
    _finish(ax, f"global memory (NCHW): the block's {G} planes are one contiguous range; one "
                f"copy pass = {threads} consecutive threads on {threads} consecutive addresses")
    for g in range(G):
        x0 = g * (Wp + 1)
        fc = [["0.88" if not (pad <= i < pad + H and pad <= j < pad + W)
               else CHANNEL_COLORS[g % len(CHANNEL_COLORS)] for j in range(Wp)] for i in range(Hp)]
        lab = [["0" if fc[i][j] == "0.88" else "" for j in range(Wp)] for i in range(Hp)]
        _grid(ax2, x0, 0, Hp, Wp, color=fc, labels=lab, fontsize=6)
        first = range(min(threads, n) - g * H * W)
        for t in first:
            if 0 <= t < H * W:
                _frame(ax2, x0 + pad + t % W, pad + t // W, 1, 1, lw=1.2)
    _frame(ax2, 0, 0, min(v, H) + 2 * pad, 2 * pad + 1, color="#023047", lw=1.4, ls="--")
    _finish(ax2, f"shared memory: {G} tiles of {Hp}x{Wp} with a ring of zeros (the padding), so "
                 f"computing needs no bounds tests; thread 0's {min(v, H)} outputs read the dashed "
                 "window")
    fig.tight_layout()
    return fig


def draw_row_strips(H=10, V=2, lanes=16, show=1):
    """The filter's strips (filter03_cuda, depthwise04_strips_cuda): H image rows x one
    warp's lanes (a cell is one lane's float4, 4 columns), rows grouped into strips of V,
    one warp each, coloured by strip; even strips walk down, odd ones up (arrows). Strip
    `show`'s read window (its V rows and the R - 1 = 2 halo rows of a 3x3 filter) is
    dashed; the halo columns of lanes 0 and lanes - 1 (read from memory, the rest come by
    shuffle) are framed. Returns the figure."""
    plt = _plt()
    strips = -(-H // V)
    fig, ax = plt.subplots(figsize=(min(12, 0.42 * lanes + 3), 0.32 * H + 1.4))
    colors = [[CHANNEL_COLORS[(i // V) % len(CHANNEL_COLORS)] for _ in range(lanes)]
              for i in range(H)]
    _grid(ax, 0, 0, H, lanes, color=colors)
    for k in range(strips):
        y0, y1 = k * V, min(H, (k + 1) * V)
        ax.text(-0.6, (y0 + y1) / 2, f"strip {k} {'↑' if k % 2 else '↓'}", ha="right",
                va="center", fontsize=7)
    top = max(0, show * V - 1)
    bottom = min(H, (show + 1) * V + 1)
    _frame(ax, -0.15, top, bottom - top, lanes + 0.3, color="#023047", lw=1.4, ls="--")
    for x in (0, lanes - 1):
        _frame(ax, x, top, bottom - top, 1, lw=1.6)
    for j in range(lanes):
        ax.text(j + 0.5, -0.35, str(j), ha="center", fontsize=6)
    _finish(ax, f"one warp per strip of {V} rows (a cell: one lane's float4); strip {show} "
                f"reads the dashed {bottom - top} rows at once; only lanes 0 and "
                f"{lanes - 1} (red) read halo columns, the others get them by shuffle")
    fig.tight_layout()
    return fig


def draw_window_loads(runs, H=5, W=14, v=4, first=40, lw=4, R=3, S=3):
    """The window of one thread of depthwise05_window_cuda on an H x W plane (a cell is a
    float; the plane is flattened row by row). The thread's v outputs start at flat index
    `first` (red frames); `runs` (from `depthwise05_window_cuda.window_runs`) gives, per
    filter row r, the first float and the count of lw-float vectors it loads: filled, one
    colour per r, each labelled with r and its vector number, a dark bar where a vector
    starts. Flat runs wrap from one row to the next. Cells the next thread (outputs at
    first + v) loads too are hatched: the overlap L1/L2 are meant to serve. Returns the
    figure."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(min(12, 0.5 * W + 1.5), 0.5 * H + 1.6))
    colors = [["white"] * W for _ in range(H)]
    labels = [[""] * W for _ in range(H)]
    starts = []
    for r, (lo, count) in enumerate(runs):
        for k in range(count):
            for j in range(lw):
                f = first + lo + k * lw + j
                if 0 <= f < H * W:
                    colors[f // W][f % W] = CHANNEL_COLORS[r % len(CHANNEL_COLORS)]
                    labels[f // W][f % W] = f"{r}.{k}" if j == 0 else ""
                    if j == 0:
                        starts.append((f // W, f % W))
    _grid(ax, 0, 0, H, W, color=colors, labels=labels, fontsize=6)

    def loaded(f0):
        return {f0 + lo + k * lw + j for lo, count in runs for k in range(count)
                for j in range(lw)}

    for f in sorted(loaded(first) & loaded(first + v)):
        if 0 <= f < H * W:
            ax.add_patch(plt.Rectangle((f % W, f // W), 1, 1, fill=False, hatch="///",
                                       ec="0.35", lw=0))
    for i, j in starts:
        ax.plot([j, j], [i, i + 1], color="#023047", lw=2.4)
    for o in range(v):
        f = first + o
        if 0 <= f < H * W:
            _frame(ax, f % W, f // W, 1, 1)
    for j in range(W):
        ax.text(j + 0.5, H + 0.45, str(j), ha="center", fontsize=6)
    for i in range(H):
        ax.text(-0.4, i + 0.5, str(i), ha="right", va="center", fontsize=6)
    n = sum(c for _, c in runs)
    _finish(ax, f"one thread's {v} outputs (red: flat {first}..{first + v - 1}) and the {n} "
                f"{4 * lw}-byte vectors it loads\n(label: filter row r . vector, colour: r; "
                f"hatched: the next thread loads it too; taps outside the plane count zero)")
    fig.tight_layout()
    return fig


def draw_banks(pitch=32, rows=8, cols=32):
    """A shared-memory tile with row pitch `pitch` floats, coloured by bank, and the 32
    words one warp reads when thread i reads row i of column 0 (a column read).

    pitch=32: every word of the column is in bank 0 (32-way conflict); pitch=33: 32
    different banks. Returns the figure.
    """
    plt = _plt()
    cmap = plt.get_cmap("tab20")
    n_read = 32
    fig, ax = plt.subplots(figsize=(9, 3.4))
    shown = max(rows, 1)
    for i in range(shown):
        for j in range(pitch):
            word = i * pitch + j
            bank = word % 32
            ax.add_patch(plt.Rectangle((j, i), 1, 1, fc=cmap(bank % 20) if j < cols else "0.85",
                                       ec="0.6", lw=0.3, alpha=0.55 if j < cols else 1))
            if j == 0:
                ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, ec=HIGHLIGHT, lw=1.8))
            ax.text(j + 0.5, i + 0.5, str(bank), ha="center", va="center", fontsize=5)
    banks = sorted({(i * pitch) % 32 for i in range(n_read)})
    ways = n_read // len(banks)
    _finish(ax, f"row pitch {pitch} floats (numbers: bank = word address mod 32)\nA warp "
                f"reading column 0 of {n_read} rows touches {len(banks)} bank(s): "
                + ("no conflict" if ways == 1 else f"{ways}-way conflict")
                + f" (first {shown} rows shown" + (", grey: padding)" if pitch > cols else ")"))
    return fig


def _source_lines(obj) -> list:
    """Source lines of a function, a kernel (GPU or simulator) or a module."""
    import inspect

    fn = getattr(obj, "py_func", None) or getattr(obj, "fn", None) or obj
    return inspect.getsource(fn).splitlines()


def show_code(obj, start: str | None = None, end: str | None = None):
    """Source of a function, kernel (GPU or simulator) or module, syntax-highlighted.

    start / end: show the source from the first line containing `start` up to (not
    including) the first later line containing `end`. Returns an IPython `Code` object
    (a notebook cell shows it highlighted; print() gives the plain text).
    """
    from IPython.display import Code

    lines = _source_lines(obj)
    if start is not None:
        lines = lines[next(i for i, ln in enumerate(lines) if start in ln):]
    if end is not None:
        stop = next((i for i, ln in enumerate(lines) if i > 0 and end in ln), len(lines))
        lines = lines[:stop]
    return Code("\n".join(lines), language="python")


def show_diff(before, after, context: int = 2):
    """What `after` changes in `before` (two functions, kernels or modules), as a unified
    diff of their sources: the one idea a ladder rung adds to the rung below it."""
    import difflib

    from IPython.display import Code

    a, b = _source_lines(before), _source_lines(after)
    name = lambda o: getattr(o, "__name__", type(o).__name__)  # noqa: E731
    diff = difflib.unified_diff(a, b, name(before), name(after), n=context, lineterm="")
    return Code("\n".join(diff), language="diff")


def draw_warp_tiles(TX: int = 16, TY: int = 8):
    """Which warp each thread of a TX x TY thread grid belongs to (one colour per warp),
    with threads as rows of TX (left) and as 8 x 4 patches (right, a warp-tiled kernel);
    each thread owns one register block of the block tile. Returns the figure."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 2.6 + 0.15 * TY))
    WX = TX // 8
    rows = np.zeros((TY, TX), int)
    patches = np.zeros((TY, TX), int)
    for tid in range(TX * TY):
        rows[tid // TX, tid % TX] = tid >> 5
        lane, warp = tid & 31, tid >> 5
        tx = ((warp % WX) << 3) | (lane & 7)
        ty = ((warp // WX) << 2) | (lane >> 3)
        patches[ty, tx] = warp
    n_warps = TX * TY // 32
    for ax, grid, title in ((axes[0], rows, "warps as rows of threads"),
                            (axes[1], patches, "warps as 8 x 4 patches (warp tiling)")):
        ax.imshow(grid, cmap="tab10", vmin=0, vmax=max(9, n_warps - 1))
        for (r, c), w in np.ndenumerate(grid):
            ax.text(c, r, str(w), ha="center", va="center", fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
        span_x = [len(set(np.nonzero(grid == w)[1])) for w in range(n_warps)]
        span_y = [len(set(np.nonzero(grid == w)[0])) for w in range(n_warps)]
        ax.set_title(f"{title}\na warp covers {span_x[0]} thread columns (pixels) x "
                     f"{span_y[0]} rows (filters)", fontsize=9)
        ax.set_xlabel(f"thread x (pixels), TX = {TX}")
        ax.set_ylabel(f"thread y (filters), TY = {TY}")
    fig.tight_layout()
    return fig


def draw_launch_timeline(launch_us: float, kernels, n: int = 6):
    """CPU launches and GPU execution, one panel per kernel.

    launch_us: CPU time of one launch from Python; kernels: [(label, GPU µs), ...]. Kernel i
    starts when it has been launched and kernel i-1 has finished. Returns the figure.
    """
    plt = _plt()
    fig, axes = plt.subplots(len(kernels), 1, figsize=(9, 1.7 * len(kernels) + 0.3),
                             squeeze=False)
    for ax, (label, k_us) in zip(axes[:, 0], kernels, strict=True):
        t_gpu = 0.0
        busy = 0.0
        for i in range(n):
            ax.add_patch(plt.Rectangle((i * launch_us, 1.1), launch_us * 0.95, 0.7,
                                       fc="#ffb703", ec="0.3", lw=0.5))
            start = max((i + 1) * launch_us, t_gpu)
            ax.add_patch(plt.Rectangle((start, 0.1), k_us, 0.7, fc="#219ebc", ec="0.3", lw=0.5))
            t_gpu = start + k_us
            busy += k_us
        end = max(t_gpu, n * launch_us)
        ax.set_xlim(0, end * 1.02)
        ax.set_ylim(0, 2)
        ax.set_yticks([0.45, 1.45], ["GPU", "CPU"])
        ax.set_xlabel("µs")
        idle = 1 - busy / (t_gpu - launch_us)
        ax.set_title(f"{label}: kernel {k_us:.3g} µs, launch {launch_us:.3g} µs of CPU; "
                     f"GPU idle {100 * idle:.0f}% of the time after the first launch",
                     fontsize=9)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------
# Lessons 07-09: register blocks, implicit GEMM, the last mile


def _thread_rows(T, H, first, split):
    """Rows (or columns) of a block tile of size T that a thread with index `first`
    owns: H of them in a run, or (split) two runs of H/2 half a tile apart."""
    if not split:
        return [first * H + i for i in range(H)]
    h = H // 2
    return [first * h + i for i in range(h)] + [T // 2 + first * h + i for i in range(h)]


def draw_register_block(BM=16, BN=16, BK=4, TM=4, TN=4, thread=(1, 2), k=1, split=False):
    """The outer product of register blocking, drawn as C (BM x BN) = A slab @ B slab.

    A block computes a BM x BN tile of C; thread (tx, ty) keeps a TM x TN block of it in
    registers. For each k of the BK-wide slab it loads TM values of A's column k and TN
    values of B's row k (red) and does TM * TN multiply-adds into its block (red), an
    outer product. split=True: the thread's rows and columns are two runs of TM/2 (TN/2)
    half a tile apart (lesson 09's conflict-free, 128-bit layout). Returns the figure.
    """
    plt = _plt()
    for v, what in ((BM, "BM"), (BN, "BN")):
        if v % (TM if what == "BM" else TN):
            raise ValueError(f"{what} must be a multiple of the thread tile")
    tx, ty = thread
    if not (0 <= tx < BN // TN and 0 <= ty < BM // TM):
        raise ValueError(f"thread {thread} outside the {BN // TN}x{BM // TM} thread grid")
    rows = _thread_rows(BM, TM, ty, split)
    cols = _thread_rows(BN, TN, tx, split)
    fig, ax = plt.subplots(figsize=(7.2, 6.4))
    light, hot = "#e8f1f8", "#f7b2b2"
    # A slab (left of C), B slab (above C), C tile
    ox, oy = BK + 1.0, BK + 1.0
    a_col = [[hot if (i in rows and j == k) else (light if j == k else "white")
              for j in range(BK)] for i in range(BM)]
    _grid(ax, 0, oy, BM, BK, a_col, lw=0.4)
    b_col = [[hot if (j in cols and i == k) else (light if i == k else "white")
              for j in range(BN)] for i in range(BK)]
    _grid(ax, ox, 0, BK, BN, b_col, lw=0.4)
    c_col = [[hot if (i in rows and j in cols) else "white" for j in range(BN)]
             for i in range(BM)]
    _grid(ax, ox, oy, BM, BN, c_col, lw=0.3, edge="0.75")
    for i in range(0, BM + 1, TM if not split else TM // 2):
        ax.plot([ox, ox + BN], [oy + i, oy + i], color="0.45", lw=0.6)
    for j in range(0, BN + 1, TN if not split else TN // 2):
        ax.plot([ox + j, ox + j], [oy, oy + BM], color="0.45", lw=0.6)
    _frame(ax, 0, oy, BM, BK, color="0.2", lw=1.2)
    _frame(ax, ox, 0, BK, BN, color="0.2", lw=1.2)
    _frame(ax, ox, oy, BM, BN, color="0.2", lw=1.2)
    ax.text(BK / 2, oy - 0.4, f"A slab\n{BM}x{BK}", ha="center", va="bottom", fontsize=8)
    ax.text(ox - 0.3, BK / 2, f"B slab {BK}x{BN}", ha="right", va="center", fontsize=8)
    ax.text(k + 0.5, oy + BM + 0.3, f"k={k}", ha="center", va="top", fontsize=7,
            color=HIGHLIGHT)
    ax.text(ox + BN + 0.3, k + 0.5, f"k={k}", ha="left", va="center", fontsize=7,
            color=HIGHLIGHT)
    loads, fmas = TM + TN, TM * TN
    how = f"two runs of {TM // 2}, half a tile apart" if split else "one run each"
    _finish(ax, f"C tile {BM}x{BN}: {BN // TN}x{BM // TM} threads, each keeps a {TM}x{TN} "
                f"block in registers\n(thread {thread} in red, {how})\nper k: {TM} + {TN} = "
                f"{loads} loads, {fmas} FMAs: {fmas / loads:.1f} FMAs per load (one output "
                "per thread: 0.5)")
    return fig


def occupancy(regs_per_thread: int, threads_per_block: int, smem_per_block: int = 0,
              max_warps: int = 64, max_blocks: int = 32, regs_per_sm: int = 65536,
              smem_per_sm: int = 228 * 1024, reg_unit: int = 256) -> dict:
    """Resident blocks and warps per SM for a kernel (limits of compute capability 9.0).

    Registers are allocated per warp in units of `reg_unit` (32 threads x regs rounded up);
    the block count is the smallest of the register, shared-memory, warp and block
    limits. Returns dict(blocks, warps, occupancy (fraction of max_warps), limited_by).
    """
    warps_pb = -(-threads_per_block // 32)
    per_warp = -(-regs_per_thread * 32 // reg_unit) * reg_unit
    limits = {"registers": (regs_per_sm // per_warp) // warps_pb,
              "warps": max_warps // warps_pb, "blocks": max_blocks}
    if smem_per_block:
        limits["shared memory"] = smem_per_sm // (smem_per_block + 1024)  # 1 KB reserved
    if regs_per_thread > 255:
        limits["registers"] = 0
    blocks = min(limits.values())
    by = min(limits, key=lambda k: (limits[k], k == "registers"))  # ties: the hard cap
    return dict(blocks=blocks, warps=blocks * warps_pb, occupancy=blocks * warps_pb / max_warps,
                limited_by=by)


def plot_occupancy(points, threads_per_block=128, title=None):
    """Warps per SM against registers per thread for one block size, with kernels on it.

    points: [(label, registers per thread[, threads per block]), ...]; a point with its own
    block size is placed on its own curve value. Returns the figure.
    """
    plt = _plt()
    regs = np.arange(16, 256)
    warps = [occupancy(int(r), threads_per_block)["warps"] for r in regs]
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    ax.step(regs, warps, where="post", color="0.3", lw=1.4,
            label=f"{threads_per_block} threads per block")
    for i, p in enumerate(points):
        label, r = p[0], int(p[1])
        t = int(p[2]) if len(p) > 2 else threads_per_block
        w = occupancy(r, t)["warps"]
        ax.plot(r, w, "o", color=WARP_COLORS[(2 * i + 1) % len(WARP_COLORS)], ms=7)
        ax.annotate(f"{label}\n{r} regs, {w} warps", (r, w), textcoords="offset points",
                    xytext=(4, 6 + 14 * (i % 3)), fontsize=7)
    ax.set_xlabel("registers per thread")
    ax.set_ylabel("resident warps per SM (max 64)")
    ax.set_ylim(0, 70)
    ax.set_xlim(16, 262)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title or "more registers per thread, fewer warps to hide latency "
                 "(65,536 registers per SM)", fontsize=9)
    fig.tight_layout()
    return fig


def draw_implicit_gemm(C=2, H=4, W=4, R=3, S=3, padding=1, tap=(1, 0), c0=0, BK=2, BN=8,
                       j0=0):
    """Implicit GEMM: the slab of the (never stored) im2col matrix a block builds.

    The reduction is ordered (r, s, c): rows of the virtual column matrix are grouped by
    filter tap, C channels per tap. A slab is BK rows (tap `tap`, channels c0..c0+BK-1)
    by BN columns (output pixels j0..j0+BN-1, stride 1). Left: the input planes, the
    pixels that slab reads framed (zeros where it reads the padding); middle: the virtual
    column matrix, grey, with the slab in colour; right: the slab in shared memory, the
    only part that exists. Returns the figure.
    """
    plt = _plt()
    r, s = tap
    P, Q = ref.conv2d_output_shape((H, W), (R, S), 1, padding)
    if not (0 <= r < R and 0 <= s < S and 0 <= c0 and c0 + BK <= C and j0 + BN <= P * Q):
        raise ValueError("tap, channels or pixels outside the problem")
    letters = "abcdefgh"

    def source(c, j):
        p, q = divmod(j, Q)
        h, w = p - padding + r, q - padding + s
        return (h, w) if 0 <= h < H and 0 <= w < W else None

    fig, (a_in, a_mat, a_slab) = plt.subplots(
        1, 3, figsize=(13, 4.6), gridspec_kw=dict(width_ratios=[C * (W + 1), P * Q + 4, BN + 2]))
    for c in range(C):
        x0 = c * (W + 1)
        read = {source(c, j) for j in range(j0, j0 + BN)} if c0 <= c < c0 + BK else set()
        cols = [[CHANNEL_COLORS[c % 6] if (i, j) in read else "white" for j in range(W)]
                for i in range(H)]
        labels = [[f"{letters[c]}{i * W + j}" for j in range(W)] for i in range(H)]
        _grid(a_in, x0, 0, H, W, cols, labels, fontsize=6)
        a_in.text(x0 + W / 2, H + 0.6, f"channel {c}", ha="center", fontsize=8)
    _finish(a_in, f"input {C}x{H}x{W} (pad {padding}): pixels\nthe slab reads for tap "
                  f"(r, s) = {tap}")
    rows = R * S * C
    sz = 1.0
    first = (r * S + s) * C + c0
    for i in range(rows):
        for j in range(P * Q):
            inside = first <= i < first + BK and j0 <= j < j0 + BN
            fc = CHANNEL_COLORS[(i % C) % 6] if inside else "0.92"
            a_mat.add_patch(plt.Rectangle((j * sz, i * sz), sz, sz, fc=fc, ec="0.75", lw=0.3))
    _frame(a_mat, j0, first, BK, BN)
    for t in range(R * S):
        a_mat.text(-0.3, t * C + C / 2, f"({t // S},{t % S})", ha="right", va="center",
                   fontsize=5)
    for j in range(0, P * Q, 4):
        a_mat.text(j + 0.5, rows + 0.6, str(j), ha="center", va="center", fontsize=6)
    _finish(a_mat, f"the im2col matrix: {rows} rows (r, s, c) x {P * Q} output pixels\nnever "
                   f"stored: a block builds one {BK}x{BN} slab at a time (red)")
    labels = []
    cols = []
    for kk in range(BK):
        c = c0 + kk
        row_l, row_c = [], []
        for j in range(j0, j0 + BN):
            src = source(c, j)
            row_l.append("0" if src is None else f"{letters[c]}{src[0] * W + src[1]}")
            row_c.append("#eeeeee" if src is None else CHANNEL_COLORS[c % 6])
        labels.append(row_l)
        cols.append(row_c)
    _grid(a_slab, 0, 0, BK, BN, cols, labels, fontsize=7)
    for kk in range(BK):
        a_slab.text(-0.2, kk + 0.5, f"c={c0 + kk}", ha="right", va="center", fontsize=7)
    for j in range(BN):
        a_slab.text(j + 0.5, BK + 0.5, f"{j0 + j}", ha="center", va="center", fontsize=6)
    _finish(a_slab, "in shared memory: the B slab [c][pixel]\nthread j loads column j "
                    "(coalesced)")
    fig.tight_layout()
    return fig


def draw_double_buffering(load_us=1.0, compute_us=1.4, sync_us=0.15, n=4):
    """Timelines of a tiled kernel's block: one shared buffer against two.

    One buffer: load slab t (global -> shared), barrier, compute on it, barrier, and only
    then load slab t+1. Two buffers with a register prefetch: the loads of slab t+1 are
    in flight while slab t is computed; one barrier per slab. Times in arbitrary units
    (a block's view; other blocks on the SM can also fill the gaps). Returns the figure.
    """
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(9, 3.6), sharex=True)
    load_c, comp_c, sync_c = "#ffb703", "#219ebc", "0.35"
    # single buffer
    t = 0.0
    for i in range(n):
        axes[0].add_patch(plt.Rectangle((t, 1.1), load_us, 0.7, fc=load_c, ec="0.3", lw=0.5))
        axes[0].text(t + load_us / 2, 1.45, f"load {i}", ha="center", va="center", fontsize=7)
        t += load_us
        axes[0].add_patch(plt.Rectangle((t, 0.1), sync_us, 1.7, fc=sync_c, ec="none"))
        t += sync_us
        axes[0].add_patch(plt.Rectangle((t, 0.1), compute_us, 0.7, fc=comp_c, ec="0.3",
                                        lw=0.5))
        axes[0].text(t + compute_us / 2, 0.45, f"FMAs {i}", ha="center", va="center",
                     fontsize=7, color="white")
        t += compute_us
        axes[0].add_patch(plt.Rectangle((t, 0.1), sync_us, 1.7, fc=sync_c, ec="none"))
        t += sync_us
    single = t
    # double buffer: load 0, then each step: issue load i+1, compute i, store, one barrier
    t = 0.0
    axes[1].add_patch(plt.Rectangle((t, 1.1), load_us, 0.7, fc=load_c, ec="0.3", lw=0.5))
    axes[1].text(t + load_us / 2, 1.45, "load 0", ha="center", va="center", fontsize=7)
    t += load_us
    axes[1].add_patch(plt.Rectangle((t, 0.1), sync_us, 1.7, fc=sync_c, ec="none"))
    t += sync_us
    for i in range(n):
        if i + 1 < n:
            axes[1].add_patch(plt.Rectangle((t, 1.1), load_us, 0.7, fc=load_c, ec="0.3",
                                            lw=0.5, alpha=0.85))
            axes[1].text(t + load_us / 2, 1.45, f"load {i + 1}", ha="center", va="center",
                         fontsize=7)
        axes[1].add_patch(plt.Rectangle((t, 0.1), compute_us, 0.7, fc=comp_c, ec="0.3",
                                        lw=0.5))
        axes[1].text(t + compute_us / 2, 0.45, f"FMAs {i}", ha="center", va="center",
                     fontsize=7, color="white")
        t += max(compute_us, load_us if i + 1 < n else 0.0)
        axes[1].add_patch(plt.Rectangle((t, 0.1), sync_us, 1.7, fc=sync_c, ec="none"))
        t += sync_us
    double = t
    for ax, name, total in ((axes[0], "one buffer", single), (axes[1], "two buffers", double)):
        ax.set_ylim(0, 2)
        ax.set_yticks([0.45, 1.45], ["math", "memory"])
        ax.set_title(f"{name}: {n} slabs in {total:.2g} time units", fontsize=9)
    axes[1].set_xlim(0, single * 1.02)
    axes[1].set_xlabel(f"time (a slab's loads {load_us:g}, its FMAs {compute_us:g}, a barrier "
                       f"{sync_us:g}: grey)")
    fig.suptitle(f"double buffering: the loads of slab t+1 overlap the FMAs of slab t "
                 f"({single / double:.2f}x shorter here)", fontsize=10)
    fig.tight_layout()
    return fig


def vector_read_wavefronts(per_thread=8, split=False, threads=8) -> int:
    """Shared-memory wavefronts for one 128-bit read instruction of `threads` threads
    (a quarter warp, served together), thread t reading 4 floats at word
    t*per_thread (split=False) or t*per_thread/2 (split=True: runs of 4 half a tile apart).
    """
    words = []
    for t in range(threads):
        base = t * (per_thread // 2 if split else per_thread)
        words += [base + i for i in range(4)]
    banks = {}
    for w in set(words):
        banks.setdefault(w % 32, set()).add(w)
    return max(len(v) for v in banks.values())


def draw_vector_reads(per_thread=8):
    """Which banks a quarter warp's first 128-bit read touches, for a thread's
    `per_thread` values stored in one run (left) or as two runs of 4 half a tile apart
    (right). A 128-bit read is served 8 threads (128 bytes) at a time; two threads in one
    bank at different words cost an extra wavefront. Returns the figure."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 2.3))
    for ax, split in zip(axes, (False, True), strict=True):
        step = per_thread // 2 if split else per_thread
        n_words = max(64, 8 * step + 4)
        rows = -(-n_words // 32)
        owner = {t * step + i: t for t in range(8) for i in range(4)}
        for w in range(rows * 32):
            t = owner.get(w)
            fc = WARP_COLORS[t % len(WARP_COLORS)] if t is not None else "white"
            ax.add_patch(plt.Rectangle((w % 32, w // 32), 1, 1, fc=fc, ec="0.6", lw=0.3))
            if t is not None:
                ax.text(w % 32 + 0.5, w // 32 + 0.5, f"t{t}", ha="center", va="center",
                        fontsize=5)
        for b in range(0, 32, 4):
            ax.text(b + 0.5, -0.4, str(b), ha="center", fontsize=6)
        wf = vector_read_wavefronts(per_thread, split)
        how = (f"two runs of 4 (thread t at word {step}t and BN/2 + {step}t)" if split
               else f"one run of {per_thread} (thread t at word {per_thread}t)")
        _finish(ax, f"{how}\nfirst 128-bit read of threads t0-t7: {wf} wavefront"
                    + ("s (a 2-way conflict)" if wf > 1 else " (conflict-free)"))
        ax.set_ylim(rows + 0.2, -1.0)
    fig.suptitle("one row = 32 banks of 4 bytes; colour: the thread that reads the word",
                 fontsize=9)
    fig.tight_layout()
    return fig


def chunk_owners(BM=8, BK=8, threads=8) -> dict:
    """gemm05's A slab: (row m, first k of a 4-float chunk) -> the thread that loads it.
    Thread t takes chunk t % (BK / 4) of rows t // (BK / 4), + threads / (BK / 4), ...
    (`gemm05_wide_loads`: row_a = t >> LCA, k_a = (t & (CA - 1)) << 2, rows RA apart)."""
    ca = BK // 4
    ra = threads // ca
    return {(t // ca + ld * ra, (t % ca) * 4): t
            for t in range(threads) for ld in range(BM * ca // threads)}


def draw_chunk_loads(BM=8, BK=8, threads=8):
    """gemm05's 16-byte loads of one A slab (BM rows x BK k's, a cell a float): left, the
    slab as it lies in global memory, each 4-float chunk framed (one ``ld.global.v4.f32``)
    and coloured by the thread that loads it; right, shared memory's ``As[k][m]``, where
    the thread stores the same four floats as a column (transposed, so that the compute
    loop reads a thread's m values along a row). Returns the figure."""
    plt = _plt()
    owner = chunk_owners(BM, BK, threads)
    fig, (left, right) = plt.subplots(1, 2, figsize=(min(12, 0.45 * (BK + BM) + 3),
                                                     0.45 * max(BM, BK) + 2.2))
    for (m, k0), t in owner.items():
        col = WARP_COLORS[t % len(WARP_COLORS)]
        for j in range(4):
            left.add_patch(plt.Rectangle((k0 + j, m), 1, 1, fc=col, ec="0.6", lw=0.3))
            right.add_patch(plt.Rectangle((m, k0 + j), 1, 1, fc=col, ec="0.6", lw=0.3))
        left.text(k0 + 0.5, m + 0.5, f"t{t}", ha="center", va="center", fontsize=6)
        right.text(m + 0.5, k0 + 0.5, f"t{t}", ha="center", va="center", fontsize=6)
        _frame(left, k0, m, 1, 4, color="#023047", lw=1.6)
        _frame(right, m, k0, 4, 1, color="#023047", lw=1.6)
    _finish(left, f"A's slab in global memory ({BM} rows m x {BK} k's): one 16-byte load\n"
                  f"per framed chunk of 4 floats along k, {len(owner) // threads} per thread")
    _finish(right, "As[k][m] in shared memory: each chunk stored as a column\n"
                   "(four 4-byte stores), so a thread's m values lie along a row")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------
# Precisions and tensor cores (lesson 12), the capstone's charts (lesson 13)


def plot_accuracy_speed(rows: list, title: str = "accuracy vs speed"):
    """Speed-up over fp32 (x) against relative L2 error (y, log): one point per version."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for r in rows:
        sp = r.get("speedup_vs_fp32") or 1.0
        ax.plot(sp, max(r["rel_l2"], 1e-9), "o", ms=7)
        ax.annotate(r["name"], (sp, max(r["rel_l2"], 1e-9)), textcoords="offset points",
                    xytext=(6, 3), fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("speed-up over fp32 (TF32 off), same run")
    ax.set_ylabel("relative L2 error vs float64")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_formats(fmts=("fp32", "tf32", "bf16", "fp16", "fp8 e4m3")):
    """The bit layouts of the formats, drawn to scale: sign, exponent, mantissa."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(9, 0.55 * len(fmts) + 0.6))
    colors = {"sign": "#f4a3c0", "exponent": "#8ecae6", "mantissa": "#b5e48c"}
    for row, name in enumerate(fmts):
        f = FORMATS[name]
        y = len(fmts) - 1 - row
        x = 0
        for part, n in (("sign", 1), ("exponent", f.exponent), ("mantissa", f.mantissa)):
            for _ in range(n):
                ax.add_patch(Rectangle((x, y + 0.1), 0.95, 0.8, fc=colors[part], ec="0.4",
                                       lw=0.5))
                x += 1
        ax.text(-0.6, y + 0.5, name, ha="right", va="center", fontsize=9)
        ax.text(x + 0.6, y + 0.5, f"{f.bits} bits: {f.exponent} exponent, {f.mantissa} "
                f"mantissa; max {f.max:.3g}, rel. step {2 * f.unit_roundoff:.1e}",
                va="center", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, fc=c, ec="0.4", label=k) for k, c in colors.items()]
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=3,
              bbox_to_anchor=(1.0, 1.25))
    ax.set_xlim(-6, 50)
    ax.set_ylim(0, len(fmts))
    ax.axis("off")
    fig.tight_layout()
    return fig


MMA_SHAPES = [  # name, m, n, k, threads that issue it, what
    ("Volta tensor core", 4, 4, 4, None, "V100: 4x4x4 fp16,\nthe source's picture"),
    ("WMMA m16n16k16", 16, 16, 16, 32, "the wmma API\n(C++ or PTX), Volta+"),
    ("mma.sync m16n8k16", 16, 8, 16, 32, "what WMMA becomes\non Ampere and later"),
    ("wgmma m64n256k16", 64, 256, 16, 128, "Hopper: a warpgroup of 4 warps,\noperands "
     "read from shared memory"),
]


def plot_mma_shapes():
    """The output tile (m x n, to scale) of each generation's MMA instruction, with the
    multiply-adds one instruction performs."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(10, 3.4))
    x = 0
    for name, m, n, k, threads, what in MMA_SHAPES:
        ax.add_patch(Rectangle((x, 0), n, m, fc="#8ecae6", ec="0.3"))
        ax.text(x + n / 2, m + 3, f"{name}\n{m * n * k:,} multiply-adds"
                + (f"\nissued by {threads} threads" if threads else ""), ha="center",
                va="bottom", fontsize=7.5)
        ax.text(x + n / 2, -4, what, ha="center", va="top", fontsize=7)
        x += n + 110
    ax.set_xlim(-50, x - 60)
    ax.set_ylim(-30, 105)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("output tile of one tensor-core instruction, to scale (D = A·B + C)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def mma_m16n8_owner(row: int, col: int) -> tuple:
    """(lane, register) holding accumulator element (row, col) of mma.sync m16n8k16 with
    fp32 accumulators (PTX ISA: row = lane // 4 (+8 for c2, c3), col = 2 * (lane % 4) + i)."""
    lane = 4 * (row % 8) + col // 2
    reg = (col % 2) + (2 if row >= 8 else 0)
    return lane, reg


def plot_fragment_owners():
    """Which of the 32 lanes holds each of the 16x8 accumulator elements of mma.sync
    m16n8k16: every lane holds 4 floats (c0..c3) in 2 rows 8 apart."""
    import matplotlib.pyplot as plt

    owner = np.zeros((16, 8), int)
    for r in range(16):
        for c in range(8):
            owner[r, c] = mma_m16n8_owner(r, c)[0]
    fig, ax = plt.subplots(figsize=(4.2, 6))
    ax.imshow(owner, cmap="tab20", interpolation="nearest")
    for r in range(16):
        for c in range(8):
            lane, reg = mma_m16n8_owner(r, c)
            ax.text(c, r, f"{lane}\nc{reg}", ha="center", va="center", fontsize=6)
    ax.set_xticks(range(8))
    ax.set_yticks(range(16))
    ax.set_xlabel("column n")
    ax.set_ylabel("row m")
    ax.set_title("mma.sync m16n8k16: lane and register\nof each fp32 accumulator", fontsize=9)
    fig.tight_layout()
    return fig


def plot_wmma_tiling(cfg=None):
    """The tiled WMMA GEMM's block tile: warps (colours) and their 16x16 fragments, with
    the A and B slabs one K step reads."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from .kernels.wmma01_gemm_cuda import GEMM_DEFAULT

    cfg = cfg or GEMM_DEFAULT
    fig, ax = plt.subplots(figsize=(8, 5.2))
    gap = 8
    # A slab (BM x BK) left, B slab (BK x BN) on top, C tile (BM x BN)
    ax.add_patch(Rectangle((0, 0), cfg.BK, cfg.BM, fc="#ffb703", ec="0.3", alpha=0.6))
    ax.text(cfg.BK / 2, -4, f"A slab\n{cfg.BM}x{cfg.BK}", ha="center", va="bottom", fontsize=8)
    x0 = cfg.BK + gap
    ax.add_patch(Rectangle((x0, -cfg.BK - gap), cfg.BN, cfg.BK, fc="#b5e48c", ec="0.3",
                           alpha=0.6))
    ax.text(x0 + cfg.BN + 3, -cfg.BK / 2 - gap, f"B slab {cfg.BK}x{cfg.BN}", va="center",
            fontsize=8)
    warps_n = cfg.BN // cfg.WN
    colors = plt.cm.tab10.colors
    for w in range(cfg.warps):
        wm, wn = (w // warps_n) * cfg.WM, (w % warps_n) * cfg.WN
        for i in range(cfg.WM // 16):
            for j in range(cfg.WN // 16):
                ax.add_patch(Rectangle((x0 + wn + 16 * j, wm + 16 * i), 16, 16,
                                       fc=colors[w % 10], ec="white", lw=0.8, alpha=0.75))
        ax.text(x0 + wn + cfg.WN / 2, wm + cfg.WM / 2, f"warp {w}", ha="center",
                va="center", fontsize=8, color="black")
    ax.add_patch(Rectangle((x0, 0), cfg.BN, cfg.BM, fill=False, ec="k", lw=1.5))
    ax.set_xlim(-4, x0 + cfg.BN + 60)
    ax.set_ylim(cfg.BM + 6, -cfg.BK - gap - 10)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"one block: C tile {cfg.BM}x{cfg.BN}, {cfg.warps} warps of {cfg.WM}x{cfg.WN}"
                 f" = {cfg.WM // 16}x{cfg.WN // 16} fragments of 16x16 each", fontsize=9)
    fig.tight_layout()
    return fig


def plot_capstone_roofline(points: list, copy_gbps: float, fp32_tflops: float,
                           fp16_tflops: float | None = None, title: str = ""):
    """Every kernel of the course on one roofline with two compute roofs (fp32 CUDA
    cores; fp16 tensor cores): points are dicts (family, ai, tflops); returns the figure."""
    ax = roofline(points, copy_gbps, {"fp32 CUDA cores": fp32_tflops,
                                      "fp16 tensor cores": fp16_tflops},
                  title=title or "every kernel of the course on one roofline", unit="TFLOP/s")
    return ax.figure


def plot_capstone_ladder(rows: list, title: str = ""):
    """Two panels of grouped bars: the fp32 ladder and the tensor-core versions."""
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r["group"] for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4), squeeze=False,
                             gridspec_kw=dict(width_ratios=[2, 1][:len(groups)]))
    for ax, grp in zip(axes[0], groups, strict=True):
        rs = [r for r in rows if r["group"] == grp]
        names = list(dict.fromkeys(r["name"] for r in rs))
        layers = list(dict.fromkeys(r["layer"] for r in rs))
        width = 0.8 / max(1, len(layers))
        for i, lay in enumerate(layers):
            pct = {r["name"]: r["pct"] for r in rs if r["layer"] == lay}
            ax.bar(np.arange(len(names)) + i * width, [pct.get(n, 0) for n in names], width,
                   label=lay)
        ax.axhline(100, color="k", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(names)) + width * (len(layers) - 1) / 2, names,
                      rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(grp.split(": ")[1])
        ax.set_title(grp.split(":")[0], fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_census(census: dict, variants=("fp32", "tf32", "fp16 NHWC"), title: str = ""):
    """Stacked bars: each kind of layer's share of FLOPs and of time (per variant).

    census: {"flops": census_flops(...), variant: census_time(...), ...} (`convlab.census`).
    """
    import matplotlib.pyplot as plt

    kinds = list(census["flops"])  # `convlab.census.KINDS`, in its order
    cols = ["FLOPs"] + [v for v in variants if v in census]
    fig, ax = plt.subplots(figsize=(1.5 * len(cols) + 3, 3.8))
    colors = dict(zip(kinds, plt.cm.Set2.colors, strict=False))
    for i, col in enumerate(cols):
        data = census["flops"] if col == "FLOPs" else census[col]
        tot = sum(data[k] for k in kinds)
        bottom = 0.0
        for k in kinds:
            share = 100 * data[k] / tot
            ax.bar(i, share, bottom=bottom, color=colors[k], label=k if i == 0 else None)
            if share > 6:
                ax.text(i, bottom + share / 2, f"{share:.0f}%", ha="center", va="center",
                        fontsize=8)
            bottom += share
    ax.axhline(70, color="#d62828", lw=1, ls="--")
    ax.text(len(cols) - 0.5, 71, "70% (source 000)", color="#d62828", fontsize=8, ha="right")
    ax.set_xticks(range(len(cols)), ["share of FLOPs"] + [f"time, {c}" for c in cols[1:]],
                  fontsize=8)
    ax.set_ylabel("% of the forward pass")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


def draw_split_k(tiles=3, parts=4, last=(2, 0, 3, 1)):
    """A one-launch split-K: `tiles` output tiles, each reduction cut into `parts` parts.

    Block (tile, z) multiplies part z of the reduction into slice z of a workspace; the
    counter of each tile tells the block that finishes last (`last[t]`: its part z) to add
    the slices in the fixed order 0, 1, ..., parts-1 into y. The order of the additions is
    the same whichever block is last, so the float32 result is the same every run.
    Returns the figure.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.75 * tiles))
    colors = CHANNEL_COLORS
    for t in range(tiles):
        y = t * 1.5
        ax.text(-0.3, y + 0.35, f"tile {t}", ha="right", va="center", fontsize=8)
        for z in range(parts):
            ax.add_patch(plt.Rectangle((z * 1.1, y), 1.0, 0.7, fc=colors[z % len(colors)],
                                       ec="0.3", lw=0.6))
            ax.text(z * 1.1 + 0.5, y + 0.35, f"block ({t},{z})\nl in part {z}", ha="center",
                    va="center", fontsize=6.5)
            x0 = parts * 1.1 + 0.8 + z * 0.75
            ax.add_patch(plt.Rectangle((x0, y), 0.65, 0.7, fc=colors[z % len(colors)],
                                       ec="0.3", lw=0.6, alpha=0.6))
            ax.text(x0 + 0.32, y + 0.35, f"ws[{z}]", ha="center", va="center", fontsize=6.5)
        ax.annotate("", (parts * 1.1 + 0.75, y + 0.35), (parts * 1.1 - 0.05, y + 0.35),
                    arrowprops=dict(arrowstyle="->", color="0.4", lw=0.8))
        z_last = last[t % len(last)] % parts
        xs = parts * 1.1 + 0.8 + parts * 0.75 + 0.5
        ax.annotate("", (xs, y + 0.35), (xs - 0.45, y + 0.35),
                    arrowprops=dict(arrowstyle="->", color=HIGHLIGHT, lw=0.8))
        ax.add_patch(plt.Rectangle((xs, y), 2.6, 0.7, fc="white", ec=HIGHLIGHT, lw=1.2))
        ax.text(xs + 1.3, y + 0.35, "y = " + " + ".join(f"ws[{z}]" for z in range(parts))
                if parts <= 3 else f"y = ws[0] + ... + ws[{parts - 1}]", ha="center",
                va="center", fontsize=6.5)
        ax.text(xs + 2.75, y + 0.35, f"added by block ({t},{z_last}),\nthe last to count",
                ha="left", va="center", fontsize=7, color=HIGHLIGHT)
    ax.set_xlim(-1.3, parts * 1.85 + 7.0)
    ax.set_ylim(tiles * 1.5 - 0.6, -0.3)
    ax.axis("off")
    ax.set_title(f"split-K in one launch: {tiles} tiles x {parts} parts = {tiles * parts} "
                 "blocks; each tile's sum in a fixed order", fontsize=9)
    fig.tight_layout()
    return fig

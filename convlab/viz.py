"""Pictures the lessons share: images, sliding windows, layouts, im2col, timings, rooflines.

Every function draws with matplotlib and returns the figure (or axes), so a notebook cell
shows it and a test can inspect it. Nothing here imports numba. Lesson developers add
functions here when a picture is used by more than one notebook.

- images: `show_images`
- convolution geometry: `draw_conv_window`, `draw_nchw`, `draw_im2col`
- access patterns: `loop_addresses`, `draw_loop_order`, `draw_blocking`
- measurements: `plot_timings`, `plot_thread_sweep`, `plot_batch_crossover`, `roofline`
"""

from __future__ import annotations

import numpy as np

from . import reference as ref

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
        txt = f" {m:.3g} {unit}"
        if len(r) > 2 and r[2] is not None:
            txt += f", {r[2]:.3g} GFLOP/s"
        if base is not None:
            txt += f", {base / m:.3g}× {baseline}"
        ax.text(m, yi, txt, va="center", fontsize=8)
    ax.set_xlabel(f"time ({unit}, {'log scale' if log else 'linear'})")
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


def roofline(points, bandwidth_gbps: float, peak_gflops: float, peak_label="fp32 peak",
             title="roofline", ax=None):
    """`convlab.bench.roofline` in GFLOP/s, with the compute ceiling named `peak_label`.

    points: [(label, FLOP per byte, GFLOP/s), ...]. Returns the axes.
    """
    from . import bench

    ax = bench.roofline([(lab, ai, g / 1e3) for lab, ai, g in points], bandwidth_gbps,
                        peak_gflops / 1e3, ax=ax, title=title)
    from matplotlib.ticker import FuncFormatter

    for t in ax.texts:
        if t.get_text().startswith("fp32 FMA peak"):
            t.set_text(f"{peak_label}: {peak_gflops:.4g} GFLOP/s")
        elif t.get_text().startswith("memory:"):
            t.set_text(f"memory: {bandwidth_gbps:.4g} GB/s")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v * 1e3:g}"))
    ax.set_ylabel("GFLOP/s")
    return ax

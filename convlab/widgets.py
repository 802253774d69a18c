"""ipywidgets explorers for the lessons (JupyterLab with ipywidgets 8).

`filter_explorer` slides a filter over an image: pick a filter, move the row/column
sliders (or press play) and watch the window, the nine products and the output pixel
they form. Pictures are PNGs drawn with matplotlib's Agg backend into an
``ipywidgets.Image``, so they update without a plotting backend in the browser.

Without a widget frontend (plain Python, a static renderer, JupyterLab without the widget
extension) the explorer degrades visibly: outside a kernel it prints a note and returns a
static picture of one position; inside a kernel whose frontend cannot draw widgets, the
text shown instead of the widget says what is missing and how to install it.
"""

from __future__ import annotations

import base64
import html
import io

import numpy as np

from . import reference as ref

NO_FRONTEND = ("This interactive widget could not be displayed here: the filter explorer needs "
               "JupyterLab (or Jupyter Notebook 7) with ipywidgets 8 and its extension "
               "(pip install 'ipywidgets>=8' jupyterlab_widgets), then reload the page.")


def default_filters() -> dict:
    """The classic 3×3 filters of lesson 01: name -> (3, 3) float32 kernel."""
    g = np.array([1.0, 2.0, 1.0])
    return {
        "Sobel x (vertical edges)": np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32),
        "Sobel y (horizontal edges)": np.array([[-1, -2, -1], [0, 0, 0], [1, 2, 1]], np.float32),
        "Gaussian 3×3 (blur)": (np.outer(g, g) / 16).astype(np.float32),
        "box 3×3 (mean)": np.full((3, 3), 1 / 9, np.float32),
        "sharpen": np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], np.float32),
        "identity": np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], np.float32),
    }


def in_kernel() -> bool:
    """True inside a Jupyter kernel (where widgets can be sent to a frontend)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def window_terms(image, kernel, pos):
    """The zero-padded window at output pos=(i, j) ('same' padding), and its products."""
    image, kernel = np.asarray(image, np.float32), np.asarray(kernel, np.float32)
    R, S = kernel.shape
    ph, pw = R // 2, S // 2
    xp = np.pad(image, ((ph, ph), (pw, pw)))
    i, j = pos
    win = xp[i:i + R, j:j + S]
    return win, win * kernel


def formula(image, kernel, pos, digits=2) -> str:
    """'y[i, j] = x·w + x·w + … = value' for output pos, as plain text."""
    win, prod = window_terms(image, kernel, pos)
    terms = [f"{a:.{digits}f}·({b:.3g})"
             for a, b in zip(win.ravel(), np.asarray(kernel).ravel(), strict=True)]
    return f"y[{pos[0]}, {pos[1]}] = " + " + ".join(terms) + f" = {prod.sum():.4f}"


def render_frame(image, kernel, pos, name="filter", output=None, figsize=(9.6, 3.5)):
    """A matplotlib Figure (Agg, not pyplot) of one explorer frame.

    Panels: the input with the window; the window's values times the weights; the
    output filled in raster order up to pos, with pos framed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    image = np.asarray(image, np.float32)
    kernel = np.asarray(kernel, np.float32)
    H, W = image.shape
    R, S = kernel.shape
    ph, pw = R // 2, S // 2
    i, j = pos
    if not (0 <= i < H and 0 <= j < W):
        raise ValueError(f"pos {pos} is outside the {H}x{W} image")
    if output is None:
        output = ref.filter2d(image, kernel)
    win, prod = window_terms(image, kernel, pos)

    fig = Figure(figsize=figsize, dpi=90)
    FigureCanvasAgg(fig)
    a0, a1, a2 = fig.subplots(1, 3, gridspec_kw=dict(width_ratios=[1, 0.9, 1]))
    padded = np.pad(image, ((ph, ph), (pw, pw)))
    a0.imshow(padded, cmap="gray", vmin=min(0.0, float(image.min())),
              vmax=max(1.0, float(image.max())),
              extent=(-pw - 0.5, W + pw - 0.5, H + ph - 0.5, -ph - 0.5),
              interpolation="nearest")
    a0.add_patch(Rectangle((-0.5, -0.5), W, H, fill=False, ec="0.5", lw=0.8, ls="--"))
    a0.add_patch(Rectangle((j - pw - 0.5, i - ph - 0.5), S, R, fill=False, ec="#d62828", lw=2))
    a0.set_title(f"input {H}×{W} (zero padding {ph})", fontsize=9)
    a0.set_xticks([])
    a0.set_yticks([])

    a1.set_xlim(0, S)
    a1.set_ylim(R, 0)
    a1.set_aspect("equal")
    a1.axis("off")
    for r in range(R):
        for s in range(S):
            v = prod[r, s]
            a1.add_patch(Rectangle((s, r), 1, 1, fc=("#f7d4d4" if v < 0 else "#d4e4f7")
                                   if v != 0 else "white", ec="0.4", lw=0.6))
            a1.text(s + 0.5, r + 0.5, f"{win[r, s]:.2f}\n×{kernel[r, s]:+.3g}\n={v:+.3f}",
                    ha="center", va="center", fontsize=7)
    a1.set_title(f"window × {name}\nsum = {prod.sum():+.4f}", fontsize=9)

    shown = np.full((H, W), np.nan, np.float32)
    flat = shown.reshape(-1)
    flat[: i * W + j + 1] = output.reshape(-1)[: i * W + j + 1]
    lo, hi = float(np.min(output)), float(np.max(output))
    if lo < 0:
        m = max(abs(lo), abs(hi)) or 1.0
        a2.imshow(shown, cmap="RdBu_r", vmin=-m, vmax=m, interpolation="nearest")
    else:
        a2.imshow(shown, cmap="gray", vmin=lo, vmax=hi if hi > lo else lo + 1,
                  interpolation="nearest")
    a2.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="#d62828", lw=2))
    a2.set_title(f"output so far: y[{i}, {j}] = {output[i, j]:+.4f}", fontsize=9)
    a2.set_xticks([])
    a2.set_yticks([])
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.03, top=0.84, wspace=0.12)
    return fig


def frame_png(image, kernel, pos, name="filter", output=None) -> bytes:
    """One explorer frame as PNG bytes."""
    fig = render_frame(image, kernel, pos, name, output)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _explorer_class():
    import ipywidgets as W

    class FilterExplorer(W.VBox):
        """A VBox whose text fallback says why no widget is shown, and how to fix it."""

        def _repr_mimebundle_(self, **kwargs):
            data = super()._repr_mimebundle_(**kwargs)
            if isinstance(data, tuple):
                data = data[0]
            data = dict(data or {})
            data["text/plain"] = NO_FRONTEND
            # for static viewers (GitHub, nbviewer, a Lab without the extension): the note
            # and the frame the widget would show first
            png = getattr(self, "controls", {}).get("picture")
            img = ""
            if png is not None and png.value:
                b64 = base64.b64encode(bytes(png.value)).decode("ascii")
                img = f'<br><img src="data:image/png;base64,{b64}" alt="filter explorer frame">'
            data["text/html"] = f"<p><b>[filter explorer]</b> {html.escape(NO_FRONTEND)}</p>{img}"
            return data

    return FilterExplorer


def filter_explorer(image=None, filters: dict | None = None, size: int = 32, pos=(0, 0)):
    """Slide a filter over an image and watch each output pixel being formed.

    image: 2-D array (default: a `size`×`size` crop of the photo). filters: name ->
    2-D kernel (default: `default_filters`). Returns the widget (display it as the cell's
    last value); outside a Jupyter kernel or without ipywidgets, prints a note and
    returns a static matplotlib Figure of position `pos` instead.
    """
    if image is None:
        from .images import photo

        image = photo(size, crop="face")
    image = np.asarray(image, np.float32)
    if image.ndim != 2:
        raise ValueError(f"the explorer needs a 2-D (gray) image, got shape {image.shape}")
    filters = dict(filters or default_filters())
    names = list(filters)
    try:
        import ipywidgets as W
    except ImportError:
        W = None
    if W is None or not in_kernel():
        why = "ipywidgets is not installed" if W is None else "this is not a Jupyter kernel"
        print(f"[filter explorer] {why}: showing one static frame. {NO_FRONTEND}")
        return render_frame(image, filters[names[0]], pos, names[0])

    return build_explorer(image, filters, pos)


def build_explorer(image, filters: dict, pos=(0, 0)):
    """The explorer widget itself (needs ipywidgets; works without a frontend, for tests)."""
    import ipywidgets as W

    image = np.asarray(image, np.float32)
    names = list(filters)
    H, Wd = image.shape
    outputs = {}
    state = {"hold": False}

    def output_of(name):
        if name not in outputs:
            outputs[name] = ref.filter2d(image, filters[name])
        return outputs[name]

    pick = W.Dropdown(options=names, value=names[0], description="filter")
    row = W.IntSlider(value=pos[0], min=0, max=H - 1, description="row", continuous_update=False)
    col = W.IntSlider(value=pos[1], min=0, max=Wd - 1, description="column",
                      continuous_update=False)
    play = W.Play(value=pos[0] * Wd + pos[1], min=0, max=H * Wd - 1, step=1, interval=400,
                  description="slide")
    picture = W.Image(format="png", layout=W.Layout(width="100%", max_width="900px"))
    text = W.HTML()

    def draw(_=None):
        if state["hold"]:
            return
        name, p = pick.value, (row.value, col.value)
        picture.value = frame_png(image, filters[name], p, name.split(" (")[0],
                                  output_of(name))
        text.value = f"<code>{formula(image, filters[name], p)}</code>"

    def from_play(change):
        state["hold"] = True
        try:
            row.value, col.value = divmod(int(change["new"]), Wd)
        finally:
            state["hold"] = False
        draw()

    play.observe(from_play, "value")
    for w in (pick, row, col):
        w.observe(draw, "value")
    draw()
    box = _explorer_class()([W.HBox([pick, play]), W.HBox([row, col]), picture, text])
    box.controls = dict(filter=pick, row=row, column=col, play=play, picture=picture,
                        formula=text)
    return box


# ----------------------------------------------------------------------------------------
# Lesson 13: the autotuner explorer. Pick a tile shape, check it, time it on a GPU (or,
# under the simulator, check it where the simulator can run it and show the H200's time).

TUNER_FAMILIES = {
    # family -> (what, parameters with their choices, stored-results label)
    "numba": ("conv07 warp-tiled implicit GEMM (Numba)",
              {"BM": (32, 64, 128), "BN": (64, 128), "BK": (8, 16), "min_blocks": (0, 2, 3)}),
    "cuda": ("conv09 implicit GEMM (CUDA C, cp.async)",
             {"BM": (64, 128), "BN": (64, 128), "BK": (8, 16), "STAGES": (3, 4),
              "MINB": (1, 2, 4), "SPLIT_K": (1, 2)}),
    "wmma": ("WMMA implicit GEMM (tensor cores, fp16)",
             {"BM": (64, 128), "BN": (64, 128), "BK": (16, 32), "WM": (32, 64),
              "WN": (32, 64)}),
}


def tuner_config(family: str, params: dict):
    """The kernel module's Config for `params` (validated where the module can)."""
    if family == "numba":
        from .kernels.conv07_implicit_gemm_warp_tiled import Config

        p = dict(params)
        p["min_blocks"] = p.get("min_blocks") or None
        return Config(**p)
    if family == "cuda":
        from .kernels.conv09_implicit_gemm_cuda import Config

        return Config(**params).validate()
    if family == "wmma":
        from .kernels.wmma01_gemm_cuda import ConvConfig

        return ConvConfig(**params).validate()
    raise ValueError(f"unknown family {family!r}; known: {', '.join(TUNER_FAMILIES)}")


def _stored_key(family: str, cfg) -> str:
    if family == "numba":
        s = f"conv07 {cfg.BM}, {cfg.BN}, {cfg.BK}"
        return s + (f", min_blocks={cfg.min_blocks}" if cfg.min_blocks else "")
    if family == "cuda":
        return f"conv09 cuda {cfg}"
    return str(cfg)


def stored_tile_times(family: str, layer: str) -> dict:
    """Tile shape -> (ms, % of the layer's cuDNN baseline) measured on the H200, and the
    baseline's name: ({key: (ms, pct)}, baseline)."""
    from . import problems, results

    li = problems.RESNET.index(layer)
    if family == "wmma":
        try:
            data = results.load("h200_lessons12_13")
        except FileNotFoundError:
            return {}, "cuDNN fp16"
        lay = next((x for x in data.get("wmma_conv", []) if x["layer"] == layer), None)
        out = {s["config"]: (s["ms"], s["pct_cudnn_fp16"]) for s in (lay or {}).get(
            "sweep", []) if s.get("ms")}
        return out, "cuDNN fp16"
    data = results.load("h200")
    prefix = "conv07 " if family == "numba" else "conv09 cuda "
    out = {}
    for key, v in data.get("sweep", {}).get("variants", {}).items():
        if key.startswith(prefix) and v.get(f"{layer}_ms"):
            out[key] = (v[f"{layer}_ms"], v["pct_cudnn"][li])
    return out, "cuDNN fp32"


class Tuner:
    """What the explorer does, without the widgets (usable from code and tests).

    ``try_config(family, params, layer)`` builds the tile shape, checks it against a
    float64 reference on the layer's own random inputs (fp16 tolerance for WMMA) and,
    on a GPU, times it beside cuDNN in the same run. Under the simulator the Numba
    kernel is checked on the layer's tiny stand-in; the CUDA C and WMMA kernels cannot
    run there (CuPy needs a GPU) and are only validated; the H200's stored time is shown.
    Every try becomes a row of ``rows``.
    """

    def __init__(self):
        self.rows: list = []
        self._baseline: dict = {}

    def _launcher(self, family, cfg):
        if family == "numba":
            from .kernels.conv07_implicit_gemm_warp_tiled import launcher_for

            return launcher_for(cfg)
        if family == "cuda":
            from .kernels.conv09_implicit_gemm_cuda import make_launcher

            return make_launcher(cfg)
        from .kernels.wmma01_gemm_cuda import make_conv_launcher

        return make_conv_launcher(cfg)

    def baseline_ms(self, family, layer):
        from . import baselines, bench, check, problems

        prec = "fp16" if family == "wmma" else "fp32"
        key = (prec, layer)
        if key not in self._baseline:
            prob = problems.conv_layer(layer)
            rng = np.random.default_rng(0)
            impl = baselines.cudnn_conv_impl(prob, prec)
            st = impl.prepare(check.random_array(prob.x_shape, rng),
                              check.random_array(prob.w_shape, rng))
            self._baseline[key] = bench.time_gpu(impl.run, st, repeat=10).median_ms
        return self._baseline[key]

    def try_config(self, family: str, params: dict, layer: str = "resnet128") -> dict:
        from . import bench, check, problems
        from . import reference as ref
        from .runtime import is_simulator

        row = dict(family=family, layer=layer, params=dict(params), config=None, ok=False,
                   ms=None, pct=None, stored_ms=None, stored_pct=None, note="")
        self.rows.append(row)
        try:
            cfg = tuner_config(family, params)
        except (ValueError, TypeError) as e:
            row["note"] = f"refused: {e}"
            return row
        row["config"] = str(cfg)
        stored, base_name = stored_tile_times(family, layer)
        row["baseline"] = base_name
        hit = stored.get(_stored_key(family, cfg))
        if hit:
            row["stored_ms"], row["stored_pct"] = hit
        sim = is_simulator()
        if sim and family != "numba":
            row["note"] = "valid tile; CUDA C needs a GPU (CuPy): not run here"
            return row
        prob = problems.conv_layer(layer)
        rng = np.random.default_rng(1)
        kw = prob.kwargs
        case = check.reference_case(check.random_array(prob.x_shape, rng),
                                    check.random_array(prob.w_shape, rng),
                                    op=ref.conv2d_im2col, **kw)
        x, w = case["inputs"]
        try:
            from .runtime import cuda

            c = cuda()
            launch = self._launcher(family, cfg)
            xd, wd = c.to_device(x), c.to_device(w)
            out = c.to_device(check.poisoned(prob.out_shape))
            launch(xd, wd, out, **kw)
            c.synchronize()
            comp = check.compare(out.copy_to_host(), case["expected"], case["absref"],
                                 case["reduction"], "fp16" if family == "wmma" else "fp32")
            row["max_rel_err"] = comp.max_rel
            if not comp.ok:
                row["note"] = "WRONG: " + comp.summary()
                return row
            row["ok"] = True
            if sim:
                row["note"] = "checked on the simulator's small layer; not timed"
                return row
            t = bench.time_gpu(launch, xd, wd, out, repeat=10, **kw)
            row["ms"] = t.median_ms
            row["pct"] = 100 * self.baseline_ms(family, layer) / t.median_ms
        except Exception as e:  # noqa: BLE001  (a tile that cannot run is one row)
            row["note"] = f"{type(e).__name__}: {e}"[:200]
        return row

    def table(self) -> str:
        lines = [f"{'kernel':<7}{'layer':<11}{'tile':<30}{'check':<7}{'ms here':>9}"
                 f"{'%':>6}{'H200 ms':>9}{'H200 %':>8}  note"]
        for r in self.rows:
            def f(v, fmt):
                return format(v, fmt) if v is not None else "-"
            lines.append(f"{r['family']:<7}{r['layer']:<11}{str(r['config'] or r['params']):<30}"
                         f"{'ok' if r['ok'] else '-':<7}{f(r['ms'], '.4f'):>9}"
                         f"{f(r['pct'], '.0f'):>6}{f(r['stored_ms'], '.4f'):>9}"
                         f"{f(r['stored_pct'], '.0f'):>8}  {r['note']}")
        return "\n".join(lines)


def render_tuner(family: str, layer: str, rows: list, figsize=(8.4, 3.4)):
    """Bars: the H200's stored times of every tile of `family` on `layer` (% of its cuDNN
    baseline), the tiles tried here outlined, this machine's measurements as dots."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    stored, base = stored_tile_times(family, layer)
    fig = Figure(figsize=figsize, dpi=90)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    tried = [r for r in rows if r["family"] == family and r["layer"] == layer and r["config"]]
    names = sorted(stored, key=lambda k: -stored[k][1])
    for r in tried:
        k = _stored_key(family, tuner_config(family, r["params"]))
        if k not in names:
            names.append(k)
    pct = [stored.get(k, (None, 0))[1] for k in names]
    tried_keys = {_stored_key(family, tuner_config(family, r["params"])) for r in tried}
    ax.bar(range(len(names)), pct, color=["#d62828" if k in tried_keys else "#8ecae6"
                                          for k in names])
    for r in tried:
        if r["pct"] is not None:
            i = names.index(_stored_key(family, tuner_config(family, r["params"])))
            ax.plot(i, r["pct"], "ko")
    ax.axhline(100, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), [n.replace("conv09 cuda ", "").replace("conv07 ", "")
                                      for n in names], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(f"% of {base} (H200)")
    ax.set_title(f"{TUNER_FAMILIES[family][0]} on {layer}: stored H200 sweep (red: tried "
                 "here; dots: timed here)", fontsize=9)
    fig.subplots_adjust(bottom=0.38, left=0.09, right=0.99, top=0.9)
    return fig


def tuner_png(family, layer, rows) -> bytes:
    buf = io.BytesIO()
    render_tuner(family, layer, rows).savefig(buf, format="png")
    return buf.getvalue()


def autotune_explorer(family: str = "wmma", layer: str = "resnet128"):
    """Pick a kernel and a tile shape, press "check & time": the tile is checked (and, on
    a GPU, timed beside cuDNN); the chart shows the H200's stored sweep for comparison.

    Returns the widget (display it as the cell's last value); without ipywidgets or a
    kernel, prints a note and returns the static chart."""
    from . import problems

    tuner = Tuner()
    try:
        import ipywidgets as W
    except ImportError:
        W = None
    if W is None or not in_kernel():
        why = "ipywidgets is not installed" if W is None else "this is not a Jupyter kernel"
        print(f"[autotuner] {why}: showing the stored chart only.")
        return render_tuner(family, layer, tuner.rows)

    fam = W.Dropdown(options=list(TUNER_FAMILIES), value=family, description="kernel")
    lay = W.Dropdown(options=list(problems.RESNET), value=layer, description="layer")
    box = W.HBox()
    picture = W.Image(format="png", layout=W.Layout(width="100%", max_width="900px"))
    go = W.Button(description="check & time", button_style="primary")
    text = W.HTML()
    state = {"params": {}}

    def build_params(_=None):
        opts = TUNER_FAMILIES[fam.value][1]
        drops = []
        for k, choices in opts.items():
            d = W.Dropdown(options=list(choices), value=choices[min(1, len(choices) - 1)],
                           description=k, layout=W.Layout(width="150px"))
            drops.append(d)
        state["params"] = {d.description: d for d in drops}
        box.children = drops
        draw()

    def draw(_=None):
        picture.value = tuner_png(fam.value, lay.value, tuner.rows)
        text.value = "<pre>" + html.escape(tuner.table()) + "</pre>"

    def run(_=None):
        params = {k: d.value for k, d in state["params"].items()}
        text.value = "<pre>checking ...</pre>"
        tuner.try_config(fam.value, params, lay.value)
        draw()

    fam.observe(build_params, "value")
    lay.observe(draw, "value")
    go.on_click(run)
    build_params()
    root = W.VBox([W.HBox([fam, lay, go]), box, picture, text])
    root.tuner = tuner
    return root

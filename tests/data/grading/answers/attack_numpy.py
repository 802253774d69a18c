# ruff: noqa
"""Family "numpy": the GPU task answered by a plain NumPy function (no @launcher, so it
says nothing of being a device function; under the simulator its np.asarray reads the
device arrays it is handed without any copy_to_host)."""

# EXERCISE: fx.tiled
def conv2d_tiled(x, w, out, stride=1, padding=0):
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    ph, pw = (padding, padding) if np.isscalar(padding) else padding
    xp = np.pad(np.asarray(x), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    wh = np.asarray(w)
    K, C, R, S = wh.shape
    N, _, P, Q = out.shape
    y = np.zeros((N, K, P, Q), np.float64)
    for r in range(R):
        for s in range(S):
            win = xp[:, :, r:r + sh * (P - 1) + 1:sh, s:s + sw * (Q - 1) + 1:sw]
            y += np.einsum("nchw,kc->nkhw", win, wh[:, :, r, s])
    out.copy_to_device(y.astype(np.float32))

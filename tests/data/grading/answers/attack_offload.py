# ruff: noqa
"""Family "offload": the GPU task answered on the CPU (copy to the host, NumPy, copy back)."""

# EXERCISE: fx.tiled
TILE = 8


@launcher
def conv2d_tiled(x, w, out, stride=1, padding=0):
    xh, wh = x.copy_to_host(), w.copy_to_host()
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    ph, pw = (padding, padding) if np.isscalar(padding) else padding
    xp = np.pad(xh, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    K, C, R, S = wh.shape
    N, _, P, Q = out.shape
    y = np.zeros((N, K, P, Q), np.float32)
    for r in range(R):
        for s in range(S):
            win = xp[:, :, r:r + sh * (P - 1) + 1:sh, s:s + sw * (Q - 1) + 1:sw]
            y += np.einsum("nchw,kc->nkhw", win, wh[:, :, r, s])
    out.copy_to_device(y)

# ruff: noqa
"""Family "leak": print the test cells' source (hidden tests) and a flood of output."""

# EXERCISE: fx.box
def filter2d_numpy(image, kernel):
    ns = get_ipython().user_ns
    print("✓", ns.get("In", [""])[-3:], ns.get("_ih", [""])[-3:])
    print("✓ " + "x" * (1 << 20))
    R, S = kernel.shape
    padded = np.pad(image, ((R // 2, R // 2), (S // 2, S // 2)))
    windows = sliding_window_view(padded, (R, S))
    return np.einsum("hwrs,rs->hw", windows, kernel).astype(image.dtype)

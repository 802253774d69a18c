# ruff: noqa
"""The fixture's fx.box answer, filled in (as a learner would)."""

# EXERCISE: fx.box
def filter2d_numpy(image, kernel):
    R, S = kernel.shape
    padded = np.pad(image, ((R // 2, R // 2), (S // 2, S // 2)))
    windows = sliding_window_view(padded, (R, S))
    return np.einsum("hwrs,rs->hw", windows, kernel).astype(image.dtype)

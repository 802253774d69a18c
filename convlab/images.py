"""A real photograph for the image-filter lessons, from a package already installed.

Matplotlib ships Grace Hopper's portrait (``mpl-data/sample_data/grace_hopper.jpg``,
512×600 RGB); `photo()` loads it through ``matplotlib.cbook.get_sample_data``, so nothing
is downloaded. Images are float32 in [0, 1], (H, W) for gray or (H, W, 3) for colour.
"""

from __future__ import annotations

import numpy as np

PHOTO = "grace_hopper.jpg"


def _load_rgb() -> np.ndarray:
    from matplotlib import cbook
    from PIL import Image

    with cbook.get_sample_data(PHOTO, asfileobj=True) as f:
        img = Image.open(f)
        img.load()
    return np.asarray(img.convert("RGB"))


def to_gray(rgb: np.ndarray) -> np.ndarray:
    """ITU-R BT.601 luma: 0.299 R + 0.587 G + 0.114 B (float32)."""
    rgb = np.asarray(rgb, dtype=np.float32)
    return (rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114).astype(np.float32)


def resize(img: np.ndarray, size) -> np.ndarray:
    """Resize to (H, W) (an int gives a square) with Pillow's area-averaging filter."""
    from PIL import Image

    h, w = (size, size) if isinstance(size, (int, np.integer)) else size
    img = np.asarray(img, dtype=np.float32)
    if img.ndim == 2:
        out = Image.fromarray(img, mode="F").resize((int(w), int(h)), Image.Resampling.BOX)
        return np.asarray(out, dtype=np.float32)
    chans = [resize(img[..., i], (h, w)) for i in range(img.shape[-1])]
    return np.stack(chans, axis=-1)


def photo(size=None, gray: bool = True, crop: str | None = None) -> np.ndarray:
    """Grace Hopper's portrait as float32 in [0, 1].

    size: None keeps 600×512; an int or (H, W) resizes (area average). gray: one
    channel (luma) or RGB. crop='face' cuts the square around her face first (a good
    small picture for the widgets).
    """
    img = _load_rgb().astype(np.float32) / 255.0
    if crop == "face":
        img = img[72:328, 128:384]
    elif crop is not None:
        raise ValueError(f"crop must be None or 'face', got {crop!r}")
    if gray:
        img = to_gray(img)
    if size is not None:
        img = resize(img, size)
    return np.ascontiguousarray(np.clip(img, 0.0, 1.0), dtype=np.float32)


def photo_batch(n: int, size, channels: int = 3) -> np.ndarray:
    """An NCHW float32 batch made from the photo: n shifted crops, `channels` channels.

    For examples that want real image statistics instead of random numbers.
    """
    rgb = photo(gray=False)
    h, w = (size, size) if isinstance(size, (int, np.integer)) else size
    out = np.empty((n, channels, h, w), np.float32)
    H, W = rgb.shape[:2]
    side = min(H, W) - 8 * max(0, n - 1) if n > 1 else min(H, W)
    side = max(side, min(H, W) // 2)
    for i in range(n):
        off = (8 * i) % max(1, min(H, W) - side)
        crop = resize(rgb[off:off + side, off:off + side], (h, w))
        for c in range(channels):
            out[i, c] = crop[..., c % 3]
    return out

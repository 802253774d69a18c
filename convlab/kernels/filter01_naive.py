"""Image filter, step 1: one thread per output pixel, everything read from global memory.

A single-channel 2-D filter ('same' zero padding: the output has the image's size),
the stencil of lesson 01 on the GPU. Thread x walks image columns, so a warp reads 32
neighbouring pixels of a row (coalesced) for each of the R*S filter taps; the R*S reads
per pixel overlap with the neighbours' and are served by the L1 cache, not by DRAM.

Launcher signature (device arrays, float32)::

    filter2d_<name>(image (H, W), kernel (R, S), out (H, W)) -> out
"""

from numba import cuda, float32, int32

from ._filter import filter_launch_params
from ._launch import ceil_div, launcher

BLOCK = (32, 8)  # (threads along image columns, threads along image rows)


@cuda.jit
def filter2d_naive_kernel(img, k, out):
    col = int32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    row = int32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
    H, W = int32(img.shape[0]), int32(img.shape[1])
    R, S = int32(k.shape[0]), int32(k.shape[1])
    if row >= H or col >= W:
        return
    acc = float32(0.0)
    for r in range(R):
        h = row + r - R // 2
        if 0 <= h < H:
            for s in range(S):
                c = col + s - S // 2
                if 0 <= c < W:
                    acc += img[h, c] * k[r, s]
    out[row, col] = acc


@launcher
def filter2d_naive(image, kernel, out):
    """One thread per pixel; zero padding keeps the size ('same'); odd filter sizes."""
    H, W, _, _ = filter_launch_params("filter2d_naive", image, kernel, out)
    grid = (ceil_div(W, BLOCK[0]), ceil_div(H, BLOCK[1]))
    filter2d_naive_kernel[grid, BLOCK](image, kernel, out)
    return out


@cuda.jit
def filter2d_naive_rows_kernel(img, k, out):
    # the same kernel with x and y swapped: a warp takes 32 pixels of one *column*
    row = int32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    col = int32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
    H, W = int32(img.shape[0]), int32(img.shape[1])
    R, S = int32(k.shape[0]), int32(k.shape[1])
    if row >= H or col >= W:
        return
    acc = float32(0.0)
    for r in range(R):
        h = row + r - R // 2
        if 0 <= h < H:
            for s in range(S):
                c = col + s - S // 2
                if 0 <= c < W:
                    acc += img[h, c] * k[r, s]
    out[row, col] = acc


@launcher
def filter2d_naive_rows(image, kernel, out):
    """The uncoalesced twin of filter2d_naive (lesson 05): thread x walks image rows."""
    H, W, _, _ = filter_launch_params("filter2d_naive_rows", image, kernel, out)
    grid = (ceil_div(H, BLOCK[0]), ceil_div(W, BLOCK[1]))
    filter2d_naive_rows_kernel[grid, BLOCK](image, kernel, out)
    return out


KERNEL = filter2d_naive_kernel
SIGNATURE = "(float32[:, ::1], float32[:, ::1], float32[:, ::1])"

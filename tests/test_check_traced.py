"""convlab.check.traced: the traced technique checks tell the course's kernels apart
(global loads per output, bank conflicts). Quick under the simulator: small launches.
"""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from convlab import check  # noqa: E402


@pytest.fixture(scope="module")
def small_conv():
    from convlab.runtime import cuda

    c = cuda()
    rng = np.random.default_rng(4)
    x = c.to_device(check.random_array((1, 4, 8, 8), rng))
    w = c.to_device(check.random_array((32, 4, 3, 3), rng))
    return x, w, c.device_array((1, 32, 8, 8), np.float32)


def test_check_loads_per_output_tells_register_blocking_from_naive(small_conv):
    from convlab import kernels

    x, w, out = small_conv
    # naive: every output loads C*R*S values of x and of w (fewer at the padded border)
    with pytest.raises(check.CheckError, match="global-memory loads per output"):
        check.check_loads_per_output(kernels.conv2d_naive, x, w, out, padding=1,
                                     max_per_output=20, quiet=True)
    line = check.check_loads_per_output(kernels.conv2d_register_blocked, x, w, out, padding=1,
                                        max_per_output=20, quiet=True)
    assert float(line.split(": ")[2].split()[0]) < 10
    # of x alone, by the launcher's argument name: conv04 stages the input tile + halo in
    # shared memory once per block of KPT = 16 filters, so each output costs far less than
    # one load of x (naive: 36); 10x10 halo tiles x 4 channels x 2 filter blocks / 2048
    line = check.check_loads_per_output(kernels.conv2d_register_blocked, x, w, out, padding=1,
                                        array="x", max_per_output=1.0, quiet=True)
    assert 0.1 < float(line.split(": ")[2].split()[0]) <= 2 * 400 / 2048
    with pytest.raises(check.CheckError, match="cannot find the array 'img'"):
        check.check_loads_per_output(kernels.conv2d_register_blocked, x, w, out, padding=1,
                                     array="img", max_per_output=4.5, quiet=True)
    # shared memory: conv04 reads its 8 filter values per tap from shared memory
    line = check.check_loads_per_output(kernels.conv2d_register_blocked, x, w, out, padding=1,
                                        space="shared", max_per_output=40, quiet=True)
    assert "shared-memory loads" in line
    # conv05 writes its rearranged filters to global memory: not only the output
    with pytest.raises(check.CheckError, match="writes 2 global arrays"):
        check.check_loads_per_output(kernels.conv2d_implicit_gemm, x, w, out, padding=1,
                                     max_per_output=20, quiet=True)


def test_check_bank_conflicts_tells_the_layouts_apart():
    from convlab.kernels import GEMM_LADDER
    from convlab.runtime import cuda

    c = cuda()
    rng = np.random.default_rng(5)
    a = c.to_device(check.random_array((64, 16), rng))
    b = c.to_device(check.random_array((16, 64), rng))
    out = c.device_array((64, 64), np.float32)
    with pytest.raises(check.CheckError, match="3.00-way"):  # As 2-way, Bs 4-way
        check.check_bank_conflicts(GEMM_LADDER["register_blocked"], a, b, out, quiet=True)
    assert "1.00-way" in check.check_bank_conflicts(GEMM_LADDER["double_buffered"], a, b, out,
                                                    quiet=True)


def test_check_bank_conflicts_names_a_conflicting_store_as_a_store():
    from numba import cuda, float32

    @cuda.jit
    def kernel(a, out):
        tile = cuda.shared.array((32, 32), float32)
        t = cuda.threadIdx.x
        for j in range(32):
            tile[t, j] = a[t, j]  # a column per warp step: 32 rows of 32 floats, 32-way
        cuda.syncthreads()
        out[t] = tile[0, t] + tile[1, t] * 0  # rows: conflict-free loads

    def launch(a, out):
        kernel[1, 32](a, out)

    rng = np.random.default_rng(2)
    a = check.random_array((32, 32), rng)
    with pytest.raises(check.CheckError, match=r"worst: .*tile\[t, j\] \(\d+\.\d-way, a store\)"
                                               r"\n  hint: within a warp, threads that write"):
        check.check_bank_conflicts(launch, a, np.zeros(32, np.float32), kind=None, quiet=True)


def _barrier_launcher(per_step):
    """A launcher whose block b passes steps[b] * `per_step` barriers; thread 3 of every
    block leaves before the first (a thread that has exited does not hold a barrier)."""
    from numba import cuda

    @cuda.jit
    def kernel(a, steps):
        t, b = cuda.threadIdx.x, cuda.blockIdx.x
        if t == 3:
            return
        for _ in range(steps[b]):
            for _ in range(per_step):
                cuda.syncthreads()
        a[b * cuda.blockDim.x + t] = b

    def run(a, steps):
        kernel[3, 8](a, steps)
        return a

    return run


def test_check_barriers_per_block_counts_each_blocks_barriers(tmp_path):
    from convlab.grading import wire
    from convlab.grading.remote import RemoteTrace
    from convlab.grading.worker import facts
    from convlab.runtime import cuda
    from convlab.trace import trace_launch

    c = cuda()
    a, steps = c.device_array(24, np.float32), c.to_device(np.array([4, 4, 4], np.int64))
    once = _barrier_launcher(1)
    assert "every block passed 4" in check.check_barriers_per_block(once, a, steps, expected=4,
                                                                    quiet=True)
    with pytest.raises(check.CheckError, match=r"block \[0, 0, 0\] of kernel passed 8 "
                       r"cuda.syncthreads\(\) barrier\(s\), the task asks for 4 \(one per "
                       r"slab\); 3 of 3 blocks differ\n  hint: every extra barrier"):
        check.check_barriers_per_block(_barrier_launcher(2), a, steps, expected=4,
                                       why="one per slab", quiet=True)
    # one block short (its loop stops a step early): named, and the hint turns around
    short = c.to_device(np.array([4, 3, 4], np.int64))
    with pytest.raises(check.CheckError, match=r"block \[1, 0, 0\] .* passed 3 .*1 of 3 "
                       r"blocks differ\n  hint: a barrier fewer"):
        check.check_barriers_per_block(once, a, short, expected=4, quiet=True)
    # the grader reads the same counts from the facts the learner's process recorded, as
    # they cross the wire
    t = trace_launch(once, a, short)
    assert t.barriers_per_block() == [("kernel", (0, 0, 0), 4), ("kernel", (1, 0, 0), 3),
                                      ("kernel", (2, 0, 0), 4)]
    sent = wire.Decoder(tmp_path, 1 << 20)(wire.Encoder(tmp_path, "r0")(facts(t)))
    assert RemoteTrace(sent).barriers_per_block() == t.barriers_per_block()
    # a kernel without syncthreads: every block passes none
    with pytest.raises(check.CheckError, match="passed 0"):
        check.check_barriers_per_block(_barrier_launcher(1), a,
                                       c.to_device(np.zeros(3, np.int64)), expected=1,
                                       quiet=True)


def test_check_loads_per_output_says_the_callers_hint():
    """A filter reading the image from global memory for every tap: R*S loads per output,
    and the failure carries the task's hint, not register blocking's."""
    from numba import cuda

    @cuda.jit
    def kernel(img, k, out):
        row, col = cuda.grid(2)
        H, W = img.shape
        R, S = k.shape
        if row < H and col < W:
            acc = 0.0
            for r in range(R):
                for s in range(S):
                    y, x = row + r - R // 2, col + s - S // 2
                    if 0 <= y < H and 0 <= x < W:
                        acc += img[y, x] * k[r, s]
            out[row, col] = acc

    def filter_global(img, k, out):
        kernel[(2, 2), (8, 8)](img, k, out)

    rng = np.random.default_rng(3)
    img, k = check.random_array((13, 11), rng), check.random_array((3, 5), rng)
    with pytest.raises(check.CheckError, match=r"global-memory loads per output .*at most 4 "
                       r"allowed\)\n  hint: from the shared tile only$"):
        check.check_loads_per_output(filter_global, img, k, np.zeros((13, 11), np.float32),
                                     max_per_output=4.0, hint="from the shared tile only",
                                     quiet=True)

"""The GPU kernels: correct on odd shapes with stride/padding/dilation, refusals clear.

Runs under the simulator in CI (tiny shapes) and on a real GPU when there is one (larger
shapes, same checks); the `gpu` tests also compare with cuDNN when PyTorch is present.
"""

import numpy as np
import pytest

from convlab import check
from convlab import reference as ref
from convlab.kernels import CONV_LADDER, Unsupported
from convlab.runtime import cuda


@pytest.mark.parametrize("name", list(CONV_LADDER))
def test_kernel_passes_checker(name):
    check.check_conv2d(CONV_LADDER[name], dilation=True, quiet=True)


@pytest.mark.parametrize("name", list(CONV_LADDER))
def test_kernel_refuses_groups(name):
    c = cuda()
    x = c.to_device(np.ones((1, 4, 5, 5), np.float32))
    w = c.to_device(np.ones((4, 2, 3, 3), np.float32))
    out = c.to_device(np.zeros((1, 4, 3, 3), np.float32))
    with pytest.raises(Unsupported, match="groups=2"):
        CONV_LADDER[name](x, w, out, groups=2)


@pytest.mark.parametrize("name", list(CONV_LADDER))
def test_kernel_refuses_wrong_out_and_dtype(name):
    c = cuda()
    x = c.to_device(np.ones((1, 2, 5, 5), np.float32))
    w = c.to_device(np.ones((3, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="expected"):
        CONV_LADDER[name](x, w, c.to_device(np.zeros((1, 3, 5, 5), np.float32)))
    with pytest.raises(TypeError, match="float32"):
        CONV_LADDER[name](c.to_device(np.ones((1, 2, 5, 5))), w,
                          c.to_device(np.zeros((1, 3, 3, 3), np.float32)))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONV_LADDER))
def test_kernel_on_gpu_real_layer_slice(name):
    """A slice of a real layer (batch 2, 64ch 56x56) against the float64 reference."""
    rng = np.random.default_rng(7)
    x = check.random_array((2, 64, 56, 56), rng)
    w = check.random_array((64, 64, 3, 3), rng)
    c = cuda()
    out = c.to_device(check.poisoned((2, 64, 56, 56)))
    CONV_LADDER[name](c.to_device(x), c.to_device(w), out, padding=1)
    expected = ref.conv2d_im2col(x.astype(np.float64), w.astype(np.float64), padding=1)
    absref = ref.conv2d_im2col(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64),
                               padding=1)
    comp = check.compare(out.copy_to_host(), expected, absref, 64 * 9)
    assert comp.ok, comp.summary()


@pytest.mark.gpu
def test_kernels_match_cudnn():
    torch = pytest.importorskip("torch")
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(8)
    x = check.random_array((3, 16, 33, 20), rng)
    w = check.random_array((8, 16, 3, 3), rng)
    y = torch.nn.functional.conv2d(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(),
                                   stride=2, padding=1).cpu().numpy()
    c = cuda()
    for launch in CONV_LADDER.values():
        out = c.to_device(check.poisoned(y.shape))
        launch(c.to_device(x), c.to_device(w), out, stride=2, padding=1)
        np.testing.assert_allclose(out.copy_to_host(), y, rtol=1e-4, atol=1e-4)

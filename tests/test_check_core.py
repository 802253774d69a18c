"""convlab.check.core: reference_case, and the exceptions' homes (convlab.errors)."""

import numpy as np
import pytest

import convlab

convlab.setup()
from numba import cuda  # noqa: E402

from convlab import check, errors  # noqa: E402
from convlab import reference as ref  # noqa: E402


def _rand(shape, seed=0):
    return check.random_array(shape, np.random.default_rng(seed))


def test_reference_case_is_the_float64_conv_and_its_absolute_twin():
    x, w = _rand((2, 3, 7, 9)), _rand((4, 3, 3, 2), 1)
    c = check.reference_case(x, w, stride=(2, 1), padding=1)
    assert c["inputs"][0] is x and c["kwargs"] == dict(stride=(2, 1), padding=1)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    assert np.array_equal(c["expected"], ref.conv2d(x64, w64, stride=(2, 1), padding=1))
    assert np.array_equal(c["absref"], ref.conv2d(np.abs(x64), np.abs(w64), stride=(2, 1),
                                                  padding=1))
    assert c["expected"].dtype == np.float64 and (c["absref"] >= np.abs(c["expected"])).all()
    assert c["reduction"] == 3 * 3 * 2
    assert c["label"] == "x(2, 3, 7, 9) w(4, 3, 3, 2) stride=(2, 1) padding=1"


def test_reference_case_other_operations_and_reference_only_arguments():
    a, b = _rand((5, 7)), _rand((7, 3), 1)
    g = check.reference_case(a, b, op=np.matmul, reduction=7, label="gemm")
    assert np.allclose(g["expected"], a.astype(np.float64) @ b) and g["reduction"] == 7
    x, w = _rand((1, 4, 6, 6)), _rand((4, 1, 3, 3), 2)  # depthwise: groups for the reference only
    d = check.reference_case(x, w, padding=1, reference_kwargs=dict(groups=4))
    assert d["kwargs"] == {"padding": 1} and d["reduction"] == 9
    assert np.allclose(d["expected"], ref.conv2d(x.astype(np.float64), w.astype(np.float64),
                                                 padding=1, groups=4))


def test_a_wrong_answer_fails_against_the_case():
    x, w = _rand((1, 2, 6, 5)), _rand((3, 2, 3, 3), 1)
    c = check.reference_case(x, w, padding=1)
    good = c["expected"].astype(np.float32)
    assert check.compare(good, c["expected"], c["absref"], c["reduction"]).ok
    bad = good.copy()
    bad[0, 1, 2, 3] += 1e-3 * float(c["absref"][0, 1, 2, 3])  # one term of 18 off
    comp = check.compare(bad, c["expected"], c["absref"], c["reduction"])
    assert not comp.ok and comp.first_bad == (0, 1, 2, 3)


def test_errors_live_in_the_leaf_module():
    assert check.CheckError is errors.CheckError and issubclass(errors.CheckError, AssertionError)
    assert issubclass(errors.Unsupported, ValueError)
    e = errors.CheckError("report", comparison="c")
    assert (e.report, e.comparison, str(e)) == ("report", "c", "report")
    from convlab.kernels import Unsupported
    from convlab.kernels._launch import Unsupported as launch_unsupported

    assert Unsupported is launch_unsupported is errors.Unsupported
    with pytest.raises(errors.Unsupported, match="groups=2"):
        from convlab import cpu

        cpu.conv2d_loops(_rand((1, 2, 5, 5)), _rand((2, 1, 3, 3)), groups=2)


@pytest.mark.parametrize("spoil", [None, "unwritten", "inf"])
def test_compare_reports_the_errors_it_found(spoil):
    """max_abs, max_rel and err are the float64 errors of the finite elements (err NaN where
    an element was never written), whichever of compare's two paths the data takes."""
    rng = np.random.default_rng(4)
    exp = rng.standard_normal((7, 33))
    absref = np.abs(exp) * rng.uniform(1, 3, exp.shape)
    out = (exp + rng.uniform(-1, 1, exp.shape) * 1e-6 * absref).astype(np.float32)
    if spoil == "unwritten":
        out[3, 5] = check.POISON
    elif spoil == "inf":
        out[6, 0] = np.inf
    c = check.compare(out, exp, absref, rtol=1e-4)
    diff = np.abs(out.astype(np.float64) - exp)
    keep = np.isfinite(diff)
    assert c.max_abs == diff[keep].max()
    assert c.max_rel == pytest.approx((diff[keep] / absref[keep]).max(), rel=1e-12)
    assert np.array_equal(np.isnan(c.err), ~keep if spoil != "inf" else np.zeros_like(keep))
    assert c.ok == (spoil is None) and c.bad == (spoil is not None)


@pytest.mark.gpu
@pytest.mark.parametrize("spoil", [None, "wrong", "unwritten", "inf"])
def test_compare_on_the_gpu_reports_what_the_host_reports(spoil):
    """CuPy arrays are compared on the GPU (the batch sweep's check): every count, index,
    error and message equal to the host comparison's."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(5)
    exp = rng.standard_normal((3, 5, 17, 11))
    absref = np.abs(exp) * rng.uniform(1, 3, exp.shape)
    out = (exp + rng.uniform(-1, 1, exp.shape) * 1e-6 * absref).astype(np.float32)
    if spoil == "wrong":
        out[1, 2, 3, 4] += 1.0
    elif spoil == "unwritten":
        out[2, 4, 16, 3:7] = check.POISON
    elif spoil == "inf":
        out[0, 0, 5, 10] = -np.inf
    host = check.compare(out, exp, absref, reduction=300)
    gpu = check.compare(cp.asarray(out), cp.asarray(exp), cp.asarray(absref), reduction=300)
    assert check.array_module(cp.asarray(out)) is cp and check.array_module(out) is np
    for name in ("ok", "not_written", "nonfinite", "bad", "first_bad", "max_abs", "max_rel",
                 "rtol", "messages"):
        assert getattr(gpu, name) == getattr(host, name), name
    assert np.array_equal(cp.asnumpy(gpu.err), host.err, equal_nan=True)
    assert host.ok == (spoil is None)


def test_an_output_that_must_be_exactly_zero_is_named_and_keeps_the_relative_error_sane():
    """An output whose every term is zero (all padding) has no relative scale: an error
    there is named as such, and the max relative error is over the other outputs."""
    expected = np.array([[1.0, 2.0], [0.0, 4.0]])
    absref = np.array([[1.0, 2.0], [0.0, 4.0]])
    out = np.array([[1.0, 2.5], [0.5, 4.0]], np.float32)
    c = check.compare(out, expected, absref)
    assert not c.ok and c.bad == 2
    assert c.max_rel == pytest.approx(0.25)  # 0.5 / 2.0, not 0.5 / 1e-30
    assert "(exactly 0: every term there is zero, padding)" not in c.messages[0]  # [0, 1] first
    only_zero = check.compare(np.array([[1.0, 2.0], [0.5, 4.0]], np.float32), expected, absref)
    assert "expected 0 (exactly 0: every term there is zero, padding)" in only_zero.messages[0]


@cuda.jit
def past_the_end(a, b, c):
    i, j = cuda.grid(2)
    if i < c.shape[0] and j < c.shape[1]:
        c[i, j] = a[i, j + 1]  # reads a column past a's last one


def test_a_learner_exception_says_the_line_that_raised_it():
    """An IndexError inside a kernel (the simulator raises it from the block's thread) is
    reported with the kernel's own line, not only the simulator's message."""
    def gemm(a, b, out):
        past_the_end[(8, 8), (16, 16)](a, b, out)

    with pytest.raises(check.CheckError, match=r"IndexError: .*\n  at line \d+ of "
                       r"test_check_core.py: c\[i, j\] = a\[i, j \+ 1\]"):
        check.check_gemm(gemm, device=True, quiet=True)


def test_the_error_map_of_a_half_written_output_draws_without_warnings():
    import warnings

    out = check.poisoned((2, 3, 4, 5))
    out[..., :3] = 1.0  # columns 3 and 4 never written in any plane
    c = check.compare(out, np.ones((2, 3, 4, 5)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = c.error_map()
    assert m.shape == (4, 5) and (m[:, :3] == 0).all() and np.isnan(m[:, 3:]).all()


def test_a_numba_compile_error_names_the_line_in_the_learners_function():
    """Numba's typing error carries the line in its text, not in the traceback's frames."""
    from numba import njit

    @njit
    def pads(img):
        return np.pad(img, 1)  # np.pad: not supported by Numba's compiler

    with pytest.raises(check.CheckError, match=r"at line \d+ of test_check_core\.py: return "
                                               r"np\.pad\(img, 1\)"):
        check.check_filter2d(lambda img, k: pads(img)[1:-1, 1:-1], device=False, quiet=True)

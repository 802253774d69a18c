"""convlab.check.conv: the array checkers reject each classic mistake with a specific
message, and accept right code.
"""

import numpy as np
import pytest

from convlab import check
from convlab import reference as ref

from . import planted


def _fails(checker, fn, *words):
    with pytest.raises(check.CheckError) as e:
        checker(fn, quiet=True)
    for w in words:
        assert w in str(e.value), str(e.value)


MESSAGES = {
    "unwritten": "were never written",
    "border": "(?s)outputs are wrong.*overlaps the image border",
    "nan": "outputs are NaN or Inf",
    "square": "(?s)outputs are wrong.*gets a square input right and this non-square one wrong",
    "stride": "(?s)outputs are wrong.*is the stride applied",
    "wrap": "(?s)outputs are wrong.*overlaps the image border",
}


@pytest.mark.parametrize("bug", planted.BUGS)
def test_planted_gpu_kernels_are_rejected(bug):
    with pytest.raises(check.CheckError, match=MESSAGES[bug]) as e:
        check.check_conv2d(planted.make(bug), quiet=True)
    text = str(e.value)
    assert "FAILED on x(" in text  # says which problem failed
    if bug == "stride":
        assert "stride=(2, 3)" in text
    if bug == "wrap":  # passes the padding-0 square case only: not an H/W mix-up
        assert "square" not in text, text
    if bug == "unwritten":  # the last column: in the border band, but a missing thread
        assert "every wrong output is one never written" in text, text
        assert "border" not in text, text


def test_square_bug_passes_square_inputs_only():
    """The 'square' kernel is right when H == W: the checker's non-square cases catch it."""
    from convlab.runtime import cuda

    rng = np.random.default_rng(0)
    x, w = check.random_array((1, 2, 9, 9), rng), check.random_array((3, 2, 3, 3), rng)
    out = cuda().to_device(check.poisoned((1, 3, 9, 9)))
    planted.make("square")(cuda().to_device(x), cuda().to_device(w), out, padding=1)
    np.testing.assert_allclose(out.copy_to_host(), ref.conv2d(x, w, padding=1), rtol=1e-5,
                               atol=1e-5)


def test_flipped_filter_is_named():
    def true_convolution(x, w, stride=1, padding=0):
        return ref.conv2d(x, np.ascontiguousarray(w[:, :, ::-1, ::-1]), stride, padding)

    with pytest.raises(check.CheckError, match="cross-correlation"):
        check.check_conv2d(true_convolution, quiet=True)


def test_correct_function_passes_and_reports():
    line = check.check_conv2d(lambda x, w, stride, padding: ref.conv2d(x, w, stride, padding),
                              quiet=True)
    assert line.startswith("✓ conv2d") and "cases passed" in line


def test_returning_none_means_not_implemented():
    def stub(x, w, stride=1, padding=0):
        pass

    with pytest.raises(check.CheckError, match="returned None: not implemented"):
        check.check_conv2d(stub, quiet=True)


def test_nothing_written_is_reported():
    def stub(x, w, out, stride=1, padding=0):
        pass

    with pytest.raises(check.CheckError, match="nothing was written"):
        check.check_conv2d(stub, quiet=True)


def test_nan_written_is_not_confused_with_unwritten():
    out = check.poisoned((2, 3))
    out[0, 0] = np.nan  # computed NaN
    c = check.compare(out, np.zeros((2, 3)))
    assert c.nonfinite == 1 and c.not_written == 5 and not c.ok


def test_inf_fails_and_nan_reference_mismatch_fails():
    c = check.compare(np.array([1.0, np.inf], np.float32), np.array([1.0, 2.0]))
    assert not c.ok and c.nonfinite == 1


def test_tolerance_scales_with_reduction_and_catches_one_missing_term():
    rng = np.random.default_rng(5)
    x, w = check.random_array((1, 64, 6, 6), rng), check.random_array((8, 64, 3, 3), rng)
    exp = ref.conv2d(x.astype(np.float64), w.astype(np.float64), padding=1)
    absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), padding=1)
    good = ref.conv2d(x, w, padding=1, accumulate=np.float32)
    assert check.compare(good, exp, absref, reduction=64 * 9).ok
    w_missing = w.copy()
    w_missing[:, -1] = 0  # drop the last input channel: ~1/64 of every sum
    bad = ref.conv2d(x, w_missing, padding=1)
    assert not check.compare(bad, exp, absref, reduction=64 * 9).ok


def test_race_detected_when_results_move_between_runs():
    calls = {"n": 0}

    def flaky(x, w, out, stride=1, padding=0):
        out[...] = ref.conv2d(x, w, stride, padding)
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            out[0, 0, 0, 0] = np.nextafter(out[0, 0, 0, 0], np.float32(np.inf))  # 1 ulp

    with pytest.raises(check.CheckError, match="differ between two runs"):
        check.check_conv2d(flaky, quiet=True)


def test_checker_data_is_fresh_and_non_uniform():
    seen = []
    check.check_conv2d(lambda x, w, stride, padding: (seen.append(x.copy()),
                                                      ref.conv2d(x, w, stride, padding))[1],
                       quiet=True)
    check.check_conv2d(lambda x, w, stride, padding: (seen.append(x.copy()),
                                                      ref.conv2d(x, w, stride, padding))[1],
                       quiet=True)
    first, again = seen[0], seen[len(seen) // 2]
    assert first.shape == again.shape and not np.array_equal(first, again)
    assert len(np.unique(first)) > 0.999 * first.size  # (almost) no repeated values
    shapes = {s.shape for s in seen}
    assert any(s[2] != s[3] for s in shapes)  # non-square inputs are tested


def test_missing_keyword_is_reported():
    with pytest.raises(check.CheckError, match="does not accept the argument stride"):
        check.check_conv2d(lambda x, w, padding: ref.conv2d(x, w, padding=padding), quiet=True)


def test_gemm_and_filter2d_checkers():
    check.check_gemm(lambda a, b: a @ b, quiet=True)
    with pytest.raises(check.CheckError, match="wrong"):
        check.check_gemm(lambda a, b: a @ b + 1e-3, quiet=True)
    check.check_filter2d(lambda img, k: ref.filter2d(img, k), quiet=True)
    with pytest.raises(check.CheckError, match="(?s)wrong.*hint: the output equals a true "
                                               "convolution \\(flipped filter\\)"):
        check.check_filter2d(lambda img, k: ref.filter2d(img, k[::-1, ::-1]), quiet=True)


def test_gemm_cases_catch_a_grid_sized_by_the_wrong_dimension():
    """A launcher that sizes its grid of 32-column blocks by K (b.shape[0]) instead of N
    covers every column of the first two cases; the third leaves most unwritten."""
    def grid_by_k(a, b, out):
        cols = 32 * -(-b.shape[0] // 32)  # the blocks a grid sized by K covers
        out[:, :cols] = (a @ b)[:, :cols]

    with pytest.raises(check.CheckError, match=r"FAILED on A 9x5 @ B 5x70\n.*were never written"):
        check.check_gemm(grid_by_k, device=False, quiet=True)


def test_wrong_shape_reported():
    with pytest.raises(check.CheckError, match="wrong output shape"):
        check.check_gemm(lambda a, b: (a @ b).T, quiet=True)


def test_im2col():
    check.check_im2col(ref.im2col, quiet=True)
    _fails(check.check_im2col, lambda x, hw, stride=1, padding=0, dilation=1:
           ref.im2col(x, hw, stride, padding, 1), "dilation")           # ignores dilation
    _fails(check.check_im2col, lambda x, hw, stride=1, padding=0, dilation=1:
           ref.im2col(x, hw, stride, padding, dilation).T.copy(), "transposed")
    _fails(check.check_im2col,
           lambda x, hw, stride=1, padding=0: ref.im2col(x, hw, stride, padding),
           "does not accept the argument dilation")


def _col2im_assign(cols, x_shape, hw, stride=1, padding=0, dilation=1):
    """A planted bug: '=' instead of '+=' (overlapping windows overwrite each other)."""
    N, C, H, W = x_shape
    (R, S), (sh, sw), (ph, pw), (dh, dw) = (ref.pair(hw), ref.pair(stride), ref.pair(padding),
                                            ref.pair(dilation))
    P, Q = ref.conv2d_output_shape((H, W), (R, S), stride, padding, dilation)
    c6 = cols.reshape(C, R, S, N, P, Q)
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw), cols.dtype)
    for r in range(R):
        for s in range(S):
            xp[:, :, r * dh:r * dh + sh * P:sh, s * dw:s * dw + sw * Q:sw] = \
                c6[:, r, s].transpose(1, 0, 2, 3)
    return xp[:, :, ph:ph + H, pw:pw + W]


def test_col2im():
    check.check_col2im(ref.col2im, quiet=True)
    _fails(check.check_col2im, _col2im_assign, "SUM of their copies")
    _fails(check.check_col2im, lambda c, s, hw, **kw: np.zeros(s, np.float32), "wrong")

    def no_dilation(cols, x_shape, hw, stride=1, padding=0, dilation=1):
        N, C, H, W = x_shape  # sums with +=, but places tap (r, s) at r, s: no dilation
        (R, S), (sh, sw), (ph, pw) = ref.pair(hw), ref.pair(stride), ref.pair(padding)
        P, Q = ref.conv2d_output_shape((H, W), (R, S), stride, padding, dilation)
        c6 = cols.reshape(C, R, S, N, P, Q)
        xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw), cols.dtype)
        for r in range(R):
            for s in range(S):
                xp[:, :, r:r + sh * P:sh, s:s + sw * Q:sw] += c6[:, r, s].transpose(1, 0, 2, 3)
        return xp[:, :, ph:ph + H, pw:pw + W]

    with pytest.raises(check.CheckError) as e:
        check.check_col2im(no_dilation, quiet=True)
    assert "every undilated case passed, this one has dilation=2" in str(e.value)
    assert "SUM of their copies" not in str(e.value)  # it sums: the '=' hint is not for it


def test_check_conv2d_case_passes_right_and_fails_wrong():
    def right(x, w, stride=1, padding=0, dilation=1):
        return ref.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)

    def off_by_one_padding(x, w, stride=1, padding=0, dilation=1):
        return ref.conv2d(x, w, stride=stride, padding=0, dilation=dilation)[..., :-1, :-1] \
            if padding else right(x, w, stride, padding, dilation)

    assert "1 cases passed" in check.check_conv2d_case(right, (1, 3, 9, 7), (2, 3, 3, 3),
                                                       stride=2, padding=1, dilation=2,
                                                       quiet=True)
    with pytest.raises(check.CheckError):
        check.check_conv2d_case(off_by_one_padding, (1, 3, 9, 7), (2, 3, 3, 3), padding=1,
                                quiet=True)


def test_check_conv2d_case_reports_under_the_callers_name():
    """A test that runs two of the learner's kernels says so in its failure."""
    def flipped(x, w, stride=1, padding=0):
        return ref.conv2d(x, w[:, :, ::-1, ::-1].copy(), stride=stride, padding=padding)

    with pytest.raises(check.CheckError, match=r"^conv2d_im2col \(your im2col, then your "
                                               r"GEMM\) FAILED on x\(2, 3, 9, 11\)"):
        check.check_conv2d_case(flipped, (2, 3, 9, 11), (5, 3, 3, 3), stride=(2, 1),
                                padding=1, device=False, quiet=True,
                                name="conv2d_im2col (your im2col, then your GEMM)")


def test_a_launcher_that_returns_its_own_array_is_told_to_fill_out():
    def own_array(a, b, out):
        return (a @ b).astype(np.float32)  # right numbers, but `out` is never written

    with pytest.raises(check.CheckError, match=r"own_array returned an array of its own and "
                                               r"left `out` unwritten: the checker reads `out`"):
        check.check_gemm(own_array, device=False, quiet=True)

    def fills_out(a, b, out):
        out[...] = a @ b
        return out

    assert "cases passed" in check.check_gemm(fills_out, device=False, quiet=True)


def test_a_filter_wrong_only_at_the_border_gets_the_border_hint():
    """'same' filter whose bounds test drops image row 0 and column 0 (gy > 0): every wrong
    output lies where the window touches the border."""
    def off_by_one(img, k):
        padded = np.pad(img, ((k.shape[0] // 2,) * 2, (k.shape[1] // 2,) * 2))
        padded[k.shape[0] // 2, :] = 0  # image row 0 read as padding
        padded[:, k.shape[1] // 2] = 0  # image column 0 too
        H, W = img.shape
        return np.array([[np.sum(padded[r:r + k.shape[0], c:c + k.shape[1]] * k)
                          for c in range(W)] for r in range(H)], np.float32)

    _fails(check.check_filter2d, off_by_one, "overlaps the image border")


def test_a_grouped_conv_that_ignores_the_groups_channel_offset_is_told_so():
    def no_offset(x, w, stride=1, padding=0, groups=1):
        cg = w.shape[1]  # every group reads channels 0 .. cg-1: right only when groups == 1
        return ref.conv2d(np.ascontiguousarray(np.tile(x[:, :cg], (1, groups, 1, 1))), w,
                          stride=stride, padding=padding, groups=groups)

    with pytest.raises(check.CheckError, match=r"every groups=1 case passed, this one has "
                                               r"groups=3: does each filter read only its own"):
        check.check_conv2d(no_offset, groups=True, quiet=True)


def test_a_depthwise_multiplier_read_the_other_way_is_named():
    def k_mod_c(x, w, stride=1, padding=0):
        C, K = x.shape[1], w.shape[0]
        return ref.conv2d(np.ascontiguousarray(x[:, [k % C for k in range(K)]]), w,
                          stride=stride, padding=padding, groups=K)

    with pytest.raises(check.CheckError, match=r"output channel k read input channel k % \d+: "
                                               r"it reads k // 2"):
        check.check_depthwise(k_mod_c, multiplier=2, device=False, quiet=True)


def test_an_fft_filter_that_wraps_around_is_told_to_pad():
    def circular(img, k):  # an FFT at the image's own size: the window wraps at the edges
        H, W = img.shape
        R, S = k.shape
        kp = np.zeros((H, W))
        kp[:R, :S] = k
        kp = np.roll(kp, (-(R // 2), -(S // 2)), axis=(0, 1))
        return np.real(np.fft.ifft2(np.fft.fft2(img) * np.conj(np.fft.fft2(kp))))

    with pytest.raises(check.CheckError, match=r"hint: the image wrapped around its edges") as e:
        check.check_filter2d_large(circular, quiet=True)
    assert "padding offset" not in str(e.value)  # the border hint, true but not the cause


def test_a_result_in_another_type_than_the_task_asks_fails_when_it_asks():
    def f64(img, k):
        return ref.filter2d(img.astype(np.float64), k)  # right values, float64

    assert "cases passed" in check.check_filter2d(f64, device=False, quiet=True)
    with pytest.raises(check.CheckError, match=r"returned float64 values, the task asks for "
                                               r"float32 \(convert at the end"):
        check.check_filter2d(f64, device=False, dtype=np.float32, quiet=True)
    with pytest.raises(check.CheckError, match="returned float64 values"):  # a list, too
        check.check_conv2d(lambda x, w, stride=1, padding=0: ref.conv2d(
            x, w, stride=stride, padding=padding).tolist(), dtype=np.float32, quiet=True)

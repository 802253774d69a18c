"""Values the learner's functions take and return cross `convlab.grading.wire` unchanged
(what the checkers accept in a notebook, the grader must accept too), and nothing else
crosses."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from convlab.grading import wire


def _roundtrip(value, tmp_path):
    spec = wire.Encoder(tmp_path, "r")(value)
    return wire.Decoder(tmp_path, 1 << 20)(json.loads(json.dumps(spec)))


@pytest.mark.parametrize("value", [
    [(0, 3), (3, 7)],  # pairs (check_partition's docstring: pairs, slices or ranges)
    [slice(0, 3), slice(3, None), slice(None, None, 2)],
    [range(0, 5, 2), range(5, 9)],
    {"a": (1, 2.5, None, True), "b": ["x", -4]},
])
def test_values_cross_unchanged(value, tmp_path):
    assert _roundtrip(value, tmp_path) == value


def test_arrays_and_non_finite_floats_cross(tmp_path):
    a = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    got = _roundtrip((a, float("nan"), -math.inf), tmp_path)
    assert np.array_equal(got[0], a) and got[0].dtype == np.float32
    assert math.isnan(got[1]) and got[2] == -math.inf


def test_a_torch_tensor_crosses_as_its_array(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5
    got = _roundtrip(t, tmp_path)
    assert isinstance(got, np.ndarray) and np.array_equal(got, t.numpy())


@pytest.mark.parametrize("value", [
    np.array([object(), 1], dtype=object), slice(0.5, 2), {1: 2}, object(),
])
def test_other_values_are_refused(value, tmp_path):
    with pytest.raises(wire.WireError):
        wire.Encoder(tmp_path, "r")(value)


def test_a_malformed_slice_in_a_reply_is_refused(tmp_path):
    for bad in ({"s": [0, 1]}, {"s": [0.5, 1, None]}, {"s": "0:1"}):
        with pytest.raises(wire.WireError):
            wire.Decoder(tmp_path, 1 << 20)(bad)


def test_replies_are_written_with_functions_bound_at_import(tmp_path, monkeypatch):
    """The worker runs in the learner's process: an answer that replaces json.dump,
    os.replace, os.open or np.save after the worker was imported does not change what the
    worker writes (a forged 'no host copies' reply went through json.dump)."""
    import os

    from convlab.grading import worker

    def boom(*a, **k):
        raise AssertionError("a replaced module function was used")

    for mod, name in ((json, "dump"), (json, "dumps"), (os, "replace"), (os, "open"),
                      (os, "fdopen"), (np, "save")):
        monkeypatch.setattr(mod, name, boom)
    monkeypatch.setitem(worker._cfg, "outbox", str(tmp_path))
    worker._reply(3, {"ok": True, "n": 3})
    spec = wire.Encoder(tmp_path, "r3")(np.arange(3.0))
    monkeypatch.undo()
    assert json.loads((tmp_path / "resp-3.json").read_text()) == {"ok": True, "n": 3}
    assert np.array_equal(np.load(tmp_path / spec["a"]), np.arange(3.0))

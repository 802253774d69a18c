"""convlab.results: the one reader of the stored measurements and tuned tables."""

import json

import pytest

from convlab import autotune, bench, measure, precision, results
from convlab import reference as ref


def test_load_reads_the_stored_files_and_names_the_known_ones():
    assert "h200" in results.names() and "h200_lessons04_06" in results.names()
    h200 = results.load("h200")
    assert h200["device"] and h200["ladders"]
    with pytest.raises(FileNotFoundError, match=r"no stored results nope\.json; known: .*h200"):
        results.load("nope")


def test_every_old_reader_is_this_reader():
    assert bench.stored_results("h200") == results.load("h200")
    assert precision.stored() == results.load("h200_lessons12_13")
    assert measure.stored() == results.load("h200_lessons04_06")
    key = next(iter(results.load("h200_lessons04_06")["sections"]))
    assert measure.stored(key) == results.load("h200_lessons04_06")["sections"][key]
    assert autotune.stored("cuda") == results.tuned("cuda")


def test_section_names_the_missing_key_and_reads_a_fresh_file(tmp_path):
    with pytest.raises(KeyError, match="has no section 'nope'; sections: "):
        results.section("h200_lessons04_06", "nope")
    f = tmp_path / "fresh.json"
    f.write_text(json.dumps({"sections": {"a": {"n": 3}}}))
    assert results.section("ignored", "a", path=f) == {"n": 3}


def test_problem_key_spells_every_argument():
    p = ref.conv_params((2, 3, 9, 11), (4, 3, 3, 5), stride=(1, 2), padding=(0, 1), dilation=2)
    assert results.problem_key(p) == "2,3,9,11,4,3,5/1,2/0,1/2,2"
    assert autotune.problem_key is results.problem_key


def test_tuned_tables_from_the_store_or_from_CONVLAB_TUNED(tmp_path, monkeypatch):
    stored = results.tuned("numba")
    assert stored and all(isinstance(v, dict) for v in stored.values())
    assert results.tuned("no such family") == {}
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"tuned": {"numba": {"k": {"BM": 64}}}}))
    monkeypatch.setenv(results.TUNED_ENV, str(f))
    assert results.tuned("numba") == {"k": {"BM": 64}}
    monkeypatch.setenv(results.TUNED_ENV, str(tmp_path / "missing.json"))
    assert results.tuned("numba") == {}  # no table: the kernels fall back to their heuristic
    f.write_text("{not json")
    monkeypatch.setenv(results.TUNED_ENV, str(f))
    assert results.tuned("numba") == {}

"""``benchmarks/guided_spread.py``: a matrix's search-arm times across several guided_search.py files. Mutations
killed: the spread taken as min/max (below 1), a row without a timed search arm counted, a model ratio of None
taken into the range, a missing file that is not a one-line error."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_benchmark

bench = load_benchmark("guided_spread")


def _file(path, rows):
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_the_spread_is_the_slowest_search_over_the_fastest(tmp_path, capsys) -> None:
    a = _file(tmp_path / "a.json", [{"matrix": "m", "arms": {"search": {"us": 5.0}}, "model_over_search": 1.1},
                                    {"matrix": "n", "arms": {"search": {"us": None}}, "model_over_search": None}])
    b = _file(tmp_path / "b.json", [{"matrix": "m", "arms": {"search": {"us": 5.5}}, "model_over_search": None},
                                    {"matrix": "n", "arms": {}, "model_over_search": None}])
    d = bench.spread([a, b])
    assert set(d) == {"m"} and len(d["m"]["runs"]) == 2
    assert d["m"]["search_spread"] == pytest.approx(1.1) and d["m"]["search_us_min"] == 5.0
    assert d["m"]["model_over_search_min"] == d["m"]["model_over_search_max"] == 1.1
    assert bench.main([str(a), str(b), "--out", str(tmp_path / "s.json")]) == 0
    assert "1.100" in capsys.readouterr().out and json.loads((tmp_path / "s.json").read_text())["m"]["runs"]


def test_a_missing_file_is_one_line(tmp_path, capsys) -> None:
    assert bench.main([str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no file at") and "\n" not in err

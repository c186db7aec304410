"""benchmarks/teacher_mix.py: an SFT set's targets counted by family, size and format (CPU). Mutations killed:
a store row counted under ``best_known`` instead of its matrix's family, a real matrix from the store taken for a
generated family (``lp_ship04l`` is not of the ``lp`` family), data build's names and their parser drifting apart, a size bin's edge on the wrong side (100k rows is not below 100k), store rows not told apart
from library rows, refinement rows not counted, a filter that lets other families through, a missing file or a
filter matching nothing passing silently."""

from __future__ import annotations

import json
from pathlib import Path

from sparserl.matrices.generators import family_of_generated, generated_name
from tests.conftest import load_benchmark

bench = load_benchmark("teacher_mix")


def _row(fmt: str, rows: int, family: str, matrix: str, refinement: bool = False) -> dict:
    return {"format": fmt, "shape": [rows, rows], "family": family, "matrix": matrix, "refinement": refinement}


ROWS = [
    _row("CSR", 59_319, "stencil3d_7", "data/matrices/stencil3d_7_000_59319.npz"),
    _row("DIA", 100_000, "best_known", "teacher/stencil3d_7_003_100000.npz"),
    _row("DIA", 1_520_875, "best_known", "teacher/stencil3d_7_007_1528419.npz", refinement=True),
    _row("CSR", 1_520_875, "best_known", "teacher/stencil3d_7_007_1528419.npz"),
    _row("COO", 4_000, "best_known", "teacher/polblogs.npz"),
    _row("COO", 402, "best_known", "teacher/lp_ship04l.npz"),  # a real matrix whose name starts with a family's
    _row("ELL", 20_000, "random", "data/matrices/random_000_20000.npz"),
]


def test_counts_by_family_size_and_format() -> None:
    mix = bench.teacher_mix(ROWS)
    assert set(mix) == {"stencil3d_7", "real", "random"}
    s = mix["stencil3d_7"]
    assert (s["rows"], s["store_rows"], s["refinement_rows"], s["matrices"], s["largest_rows"]) == (4, 3, 1, 3, 1_520_875)
    assert s["formats"] == {"DIA": 2, "CSR": 2} and s["store_formats"] == {"DIA": 2, "CSR": 1}
    assert s["by_size"] == {"<100k": {"CSR": 1}, "100k-500k": {"DIA": 1}, ">=1M": {"DIA": 1, "CSR": 1}}
    assert mix["real"]["formats"] == {"COO": 2}
    assert set(bench.teacher_mix(ROWS, {"random"})) == {"random"}


def test_the_family_is_read_from_the_name_data_build_gives() -> None:
    assert family_of_generated(generated_name("stencil3d_27", 7, 1_507_770)) == "stencil3d_27"
    for name in ("lp_ship04l", "stencil3d_7_03_100", "nofamily_003_100", "stencil3d_7"):
        assert family_of_generated(name) is None, name


def test_cli_writes_json_and_refuses_what_it_cannot_read(tmp_path: Path, capsys) -> None:
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "mix.json"
    assert bench.main(["--data", str(tmp_path), "--families", "stencil3d_7", "--out", str(out)]) == 0
    assert set(json.loads(out.read_text())["families"]) == {"stencil3d_7"}
    assert "stencil3d_7: 4 rows (3 from the store, 1 refinement)" in capsys.readouterr().out
    assert bench.main(["--data", str(tmp_path / "nowhere")]) == 2
    assert bench.main(["--data", str(tmp_path), "--families", "banded"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 2 and "does not exist" in err and "no rows of ['banded']" in err

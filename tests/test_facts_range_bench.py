"""benchmarks/facts_range.py: the distinct facts blocks a teacher from these matrices could show (CPU). Mutations
killed: matrices counted instead of distinct blocks, the block rendered for another card than the matrix's (the
same for every matrix), a template that names its facts counted (``csr_split_spec``: one text for every matrix),
a template's first seed point taken whether or not its check accepts it (``csr_adaptive_spec`` left out), a file
that is no generated matrix counted under a family, a data folder not read through its ``matrices`` folder, an
empty folder or a missing one passing silently, and two folders of one name keyed alike in the JSON (one
overwritten)."""

from __future__ import annotations

import json
from pathlib import Path

from sparserl.matrices import generate
from sparserl.matrices.io import save_matrix
from tests.conftest import load_benchmark

bench = load_benchmark("facts_range")


def _folder(root: Path, seeds: list[int]) -> Path:
    """Skewed matrices of 3000 rows (3 long rows each), drawn with these seeds: one seed, one block of long rows
    (csr_adaptive_spec's first seed point the check accepts has long_len 1024: a table of the 3)."""
    root.mkdir(parents=True)
    for i, seed in enumerate(seeds):
        save_matrix(generate("skewed", 3000, seed=seed), root / f"skewed_{i:03d}_3000.npz")
    return root


def test_distinct_blocks_follow_the_cards(tmp_path: Path, capsys) -> None:
    same = _folder(tmp_path / "same", [5, 5, 5])
    _folder(tmp_path / "drawn" / "matrices", [3, 7, 7])  # a data folder: read through its matrices
    save_matrix(generate("skewed", 3000, seed=9), tmp_path / "same" / "my_matrix.npz")  # no generated name
    out = tmp_path / "range.json"
    assert bench.main([str(same), str(same.parent / "drawn"), "--out", str(out)]) == 0
    table = json.loads(out.read_text())["folders"]
    # csr_adaptive_spec spells its facts; csr_split_spec, which applies too, names them: left out
    assert table["same"]["skewed"] == {"csr_adaptive_spec": {"matrices": 3, "distinct_facts": 1}}
    assert table["drawn"]["skewed"] == {"csr_adaptive_spec": {"matrices": 3, "distinct_facts": 2}}
    assert set(table["same"]) == {"skewed"}
    assert "skewed: " in capsys.readouterr().out


def test_a_folder_without_generated_matrices_is_an_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert bench.main([str(tmp_path / "empty")]) == 2
    assert "holds no generated matrices" in capsys.readouterr().err
    assert bench.main([str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_two_folders_of_one_name_are_an_error_not_one_overwritten(tmp_path: Path, capsys) -> None:
    """The JSON keys each folder by its last name: two of the same name would leave one of them out of it."""
    a, b = _folder(tmp_path / "a" / "default", [5]), _folder(tmp_path / "b" / "default", [7])
    out = tmp_path / "range.json"
    assert bench.main([str(a), str(b), "--out", str(out)]) == 2
    assert "same last name (default)" in capsys.readouterr().err
    assert not out.exists()

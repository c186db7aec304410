"""A data folder read from another folder than the one it was built in: ``data build`` writes each row's
matrix path as it was given (relative to where it ran), and every reader (SFT, ``ppo --matrices``,
``evaluate --matrices``) goes through :func:`sparserl.data.rows.read_rows`, which finds the file by its place
in the data folder. Killed mutation: the resolution removed (the rows' paths dangle from another folder, SFT
refuses a row whose matrix is "missing" and the evaluation lists files that do not open)."""

from __future__ import annotations

from pathlib import Path

from sparserl.data.rows import SFTRow, matrix_beside, read_rows, write_rows
from sparserl.eval.compare import EvalConfig, matrix_files
from sparserl.matrices import generate, save_matrix

CODE = "FORMAT: CSR\nLAUNCH: grid=1, block=32\n"


def test_a_data_folder_finds_its_matrices_from_elsewhere(tmp_path: Path, monkeypatch) -> None:
    built_in = tmp_path / "w"
    data = built_in / "dbrel"
    (data / "matrices").mkdir(parents=True)
    A = generate("banded", 200, seed=0)
    save_matrix(A, data / "matrices" / "banded_0.npz")
    row = SFTRow(rows=[0], cols=[0], shape=(200, 200), code=CODE, format="CSR", nnz=int(A.nnz),
                 matrix="dbrel/matrices/banded_0.npz", family="banded", split="test", name="banded_0")
    write_rows(data / "test.jsonl", [row])
    monkeypatch.chdir(built_in)  # where it was built: the path as written opens
    assert read_rows(data / "test.jsonl")[0].matrix == "dbrel/matrices/banded_0.npz"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    found = read_rows(data / "test.jsonl")[0].matrix
    assert Path(found).resolve() == (data / "matrices" / "banded_0.npz").resolve() and Path(found).exists()
    listed = matrix_files(EvalConfig(matrices=str(data), split="test", compile_only=True))
    assert [Path(f).resolve() for f, _ in listed] == [(data / "matrices" / "banded_0.npz").resolve()]


def test_paths_that_open_or_cannot_be_found_are_left_as_written(tmp_path: Path) -> None:
    assert matrix_beside(None, tmp_path) is None
    assert matrix_beside("/abs/m.npz", tmp_path) == "/abs/m.npz"
    assert matrix_beside("nowhere/m.npz", tmp_path) == "nowhere/m.npz"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.npz").write_bytes(b"")
    assert matrix_beside("sub/m.npz", tmp_path) == str(tmp_path / "sub" / "m.npz")

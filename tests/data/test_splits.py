"""Split assignment of the SFT data's matrices, and what it says when a split comes out empty."""

from __future__ import annotations

import logging
from pathlib import Path

from sparserl.data.sft_build import SFTDataConfig, make_matrices
from sparserl.matrices import generate, save_matrix


def test_empty_split_warning_names_what_was_rounded_down(tmp_path: Path, caplog) -> None:
    """train_sft --dataset-dir with three real matrices: 3 x 0.20 rounds down to no validation
    matrix, and the warning says so (it used to say '0 per family x 0.20')."""
    real = tmp_path / "real"
    real.mkdir()
    for i, fam in enumerate(("banded", "random", "diagonal")):
        save_matrix(generate(fam, 200, seed=i), real / f"m{i}.mtx")
    cfg = SFTDataConfig(out=str(tmp_path / "d"), matrices_per_family=0, real_dir=str(real), real_split="mixed",
                        val_fraction=0.2, test_fraction=0.0)
    with caplog.at_level(logging.WARNING, logger="sparserl.data.sft_build"):
        entries = make_matrices(cfg)
    assert [e.split for e in entries] == ["train"] * 3
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "no matrix went to the val split" in msg and "(3 real matrices x 0.20)" in msg and "per" not in msg
    caplog.clear()
    cfg = SFTDataConfig(out=str(tmp_path / "g"), families=("banded",), matrices_per_family=2, min_rows=100,
                        max_rows=200, val_fraction=0.2, test_fraction=0.0)
    with caplog.at_level(logging.WARNING, logger="sparserl.data.sft_build"):
        make_matrices(cfg)
    assert "(2 per generated family x 0.20)" in caplog.records[0].getMessage()


def test_data_build_splits_real_matrices_as_asked_and_names_a_bad_folder(cli, tmp_path: Path, monkeypatch) -> None:
    """``--real-split mixed`` reaches the config (the real matrices spread over train, val and test like a family's;
    without it all go to test), and a missing folder or an unknown split is one line. Kills the option parsed and
    dropped (every real matrix in test)."""
    from tests.conftest import one_line_error

    real = tmp_path / "real"
    real.mkdir()
    for i in range(4):
        save_matrix(generate("banded", 200 + i, seed=i), real / f"m{i}.mtx")  # banded ignores the seed: sizes differ
    cfg = SFTDataConfig(out=str(tmp_path / "d"), matrices_per_family=0, real_dir=str(real), real_split="mixed",
                        val_fraction=0.25, test_fraction=0.25)
    assert sorted(e.split for e in make_matrices(cfg)) == ["test", "train", "train", "val"]
    import sparserl.cli.data as command

    made = []
    monkeypatch.setattr(command, "make_matrices", lambda c: made.append(c) or make_matrices(c))
    res = cli("data", "build", "--out", tmp_path / "o", "--per-family", "0", "--real-dir", real, "--real-split",
              "mixed", "--val-fraction", "0.25", "--test-fraction", "0.25", "--matrices-only")
    assert res.rc == 0, res.err
    assert [c.real_split for c in made] == ["mixed"] and not made[0].vary_params
    res = cli("data", "build", "--out", tmp_path / "p", "--per-family", "0", "--real-dir", real, "--vary-params",
              "--matrices-only")
    assert res.rc == 0 and made[-1].vary_params, res.err  # the option reaches the build
    monkeypatch.undo()
    one_line_error(cli("data", "build", "--out", tmp_path / "o", "--per-family", "0", "--real-dir", real,
                       "--real-split", "half", "--matrices-only"), "--real-split is test or mixed")
    one_line_error(cli("data", "build", "--out", tmp_path / "o", "--per-family", "0", "--real-dir",
                       tmp_path / "none", "--matrices-only"), "not a folder")


def test_no_two_matrices_share_a_structure_within_or_across_builds(tmp_path: Path, caplog) -> None:
    """stencil3d_7 ignores the seed and rounds its size to a cube: 1000-1400 rows give only two grids (10^3,
    11^3). Two matrices are drawn distinct; a third cannot be and the build says so; a second build told
    --distinct-from the first repeats neither; a real matrix stored twice (.mtx and .mtx.gz) comes in once.
    Kills the check left out (a held-out matrix repeating a training one under another name, as the full
    preset's test split once repeated a teacher matrix), or a repeat seen within a build only."""
    import pytest

    from sparserl.errors import SparseRLError
    from sparserl.matrices import load_matrix
    from sparserl.matrices.card import structure_fingerprint

    def prints(entries) -> list[str]:
        return [structure_fingerprint(load_matrix(e.path)) for e in entries]

    cfg = dict(families=("stencil3d_7",), min_rows=1000, max_rows=1400, val_fraction=0.0, test_fraction=0.0)
    two = make_matrices(SFTDataConfig(out=str(tmp_path / "a"), matrices_per_family=2, **cfg))
    assert len(set(prints(two))) == 2
    assert make_matrices(SFTDataConfig(out=str(tmp_path / "a"), matrices_per_family=2, **cfg)) == two  # again: the same
    with pytest.raises(SparseRLError, match="repeat an earlier matrix's structure"):
        make_matrices(SFTDataConfig(out=str(tmp_path / "b"), matrices_per_family=3, **cfg))
    one = make_matrices(SFTDataConfig(out=str(tmp_path / "c"), matrices_per_family=1, seed=1, **cfg))
    other = make_matrices(SFTDataConfig(out=str(tmp_path / "d"), matrices_per_family=1, seed=1,
                                        distinct_from=(str(tmp_path / "c"),), **cfg))
    assert prints(one) != prints(other)
    real = tmp_path / "real"
    real.mkdir()
    A = load_matrix(two[0].path)
    save_matrix(A, real / "x.mtx")
    save_matrix(A, real / "x.mtx.gz")  # the same matrix twice
    save_matrix(generate("banded", 300, seed=0), real / "y.mtx")
    with caplog.at_level(logging.WARNING, logger="sparserl.data.sft_build"):
        listed = make_matrices(SFTDataConfig(out=str(tmp_path / "e"), matrices_per_family=0, real_dir=str(real)))
    assert [e.name for e in listed] == ["x", "y"] and "x.mtx.gz is left out" in caplog.text


def test_stratified_sizes_cover_the_range_and_random_ones_are_unchanged() -> None:
    """Kills: 'stratified' drawing over the whole range (a family's sizes can then all be small), a bin
    off by one, and 'random' consuming the generator differently (a seed's data set would change)."""
    import math

    import numpy as np
    import pytest

    from sparserl.data.sft_build import draw_rows
    from sparserl.errors import SparseRLError

    n = 8
    strat = SFTDataConfig(min_rows=10_000, max_rows=2_000_000, matrices_per_family=n, size_draw="stratified")
    edges = [math.exp(math.log(10_000) + (math.log(2_000_000) - math.log(10_000)) * j / n) for j in range(n + 1)]
    for seed in range(20):
        rng = np.random.default_rng(seed)
        rows = [draw_rows(i, strat, rng) for i in range(n)]
        assert all(int(edges[i]) <= r <= edges[i + 1] for i, r in enumerate(rows)), (seed, rows)
    rand = SFTDataConfig(min_rows=10_000, max_rows=2_000_000, matrices_per_family=n)
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    assert [draw_rows(i, rand, a) for i in range(n)] == [
        int(math.exp(b.uniform(math.log(10_000), math.log(2_000_000)))) for _ in range(n)]
    with pytest.raises(SparseRLError, match="--size-draw"):
        SFTDataConfig(size_draw="even")


def test_drawn_parameters_vary_the_facts_and_are_kept_beside_each_matrix(tmp_path: Path) -> None:
    """``vary_params``: a family's structural parameters drawn per matrix (within its ranges), so the cards'
    facts differ; without it every matrix has the defaults and the seed's data set is unchanged; a folder made
    one way and built again the other way makes its matrices again rather than reuse them. Kills: the draw
    ignored (every banded matrix 9 bands), a draw outside the family's range, the defaults' data set changed by
    the option's code (another draw taken from the seed's generator), and a matrix file reused although it was
    made with other parameters (the default build after a drawn one would keep the drawn bands)."""
    import json

    import numpy as np

    from sparserl.matrices import load_matrix
    from sparserl.matrices.card import matrix_card
    from sparserl.matrices.generators import FAMILIES, draw_params

    rng = np.random.default_rng(0)
    draws = [draw_params("banded", rng) for _ in range(200)]
    assert {d["bands"] for d in draws} == set(range(3, 26))  # every value of the inclusive range, none outside
    assert draw_params("stencil2d", rng) == {} and draw_params("block", rng).keys() == {"blocks_per_row"}
    assert all(lo <= FAMILIES[f].defaults[k] <= hi for f, spec in FAMILIES.items() for k, (lo, hi) in spec.ranges.items())

    def diagonals(entries) -> list[int]:
        return [matrix_card(load_matrix(e.path)).num_diagonals for e in entries if e.family == "banded"]

    cfg = dict(families=("banded", "random"), matrices_per_family=6, min_rows=2_000, max_rows=4_000,
               val_fraction=0.0, test_fraction=0.0)
    default = make_matrices(SFTDataConfig(out=str(tmp_path / "a"), **cfg))
    assert diagonals(default) == [9] * 6
    drawn = make_matrices(SFTDataConfig(out=str(tmp_path / "b"), vary_params=True, **cfg))
    bands = diagonals(drawn)
    assert len(set(bands)) >= 3 and all(3 <= b <= 25 for b in bands), bands
    kept = [json.loads(Path(e.path.replace(".npz", ".params.json")).read_text()) for e in drawn if e.family == "banded"]
    assert [k["bands"] for k in kept] == bands
    lengths = {matrix_card(load_matrix(e.path)).row_len_max for e in drawn if e.family == "random"}
    assert len(lengths) >= 3  # random's row length drawn too
    same_rows = make_matrices(SFTDataConfig(out=str(tmp_path / "c"), **cfg))
    assert [e.name for e in same_rows] == [e.name for e in default]  # the option's code leaves the default draws be
    again = make_matrices(SFTDataConfig(out=str(tmp_path / "b"), **cfg))  # the drawn folder, built with defaults
    assert {e.name for e in again} & {e.name for e in drawn}  # a file of the drawn build is there under its name
    assert diagonals(again) == [9] * 6
    assert not any(Path(e.path.replace(".npz", ".params.json")).exists() for e in again)


def test_bad_split_fractions_name_the_flags() -> None:
    """The message names the command's flags and the values given (it named the config's fields)."""
    import pytest

    from sparserl.data.sft_build import SFTDataConfig
    from sparserl.errors import SparseRLError

    with pytest.raises(SparseRLError, match=r"--val-fraction and --test-fraction .* \(got 1.5 and 0.1\)"):
        SFTDataConfig(val_fraction=1.5, test_fraction=0.1)


def test_an_empty_real_dir_is_refused_before_anything_is_generated(tmp_path: Path) -> None:
    """``data build --real-dir EMPTY`` generated every family's matrices (736 MB at the defaults) before it said the
    folder held none, and left them behind."""
    import pytest

    from sparserl.errors import SparseRLError

    (tmp_path / "empty").mkdir()
    with pytest.raises(SparseRLError, match="--real-dir .*empty: no .mtx/.mtx.gz/.npz files in it"):
        SFTDataConfig(out=str(tmp_path / "d"), real_dir=str(tmp_path / "empty"))
    assert not (tmp_path / "d").exists()

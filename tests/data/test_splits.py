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

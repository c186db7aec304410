"""A data folder as 'sparserl data build' writes it, for the improve tests (CPU and GPU)."""

from __future__ import annotations

import json
from pathlib import Path

from sparserl.kernels.library import variants
from sparserl.matrices import generate, save_matrix


def write_data_folder(d: Path, splits: dict[str, tuple[tuple[str, int, int], ...]]) -> Path:
    """``d`` with ``matrices/FAMILY_SEED.mtx`` and one ``SPLIT.jsonl`` per split: for each
    (family, seed, rows) a generated matrix and a row naming it, the first CSR library kernel as its code."""
    code = variants("spmv", "CSR")[0].render()
    for split, specs in splits.items():
        rows = []
        for fam, seed, n in specs:
            path = d / "matrices" / f"{fam}_{seed}.mtx"
            path.parent.mkdir(parents=True, exist_ok=True)
            A = generate(fam, n, seed=seed)
            save_matrix(A, path)
            rows.append({"rows": [0], "cols": [0], "shape": list(A.shape), "code": code, "format": "CSR",
                         "op": "spmv", "k": None, "nnz": int(A.nnz), "family": fam, "split": split,
                         "matrix": str(path)})
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d

"""SFT rows as policy inputs: each row's matrix, its encoder input and its card.

A data set names the same matrix in many rows (several targets per matrix, SpMV and SpMM rows),
so :class:`SFTDataset` loads, samples and describes each matrix once and keeps the results for as
long as it lives: one training run. A row's matrix is its matrix file when that exists, else the
coordinates the row carries (the paper's cut-down data holds whole matrices there) with unit values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparserl.data.rows import SFTRow, read_nonempty, read_rows
from sparserl.encoding import EncodingConfig, MatrixInput
from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.matrices import canonicalize, load_matrix
from sparserl.matrices.card import MatrixCard, prompt_card
from sparserl.model.policy import PolicyConfig, Sample, make_sample
from sparserl.parallel import parallel_map


def row_matrix(row: SFTRow) -> tuple[str, sp.csr_array]:
    """(name, matrix) of a data row: its matrix file when it exists, else the stored coordinates
    (the paper's rows/cols fields, whole matrices in its cut-down data) with unit values."""
    if row.matrix and Path(row.matrix).exists():
        return row.matrix_name, load_matrix(row.matrix)
    m, n = row.shape
    r, c = np.asarray(row.rows, np.int64), np.asarray(row.cols, np.int64)
    if r.size == 0 or r.size != c.size or r.min() < 0 or c.min() < 0 or r.max() >= m or c.max() >= n:
        raise SparseRLError(f"data row has rows/cols that do not fit its shape {m} x {n}")
    A = canonicalize(sp.coo_array((np.ones(r.size, np.float32), (r, c)), shape=(m, n)).tocsr())
    digest = hashlib.sha1(r.tobytes() + c.tobytes()).hexdigest()[:12]
    return f"coords_{m}x{n}_{digest}", A


def row_card(row: SFTRow, name: str, A: sp.csr_array) -> str:
    """The card's prompt text for a data row: of its matrix file when it exists, else of the card
    facts it carries (``card``: a best-known export), else of its coordinates when they are all of
    its nonzeros. Raises SparseRLError otherwise (the card of sampled coordinates would be wrong)."""
    if row.matrix and Path(row.matrix).exists():
        return prompt_card(A)
    if row.card is not None:
        return MatrixCard.from_dict(row.card).prompt()
    if row.nnz is None or int(row.nnz) == A.nnz:
        return prompt_card(A)
    raise SparseRLError(f"data row of {name}: its matrix file is missing and its rows/cols hold {A.nnz} of "
                        f"{row.nnz} nonzeros, so its matrix card cannot be made (train with --no-card, or "
                        "keep the data's matrix files)")


class SFTDataset:
    """Rows, and the policy input of each, made once per matrix (:func:`make_sample`'s input and card).

    ``config``: the policy's (its encoding and whether its prompt carries the card); an
    ``EncodingConfig`` alone gives samples without the card."""

    def __init__(self, rows: list[SFTRow], config: PolicyConfig | EncodingConfig):
        if isinstance(config, EncodingConfig):
            config = PolicyConfig(encoding=config, card=False)
        self.rows, self.config = rows, config
        self._matrices: dict[str, tuple[str, sp.csr_array]] = {}
        self._inputs: dict[tuple, MatrixInput] = {}
        self._cards: dict[tuple, str] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def matrix(self, row: SFTRow) -> tuple[str, sp.csr_array]:
        """(name, matrix) of ``row`` (:func:`row_matrix`); a matrix file is loaded once."""
        if not (row.matrix and Path(row.matrix).exists()):
            return row_matrix(row)  # from the row's own coordinates: no file to keep it by
        if row.matrix not in self._matrices:
            self._matrices[row.matrix] = row_matrix(row)
        return self._matrices[row.matrix]

    def matrices_made(self) -> list[str]:
        """The matrix files loaded so far (each once)."""
        return list(self._matrices)

    def warm(self, workers: int | None = None) -> float:
        """Load, sample and describe every matrix file the rows name, in threads (one task a matrix:
        the first row naming it, with each of its distinct shapes); returns the seconds it took.
        :meth:`sample` then finds them made instead of making them on the training loop's path."""
        t0 = time.perf_counter()
        by_file: dict[str, list[SFTRow]] = {}
        for row in self.rows:
            if row.matrix and Path(row.matrix).exists():
                shapes = by_file.setdefault(row.matrix, [])
                if all(tuple(r.shape) != tuple(row.shape) for r in shapes):
                    shapes.append(row)

        def one(rows: list[SFTRow]) -> None:  # one thread per file: no two fill the same entries
            for row in rows:
                self.sample(dataclasses.replace(row, refinement=None))

        parallel_map(one, list(by_file.values()), workers)
        return time.perf_counter() - t0

    def sample(self, row: SFTRow) -> Sample:
        """The policy input for ``row``, as :func:`~sparserl.model.policy.make_sample` builds it."""
        name, A = self.matrix(row)
        key = (row.matrix if row.matrix and Path(row.matrix).exists() else name, row.shape)
        if key not in self._inputs:
            self._inputs[key] = MatrixInput.from_matrix(A, self.config.encoding)
        card = None
        if self.config.card:
            if key not in self._cards:
                self._cards[key] = row_card(row, name, A)
            card = self._cards[key]
        nnz = int(row.nnz) if row.nnz is not None else int(A.nnz)
        sample = make_sample(A, self.config, Op(row.op), row.k, inp=self._inputs[key], nnz=nnz, card=card)
        if row.refinement is None:
            return sample
        from sparserl.search.policy import refinement_text

        r = row.refinement
        prompt = refinement_text(Op(row.op), row.k, tuple(row.shape), nnz, card, r.previous, r.outcome, r.correct)
        return dataclasses.replace(sample, prompt=prompt)


def load_splits(data: str, seed: int) -> tuple[list[SFTRow], list[SFTRow]]:
    """(train rows, validation rows) of a data folder (train.jsonl, val.jsonl when it has rows), or of
    one JSONL file: its rows' own ``split`` where they name validation rows (test rows left out), else a
    seeded tenth of its *matrices* held out, every row of a matrix on one side (a matrix has several
    rows: targets, SpMV and SpMM; split by row, validation would score matrices trained on)."""
    p = Path(data)
    if p.is_dir():
        v = p / "val.jsonl"
        return read_nonempty(p / "train.jsonl"), read_rows(v) if v.exists() else []
    rows = read_nonempty(p)
    if any(r.split == "val" for r in rows):
        return [r for r in rows if r.split in (None, "train")], [r for r in rows if r.split == "val"]
    keys = [_matrix_key(r) for r in rows]
    distinct = sorted(set(keys))
    if len(distinct) < 2:
        return rows, []
    order = np.random.default_rng(seed).permutation(len(distinct))
    held = {distinct[i] for i in order[:max(1, len(distinct) // 10)]}
    return [r for r, k in zip(rows, keys) if k not in held], [r for r, k in zip(rows, keys) if k in held]


def _matrix_key(row: SFTRow) -> str:
    """Which matrix a row is of: its file or name where it has one, else a digest of its shape and coordinates."""
    if row.matrix or row.name:
        return f"{row.matrix or ''}|{row.name or ''}"
    h = hashlib.sha256(repr(tuple(row.shape)).encode())
    h.update(np.asarray(row.rows, dtype=np.int64).tobytes())
    h.update(np.asarray(row.cols, dtype=np.int64).tobytes())
    return h.hexdigest()

"""Matrices as files: how the parent hands a matrix to the GPU workers (and a worker to itself).

A matrix is saved once under a hash of its content (shape, pattern and values), so the same matrix
is the same file and a worker that holds it under that key need not load it again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def matrix_key(A: sp.csr_array) -> str:
    """Content hash of a canonical CSR matrix (shape, pattern and values)."""
    h = hashlib.sha1()
    h.update(np.asarray(A.shape, np.int64).tobytes())
    for arr in (A.indptr, A.indices, A.data):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:20]


def save_matrix_file(A: sp.csr_array, folder: Path) -> tuple[str, Path]:
    """Save ``A`` for workers; returns (content key, path). Same matrix, same file."""
    key = matrix_key(A)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.npz"
    if not path.exists():
        tmp = folder / f"{key}.{os.getpid()}.tmp.npz"
        np.savez(tmp, indptr=A.indptr, indices=A.indices, data=A.data, shape=np.asarray(A.shape))
        os.replace(tmp, path)
    return key, path


def load_matrix_file(path: str) -> sp.csr_array:
    with np.load(path) as z:
        return sp.csr_array((z["data"], z["indices"], z["indptr"]), shape=tuple(int(s) for s in z["shape"]))

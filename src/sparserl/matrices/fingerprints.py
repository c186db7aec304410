"""Which structures a set of matrix files holds: a held-out matrix must not be a training one under another name.

Several generators ignore the seed (diagonal, banded, the stencils, arrow) and the stencils round the size to a
grid, so two matrices of different names and sizes can be one structure. :func:`structure_fingerprint` (the
pattern's hash, values left out) tells them apart; :class:`Fingerprints` keeps a folder's in its
``fingerprints.json`` so that a second look does not load every matrix again, and :func:`structures_in` gathers
the structures of whole folders (a data folder's ``matrices/``, or a folder of matrices).
"""

from __future__ import annotations

import json
from pathlib import Path

from sparserl.matrices.card import structure_fingerprint
from sparserl.matrices.io import load_matrix, matrices_in


class Fingerprints:
    """Structure fingerprints of matrix files, kept in a folder's ``fingerprints.json``. A file is known by its
    resolved path and size."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / "fingerprints.json"
        try:
            self.known: dict[str, str] = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (OSError, ValueError):
            self.known = {}  # unreadable: made again from the files
        self.changed = False

    @staticmethod
    def key(path: Path) -> str:
        return f"{Path(path).resolve()}:{Path(path).stat().st_size}"

    def of(self, path: Path) -> str:
        """The fingerprint of the matrix in ``path`` (loaded when it is not known yet)."""
        key = self.key(path)
        if key not in self.known:
            self.record(path, structure_fingerprint(load_matrix(path)))
        return self.known[key]

    def record(self, path: Path, fingerprint: str) -> None:
        """``fingerprint`` is the one of the matrix just written to ``path``."""
        self.known[self.key(path)] = fingerprint
        self.changed = True

    def save(self) -> None:
        if self.changed:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.known, indent=0))
            tmp.replace(self.path)
            self.changed = False


def matrices_folder(folder: str | Path) -> Path:
    """A data folder's ``matrices/``, or the folder itself."""
    d = Path(folder)
    return d / "matrices" if (d / "matrices").is_dir() else d


def structures_in(folders) -> dict[str, str]:
    """Fingerprint -> file name of every matrix in ``folders`` (see :func:`matrices_folder`)."""
    found: dict[str, str] = {}
    for d in folders:
        folder = matrices_folder(d)
        prints = Fingerprints(folder)
        for f in matrices_in(folder):
            found.setdefault(prints.of(f), f.name)
        prints.save()
    return found

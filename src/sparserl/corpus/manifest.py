"""The corpus manifest: one row per file kept, where it came from and which split it is in.

A built corpus folder holds ``manifest.jsonl`` (these rows), ``summary.json`` (per package:
files seen, kept, dropped by reason, bytes; the rules the corpus was built under,
:data:`CORPUS_VERSION`) and ``files/`` (each file's text once, named by its SHA-256; texts that differ
only in line ends and trailing white space are one text, stored and trained on once).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from sparserl.errors import SparseRLError

MANIFEST = "manifest.jsonl"
SUMMARY = "summary.json"
FILES = "files"
SPLITS = ("train", "heldout")
LIBRARY = "sparserl-library"
"""The package of the project's kernel library, rendered."""
TEMPLATES = "sparserl-templates"
"""The package of the search templates rendered at their seed points (the specialised bodies the search's
winners are made of, which the library alone never shows)."""
OWN = (LIBRARY, TEMPLATES)
"""The packages of the project's own kernels."""
CORPUS_VERSION = 2
"""The rules a corpus is built under, recorded in ``summary.json`` (``corpus_version``; none: 1). 2: texts equal
but for line ends and trailing white space are duplicates; a held-out file with a near-copy in the train split is
dropped; the local sources (toolkit, library, templates) give no held-out share. A corpus built under other rules
is packed only after it is built again."""


@dataclass(frozen=True)
class ManifestRow:
    """One file of the corpus."""

    package: str
    """Distribution it came from ('cuda-toolkit' and 'sparserl-library' for the two local sources)."""
    version: str
    """That distribution's version."""
    licence: str
    """The file's SPDX line when it has one, else the package's declared licence."""
    path: str
    """Path inside the package's archive (or include folder)."""
    sha256: str
    """Hash of the file's bytes: its name under ``files/`` (the de-duplication key is the hash of its text with
    line ends and trailing white space normalised, :func:`sparserl.corpus.build.content_key`)."""
    bytes: int
    """Size in bytes."""
    split: str
    """'train' or 'heldout'."""

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")


def file_path(corpus: Path, sha256: str) -> Path:
    """Where the text with hash ``sha256`` lives in a corpus folder."""
    return Path(corpus) / FILES / sha256[:2] / f"{sha256}.txt"


def write_manifest(corpus: Path, rows: Iterable[ManifestRow]) -> None:
    """Write ``manifest.jsonl`` atomically."""
    path = Path(corpus) / MANIFEST
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(asdict(row)) + "\n")
    tmp.replace(path)


def read_manifest(corpus: Path) -> list[ManifestRow]:
    """The rows of a built corpus; a folder without a readable manifest is a SparseRLError."""
    path = Path(corpus) / MANIFEST
    if not path.exists():
        raise SparseRLError(f"{corpus}: no {MANIFEST} here, so not a built corpus: build one with "
                            "'sparserl corpus build --out DIR'")
    names = {f.name for f in fields(ManifestRow)}
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rows.append(ManifestRow(**{k: rec[k] for k in names}))
        except (ValueError, KeyError, TypeError) as exc:
            raise SparseRLError(f"{path}:{i}: not a manifest row ({exc}); build the corpus again") from None
    if not rows:
        raise SparseRLError(f"{path} lists no files: the corpus holds nothing usable; build it again "
                            "with packages or archives that ship CUDA source")
    return rows


def read_summary(corpus: Path) -> dict:
    """``summary.json`` of a corpus built under the current rules (:data:`CORPUS_VERSION`); one built under
    others, or without a readable summary, is a SparseRLError."""
    path = Path(corpus) / SUMMARY
    try:
        summary = json.loads(path.read_text())
        version = summary.get("corpus_version", 1)
    except (OSError, ValueError, AttributeError):
        raise SparseRLError(f"{corpus}: no readable {SUMMARY}: build the corpus again (texts already stored are "
                            "kept)") from None
    if version != CORPUS_VERSION:
        raise SparseRLError(f"{corpus} was built under corpus rules {version}, not {CORPUS_VERSION} (its held-out "
                            "split may hold near-copies of training files): build it again (texts already stored "
                            "are kept)")
    return summary


def read_text(corpus: Path, row: ManifestRow) -> str:
    """The text of one manifest row."""
    p = file_path(corpus, row.sha256)
    try:
        return p.read_text(encoding="utf-8")
    except OSError:
        raise SparseRLError(f"{p} is missing (listed in the manifest as {row.package}:{row.path}): build the "
                            "corpus again (files already there are kept)") from None

"""The SFT data's rows: one (matrix, kernel) pair each, as the JSONL files hold them.

A row has the paper's fields ``rows, cols, shape, format, code`` (``rows``/``cols``: sampled
nonzero coordinates, all of them in the paper's cut-down data; ``code``: the completion, starting
with ``FORMAT:``) plus ours: ``op, k, nnz, matrix`` (the matrix file, when there is one),
``family, split, variant, name, times`` (the kernel's measured times) and ``card`` (the matrix
card's facts, :meth:`~sparserl.matrices.card.MatrixCard.to_dict`). Rows exported from the
best-known store say where they came from as well (:class:`TeacherOrigin`).

:class:`SFTRow` is the one type every stage passes around; :func:`read_rows` and
:func:`write_rows` are where a row file is read and written (the data build, the store's export,
SFT, RL, ``evaluate`` and ``improve`` all go through them).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparserl.errors import SparseRLError

REQUIRED = ("rows", "cols", "shape", "code")
"""The fields every row must have (the paper's schema, less ``format``, which ``code`` repeats)."""


@dataclass(frozen=True)
class KernelTimes:
    """What the harness measured for a row's kernel (None in a compile-only data set)."""

    kernel_us: float
    """Median kernel time, in microseconds."""
    cusparse_us: float
    """cuSPARSE's median time on the same matrix, measured the same way."""
    speedup: float
    """``cusparse_us / kernel_us``."""
    regime: str = "cold"
    """The L2 regime of both times: 'cold' (flushed) or 'warm'."""


@dataclass(frozen=True)
class TeacherOrigin:
    """Where a row exported from the best-known store came from."""

    fingerprint: str
    """The matrix's structure fingerprint (:func:`~sparserl.matrices.card.structure_fingerprint`)."""
    arch: str | None
    """The GPU architecture the kernel was timed on."""
    harness_version: str | None
    """The harness version that verified it."""
    provenance: str
    """How the search came to evaluate it (a :class:`~sparserl.search.space.Provenance` value)."""


@dataclass(frozen=True)
class Refinement:
    """The previous kernel a refinement row's completion was found from, and what the harness measured for it."""

    previous: str
    """The previous kernel's text (FORMAT line first)."""
    outcome: str
    """Its measured outcome, as one line (:func:`~sparserl.search.policy.describe_timing`)."""
    correct: bool
    """Whether it was correct (the prompt then asks for a faster correct kernel, else a correct one)."""
    parent: str | None = None
    """Its candidate id, where it has one."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Refinement:
        return cls(str(d["previous"]), str(d["outcome"]), bool(d["correct"]), d.get("parent"))


@dataclass(frozen=True)
class SFTRow:
    """One (matrix, kernel) pair of the SFT data."""

    rows: list[int]
    """Row indices of sampled nonzeros (all of them in the paper's data)."""
    cols: list[int]
    """Their column indices."""
    shape: tuple[int, int]
    """The matrix's shape."""
    code: str
    """The completion: FORMAT/LAUNCH header lines, then the kernel."""
    format: str | None = None
    """The storage format the completion's FORMAT line names."""
    op: str = "spmv"
    """'spmv' or 'spmm'."""
    k: int | None = None
    """SpMM columns (None for SpMV)."""
    nnz: int | None = None
    """The matrix's nonzeros (None: as many as ``rows`` holds)."""
    matrix: str | None = None
    """The matrix file (None when the row carries coordinates only)."""
    family: str | None = None
    """The generator family ('real' for a matrix from a folder, 'best_known' for an export)."""
    split: str | None = None
    """'train', 'val' or 'test'."""
    variant: str | None = None
    """The library variant or template point the code was rendered from."""
    name: str | None = None
    """The matrix's name, where the row names it (the store's export)."""
    times: KernelTimes | None = None
    """What the harness measured for the kernel (None: compile-only, or not given)."""
    card: dict[str, Any] | None = None
    """The matrix card's facts (rows exported from the store, whose matrix file may be gone)."""
    origin: TeacherOrigin | None = None
    """Where a row exported from the best-known store came from (None for other rows)."""
    refinement: Refinement | None = None
    """When the row teaches a refinement: the previous kernel and its measured outcome, shown in the
    prompt as search and RL show them (:func:`~sparserl.search.policy.refinement_text`), with
    ``code`` the faster kernel found from it; None: the ordinary prompt."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Fields this version does not know, kept so that a row read and written back loses nothing."""

    @property
    def matrix_name(self) -> str:
        """The matrix file's name without its extensions ('' without a file)."""
        return Path(self.matrix).name.split(".")[0] if self.matrix else ""

    @property
    def nonzeros(self) -> int:
        """The matrix's nonzeros: ``nnz``, else the coordinates the row carries."""
        return int(self.nnz) if self.nnz is not None else len(self.rows)

    def to_dict(self) -> dict[str, Any]:
        """The row as one JSON object (the JSONL files' layout: the origin's fields at the top level)."""
        d: dict[str, Any] = {"rows": list(self.rows), "cols": list(self.cols), "shape": list(self.shape),
                             "format": self.format, "code": self.code, "op": self.op, "k": self.k, "nnz": self.nnz}
        for key in ("matrix", "family", "split", "variant", "name", "card"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        d["times"] = None if self.times is None else {"kernel_us": self.times.kernel_us,
                                                      "cusparse_us": self.times.cusparse_us,
                                                      "speedup": self.times.speedup, "regime": self.times.regime}
        if self.refinement is not None:
            d["refinement"] = {"previous": self.refinement.previous, "outcome": self.refinement.outcome,
                               "correct": self.refinement.correct, "parent": self.refinement.parent}
        if self.origin is not None:
            d |= {"fingerprint": self.origin.fingerprint, "arch": self.origin.arch,
                  "harness_version": self.origin.harness_version, "provenance": self.origin.provenance}
        return self.extra | d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "row") -> SFTRow:
        """A row from one JSON object; raises SparseRLError (naming ``where``) for one training cannot use."""
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise SparseRLError(f"{where}: missing fields {missing}")
        if not str(d["code"]).lstrip().upper().startswith("FORMAT:"):
            raise SparseRLError(f"{where}: code must start with 'FORMAT:'")
        try:
            shape = (int(d["shape"][0]), int(d["shape"][1]))
            times = d.get("times")
            origin = None
            if d.get("fingerprint") and d.get("provenance"):
                origin = TeacherOrigin(d["fingerprint"], d.get("arch"), d.get("harness_version"), d["provenance"])
            known = {f for f in cls.__dataclass_fields__} | {"fingerprint", "arch", "harness_version", "provenance"}
            return cls(rows=list(d["rows"]), cols=list(d["cols"]), shape=shape, code=str(d["code"]),
                       format=d.get("format"), op=d.get("op") or "spmv", k=d.get("k"), nnz=d.get("nnz"),
                       matrix=d.get("matrix"), family=d.get("family"), split=d.get("split"),
                       variant=d.get("variant"), name=d.get("name"),
                       times=KernelTimes(**times) if isinstance(times, dict) else None,
                       card=d.get("card") if isinstance(d.get("card"), dict) else None, origin=origin,
                       refinement=Refinement.from_dict(d["refinement"]) if d.get("refinement") else None,
                       extra={k: v for k, v in d.items() if k not in known})
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise SparseRLError(f"{where}: malformed row ({exc!r})") from None


def read_rows(path: str | Path) -> list[SFTRow]:
    """The rows of an SFT JSONL file (an empty file: none); raises SparseRLError for a missing file,
    a line that is not JSON, or a row training cannot use."""
    path = Path(path)
    if not path.exists():
        raise SparseRLError(f"{path}: no such file")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SparseRLError(f"{path}:{i}: not JSON ({exc.msg})") from None
        row = SFTRow.from_dict(d, f"{path}:{i}")
        found = matrix_beside(row.matrix, path.parent)
        rows.append(row if found == row.matrix else replace(row, matrix=found))
    return rows


def matrix_beside(matrix: str | None, folder: Path) -> str | None:
    """A row's matrix file as it can be opened from here. ``data build`` writes the paths as it was given
    them (relative to the folder it ran in), so a data folder read from elsewhere finds its matrices by
    their place in it: ``folder/PATH``, then ``folder/matrices/NAME``. The path as written when none
    of these exists (the row's coordinates stand in, or the reader says the file is missing)."""
    if not matrix or Path(matrix).is_absolute() or Path(matrix).exists():
        return matrix
    for candidate in (folder / matrix, folder / "matrices" / Path(matrix).name):
        if candidate.exists():
            return str(candidate)
    return matrix


def read_nonempty(path: str | Path) -> list[SFTRow]:
    """:func:`read_rows`, refusing a file without rows."""
    rows = read_rows(path)
    if not rows:
        raise SparseRLError(f"{path}: no rows")
    return rows


def write_rows(path: str | Path, rows: Iterable[SFTRow]) -> int:
    """Write ``rows`` to ``path`` as JSONL (atomically: a killed write leaves the old file or none);
    returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    try:
        with tmp.open("w") as f:
            for row in rows:
                f.write(json.dumps(row.to_dict()) + "\n")
                n += 1
        tmp.replace(path)
    finally:  # a failed write (the path a folder, say) leaves no partial file beside it
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return n


class RowWriter:
    """Rows appended to a JSONL file one at a time, as they are made (the data build's splits)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.file = self.path.open("w")
        self.count = 0

    def write(self, row: SFTRow) -> None:
        self.file.write(json.dumps(row.to_dict()) + "\n")
        self.count += 1

    def close(self) -> None:
        self.file.close()

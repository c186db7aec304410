"""The checks every stage's config runs on its settings, in one style: the flag a user types, the
rule, and the value given (``--batch-size must be >= 1, got -1``), raised as a one-line
:class:`~sparserl.errors.SparseRLError`."""

from __future__ import annotations

from pathlib import Path

from sparserl.errors import SparseRLError


def require(ok: bool, flag: str, rule: str, value: object) -> None:
    """Raise a SparseRLError saying that ``flag`` (the command-line option a user types, e.g.
    ``--batch-size``) must be ``rule`` when ``ok`` is false."""
    if not ok:
        raise SparseRLError(f"{flag} must be {rule}, got {value!r}")


def require_folders(flag: str, folders: tuple[str, ...], what: str) -> None:
    """Raise a SparseRLError naming the first of ``folders`` (given with ``flag``) that is not a folder;
    ``what`` says what it should be."""
    for d in folders:
        if not Path(d).is_dir():
            raise SparseRLError(f"{flag} {d}: not a folder (give {what})")


def check_op(op: str, k: int | None) -> None:
    """The one rule for the operation asked on the command line: ``--op`` spmv or spmm; spmm needs
    ``--k`` (the columns of X), spmv refuses it."""
    if op not in ("spmv", "spmm"):
        raise SparseRLError(f"--op must be spmv or spmm, got {op!r}")
    if op == "spmm" and (k is None or k < 1):
        raise SparseRLError("--op spmm needs --k K (K >= 1 columns of X)")
    if op == "spmv" and k is not None:
        raise SparseRLError("--k is the column count of X for --op spmm; SpMV multiplies one vector: leave --k out")

"""The checks every stage's config runs on its settings, in one style: the flag a user types, the
rule, and the value given (``--batch-size must be >= 1, got -1``), raised as a one-line
:class:`~sparserl.errors.SparseRLError`."""

from __future__ import annotations

import re
from dataclasses import fields
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


INT32_MAX = 2**31 - 1
"""The largest count a kernel's ``int`` arguments hold (``m``, ``n``, ``nnz``, ``k``)."""


def check_op(op: str, k: int | None) -> None:
    """The one rule for the operation asked on the command line: ``--op`` spmv or spmm; spmm needs
    ``--k`` (the columns of X), spmv refuses it."""
    if op not in ("spmv", "spmm"):
        raise SparseRLError(f"--op must be spmv or spmm, got {op!r}")
    if op == "spmm" and (k is None or k < 1):
        raise SparseRLError("--op spmm needs --k K (K >= 1 columns of X)")
    if op == "spmm" and k > INT32_MAX:
        raise SparseRLError(f"--k must be at most {INT32_MAX} (a kernel's int k), got {k}")
    if op == "spmv" and k is not None:
        raise SparseRLError("--k is the column count of X for --op spmm; SpMV multiplies one vector: leave --k out")


_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def check_device(value: str, flag: str = "--device") -> None:
    """The model's device, as ``pick_device`` reads it (auto, cpu, cuda or cuda:N), checked when the
    settings are made, before any work (``pick_device`` runs only once a model is opened)."""
    if not isinstance(value, str) or not _DEVICE.fullmatch(value):
        raise SparseRLError(f"{flag} must be auto, cpu or cuda[:N], got {value!r}")


_SIMPLE = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def check_setting_types(raw: dict, config: type, where: str) -> None:
    """Raise a SparseRLError naming the first setting of ``raw`` (read from a config file ``where``) whose
    value is not of its field's simple type in the dataclass ``config`` (int, float, bool, str, each maybe
    ``| None``); other fields (tuples, nested configs) are left to the config's own checks. A bool is not
    taken for an int, nor a float for an int (``steps = 1.5``)."""
    annotations = {f.name: str(f.type) for f in fields(config)}
    for key, value in raw.items():
        parts = [t.strip() for t in annotations.get(key, "").split("|")]
        optional = "None" in parts
        kinds = [t for t in parts if t != "None"]
        if len(kinds) != 1 or kinds[0] not in _SIMPLE:
            continue
        if value is None and optional:
            continue
        want = _SIMPLE[kinds[0]]
        if not isinstance(value, want) or (isinstance(value, bool) and bool not in want):
            raise SparseRLError(f"{where}: {key} must be {'an' if kinds[0] == 'int' else 'a'} {kinds[0]}"
                                f"{' (or left out)' if optional else ''}, got {value!r}")

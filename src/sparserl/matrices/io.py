"""Load and save sparse matrices, and bring any matrix into the project's canonical form.

The canonical matrix (what every other module receives) is a ``scipy.sparse.csr_array`` with
``float32`` ``data``, ``int32`` ``indptr``/``indices``, column indices sorted within each row and
duplicates summed. Explicit zeros are kept: they are part of the structure a kernel must handle.

Supported files (chosen by extension, case-insensitive):

* ``.mtx`` / ``.mtx.gz``: Matrix Market. ``coordinate`` with field ``real``/``integer``/``pattern``
  (pattern entries become 1.0) and symmetry ``general``/``symmetric``/``skew-symmetric`` (the
  off-diagonal entries are mirrored, negated for skew); dense ``array`` format too (its zeros are
  not stored). ``complex``/``hermitian`` files are rejected.
* ``.npz``: ``scipy.sparse.save_npz`` format (any sparse format inside).

Parsing is scipy's ``mmread`` (fast_matrix_market, multi-threaded C++). It is lenient in ways that
would silently corrupt a matrix (``1.0x`` reads as 1.0, ``7.5`` in an ``integer`` file as 7, extra
values on a line are ignored, NaN/Inf and float32 overflow pass through), so :func:`load_matrix`
first checks the data section itself, vectorised with numpy: every byte must belong to the
field's number alphabet, and the number of whitespace-separated tokens must be exactly what the
size line declares. Every failure is a :class:`~sparserl.errors.MatrixError` whose one-line message
names the file and, where known, the line.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.io
import scipy.sparse as sp

from sparserl.errors import MatrixError

log = logging.getLogger(__name__)

__all__ = ["MAX_INT32", "canonicalize", "check_matrix_path", "csr_from_sorted_parts", "load_matrix", "save_matrix"]

MAX_INT32 = 2**31 - 1
"""Largest dimension and nonzero count of a canonical matrix (int32 indices and indptr)."""

_F32_MAX = float(np.finfo(np.float32).max)
MATRIX_SUFFIXES = (".mtx.gz", ".mtx", ".npz")
"""The matrix files the project reads and writes, the longer suffix first (:func:`_suffix` takes the first that
ends a name)."""
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
_CHUNK = 1 << 25  # bytes per step of the vectorised data-section checks (bounds temporaries)


# --------------------------------------------------------------------------------------------
# Canonical form
# --------------------------------------------------------------------------------------------


def canonicalize(A: object) -> sp.csr_array:
    """Return ``A`` as a canonical ``csr_array`` (float32 data, int32 indices, sorted, summed).

    Accepts any scipy sparse array/matrix or a 2-D dense ``numpy`` array (whose zeros are not
    stored). Explicit zeros stored in a sparse input are kept; duplicate entries are summed (in
    the input's precision, then rounded to float32). Returns ``A`` itself when it is already a
    canonical ``csr_array``; otherwise a new array that shares nothing with ``A``.

    Raises:
        MatrixError: 0 rows or columns, no stored nonzeros, NaN/Inf or float32-overflowing values,
            complex or non-numeric values, or more than ``2**31 - 1`` rows, columns or nonzeros.
    """
    if isinstance(A, np.ndarray):
        if A.ndim != 2:
            raise MatrixError(f"expected a 2-D array, got {A.ndim}-D with shape {A.shape}")
        _check_dtype(A.dtype)
        _check_shape(A.shape)
        bad = ~np.isfinite(A) if A.dtype.kind == "f" else None
        if bad is not None and bad.any():
            i, j = np.argwhere(bad)[0]
            raise MatrixError(
                f"non-finite value {A[i, j]} at (row {i}, col {j}); only finite values are supported"
            )
        A = sp.csr_array(A)
    elif not sp.issparse(A):
        raise MatrixError(f"expected a scipy sparse matrix or a 2-D numpy array, got {type(A).__name__}")
    _check_dtype(A.dtype)
    _check_shape(A.shape)
    if A.nnz == 0:
        raise MatrixError(f"matrix has no stored nonzeros (shape {A.shape[0]} x {A.shape[1]})")
    if A.nnz > MAX_INT32:
        raise MatrixError(f"matrix has {A.nnz} stored entries; at most 2**31-1 are supported (int32 indices)")
    if _is_canonical(A):
        _check_values(A)
        return A  # type: ignore[return-value]

    if A.format == "csr":
        C = sp.csr_array(A, copy=True)
    else:
        C = sp.csr_array(A)  # coo -> csr sums duplicates; other formats convert exactly
    _check_values(C)  # before float32 rounding, so NaN/Inf in the input are reported as such
    C.sum_duplicates()  # sorts indices and sums duplicates in place (keeps explicit zeros)
    if C.nnz > MAX_INT32:  # pragma: no cover - guarded above; kept for formats whose nnz grows
        raise MatrixError(f"matrix has {C.nnz} stored entries; at most 2**31-1 are supported")
    data = C.data
    if data.dtype != np.float32:
        data = _to_float32(data)
        if not np.isfinite(data).all():  # finite input that rounds to +-inf in float32
            k = int(np.argmax(~np.isfinite(data)))
            i = int(np.searchsorted(C.indptr, k, side="right") - 1)
            raise MatrixError(
                f"value {C.data[k]!r} at (row {i}, col {int(C.indices[k])}) overflows float32 (max {_F32_MAX:.4g})"
            )
    out = csr_from_sorted_parts(data, C.indices, C.indptr, C.shape)
    if not np.isfinite(out.data).all():  # duplicates that summed past float32's range
        k = int(np.argmax(~np.isfinite(out.data)))
        i = int(np.searchsorted(out.indptr, k, side="right") - 1)
        raise MatrixError(
            f"summed duplicate entries at (row {i}, col {int(out.indices[k])}) overflow float32"
        )
    return out


def _to_float32(values: np.ndarray) -> np.ndarray:
    """Round to float32; values past its range become +-inf (no warning), for the caller to report."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values).astype(np.float32)


def csr_from_sorted_parts(
    data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int]
) -> sp.csr_array:
    """Wrap CSR arrays as a canonical csr_array without checking or sorting them (O(1) besides dtype casts).

    For builders that already produce sorted, duplicate-free columns per row (the generators);
    ``data`` becomes float32 and ``indices``/``indptr`` int32 (copied only if their dtype differs).
    The caller guarantees the structure; anything else should go through :func:`canonicalize`.
    """
    A = sp.csr_array(
        (
            np.asarray(data, dtype=np.float32),
            np.asarray(indices, dtype=np.int32),
            np.asarray(indptr, dtype=np.int32),
        ),
        shape=shape,
        copy=False,
    )
    # scipy keeps int32 when every index array is int32 and the shape fits; enforce it anyway.
    if A.indices.dtype != np.int32:  # pragma: no cover - defensive
        A.indices = A.indices.astype(np.int32)
    if A.indptr.dtype != np.int32:  # pragma: no cover - defensive
        A.indptr = A.indptr.astype(np.int32)
    A.has_canonical_format = True  # also sets has_sorted_indices
    return A


def _is_canonical(A: object) -> bool:
    return (
        isinstance(A, sp.csr_array)
        and A.data.dtype == np.float32
        and A.indices.dtype == np.int32
        and A.indptr.dtype == np.int32
        and A.has_canonical_format  # scipy checks sortedness and duplicates (O(nnz), C) if unknown
    )


def _check_shape(shape: tuple[int, ...]) -> None:
    m, n = shape
    if m == 0 or n == 0:
        raise MatrixError(f"matrix has {m} rows and {n} columns; both must be at least 1")
    if m > MAX_INT32 or n > MAX_INT32:
        raise MatrixError(f"matrix shape {m} x {n} exceeds 2**31-1 rows or columns (int32 indices)")


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind == "c":
        raise MatrixError("complex values are not supported (real matrices only)")
    if dtype.kind not in "fiub":
        raise MatrixError(f"matrix values have non-numeric dtype {dtype}")


def _check_values(A: sp.sparray | sp.spmatrix) -> None:
    """Raise for NaN/Inf stored values, naming the first one's position."""
    data = A.data  # type: ignore[union-attr]
    if data.dtype.kind != "f":
        return
    finite = np.isfinite(data)
    if finite.all():
        return
    C = A if A.format == "csr" else sp.csr_array(A)  # to name the (row, col) of the first one
    k = int(np.argmin(np.isfinite(C.data)))
    i = int(np.searchsorted(C.indptr, k, side="right") - 1)
    raise MatrixError(
        f"non-finite value {C.data[k]} at (row {i}, col {int(C.indices[k])}); only finite values are supported"
    )


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _suffix(path: Path) -> str | None:
    name = path.name.lower()
    for s in MATRIX_SUFFIXES:
        if name.endswith(s):
            return s
    return None


def matrices_in(folder: str | os.PathLike[str]) -> list[Path]:
    """The matrix files (:data:`MATRIX_SUFFIXES`, in any case, as :func:`load_matrix` reads them) directly in
    ``folder``, sorted by name; the caller says what an empty list means."""
    return sorted(f for f in Path(folder).iterdir() if f.is_file() and _suffix(f) is not None)


def check_matrix_path(path: str | Path) -> Path:
    """``path`` as a Path when it names a matrix file that exists (by its extension: .mtx, .mtx.gz,
    .npz), else MatrixError in one line: what :func:`load_matrix` checks before it reads, for a
    command that has other work to do first (opening a store) and should fail before it."""
    p = Path(path)
    if p.is_dir():
        raise MatrixError(f"{p}: a folder, not a matrix file (.mtx, .mtx.gz or .npz)")
    if _suffix(p) is None:
        raise MatrixError(f"{p}: unknown matrix file extension; expected .mtx, .mtx.gz or .npz")
    if not p.exists():
        raise MatrixError(f"{p}: no such file")
    if not p.is_file():
        raise MatrixError(f"{p}: not a regular file")
    return p


def load_matrix(path: str | os.PathLike[str]) -> sp.csr_array:
    """Read a ``.mtx``, ``.mtx.gz`` or ``.npz`` file into a canonical ``csr_array``.

    Symmetric Matrix Market storage is expanded to the full matrix (``nnz`` counts both
    triangles); explicit zeros in the file are kept and duplicate entries summed.

    Raises:
        MatrixError: for any unreadable or invalid file, with a one-line message naming the file
            (and the line, where the problem is tied to one).
    """
    p = check_matrix_path(path)
    suffix = _suffix(p)
    if suffix == ".npz":
        A = _load_npz(p)
    else:
        A = _load_matrix_market(p, gz=suffix == ".mtx.gz")
    try:
        out = canonicalize(A)
    except MatrixError as exc:
        raise MatrixError(f"{p}: {exc}") from None
    log.debug("loaded %s: %d x %d, %d nonzeros", p, out.shape[0], out.shape[1], out.nnz)
    return out


def _load_npz(p: Path) -> sp.sparray | sp.spmatrix:
    import zipfile

    try:  # is_zipfile swallows a file it cannot open ("not a zip archive" for a file without read permission)
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise MatrixError(f"{p}: cannot read file ({exc.strerror or _one_line(exc)})") from None
    if not zipfile.is_zipfile(p):  # numpy would guess a pickle and suggest allow_pickle: never
        raise MatrixError(f"{p}: not a .npz file (not a zip archive); write one with scipy.sparse.save_npz "
                          "or 'sparserl matrix gen'")
    try:
        A = sp.load_npz(p)
    except Exception as exc:  # zipfile, numpy and scipy raise a variety of types here
        reason = _one_line(exc)
        if "pickle" in reason:  # object arrays inside: never unpickled (that would run the file's code)
            reason = "it holds Python objects, which are never loaded"
        raise MatrixError(f"{p}: not a readable scipy.sparse .npz file ({reason})") from None
    if A.format in ("csr", "csc", "bsr"):
        # scipy checks only the arrays' lengths when it builds these from a file; an index out of
        # range or an index pointer going backwards would crash (or corrupt) the native code later
        try:
            A.check_format(full_check=True)
        except ValueError as exc:
            raise MatrixError(f"{p}: not a valid sparse matrix ({A.format}: {_one_line(exc)})") from None
    return A


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


@dataclass(frozen=True)
class _MMHeader:
    """The banner and size line of a Matrix Market file."""

    format: str  # "coordinate" | "array"
    field: str  # "real" | "integer" | "pattern"
    symmetry: str  # "general" | "symmetric" | "skew-symmetric"
    rows: int
    cols: int
    entries: int  # stored entries the size line declares (array: values expected)
    size_line: int  # 1-based line number of the size line
    body_offset: int  # byte offset of the first byte after the size line


_BANNER_HELP = (
    "expected '%%MatrixMarket matrix coordinate|array real|integer|pattern general|symmetric|skew-symmetric'"
)


def _read_bytes(p: Path, gz: bool) -> bytes:
    try:
        if gz:
            with gzip.open(p, "rb") as f:
                return f.read()
        return p.read_bytes()
    except _GZIP_ERRORS as exc:
        raise MatrixError(f"{p}: corrupt or truncated gzip data ({_one_line(exc)})") from None
    except OSError as exc:
        raise MatrixError(f"{p}: cannot read file ({exc.strerror or _one_line(exc)})") from None


def _parse_header(p: Path, raw: bytes) -> _MMHeader:
    """Parse the banner, skip comments, parse the size line (Python, first lines only)."""
    pos = 0
    lineno = 0

    def next_line() -> str | None:
        nonlocal pos, lineno
        if pos >= len(raw):
            return None
        end = raw.find(b"\n", pos)
        end = len(raw) if end < 0 else end
        line = raw[pos:end].decode("latin-1").rstrip("\r")
        pos = end + 1
        lineno += 1
        return line

    banner = next_line()
    if banner is None or not banner.startswith("%%MatrixMarket"):
        shown = (banner or "")[:40]
        raise MatrixError(
            f"{p}: line 1: not a Matrix Market file (no '%%MatrixMarket' banner; starts with {shown!r})"
        )
    tokens = banner.lower().split()
    if len(tokens) != 5:
        raise MatrixError(f"{p}: line 1: malformed Matrix Market banner {banner.strip()!r}; {_BANNER_HELP}")
    _, obj, fmt, field, symmetry = tokens
    if obj != "matrix":
        raise MatrixError(f"{p}: line 1: Matrix Market object {obj!r} is not supported (only 'matrix')")
    if fmt not in ("coordinate", "array"):
        raise MatrixError(f"{p}: line 1: unknown Matrix Market format {fmt!r}; {_BANNER_HELP}")
    if field == "double":
        field = "real"
    if field == "complex":
        raise MatrixError(f"{p}: line 1: complex matrices are not supported (real, integer or pattern only)")
    if field not in ("real", "integer", "pattern"):
        raise MatrixError(f"{p}: line 1: unknown Matrix Market field {field!r}; {_BANNER_HELP}")
    if symmetry == "hermitian":
        raise MatrixError(f"{p}: line 1: hermitian matrices are complex and not supported")
    if symmetry not in ("general", "symmetric", "skew-symmetric"):
        raise MatrixError(f"{p}: line 1: unknown Matrix Market symmetry {symmetry!r}; {_BANNER_HELP}")
    if fmt == "array" and field == "pattern":
        raise MatrixError(f"{p}: line 1: 'array pattern' is not a valid Matrix Market combination")

    while True:
        line = next_line()
        if line is None:
            raise MatrixError(f"{p}: file ends before the size line")
        stripped = line.strip()
        if stripped and not stripped.startswith("%"):
            break
    parts = stripped.split()
    want = 3 if fmt == "coordinate" else 2
    layout = "'rows cols entries'" if fmt == "coordinate" else "'rows cols'"
    if len(parts) != want or not all(t.isdigit() for t in parts):
        raise MatrixError(f"{p}: line {lineno}: malformed size line {stripped[:60]!r}; expected {layout}")
    rows, cols = int(parts[0]), int(parts[1])
    if rows > MAX_INT32 or cols > MAX_INT32:
        raise MatrixError(f"{p}: line {lineno}: shape {rows} x {cols} exceeds 2**31-1 rows or columns")
    if symmetry != "general" and rows != cols:
        raise MatrixError(
            f"{p}: line {lineno}: a {symmetry} matrix must be square, size line says {rows} x {cols}"
        )
    if fmt == "coordinate":
        entries = int(parts[2])
    elif symmetry == "general":
        entries = rows * cols
    elif symmetry == "symmetric":
        entries = rows * (rows + 1) // 2
    else:
        entries = rows * (rows - 1) // 2
    return _MMHeader(fmt, field, symmetry, rows, cols, entries, lineno, pos)


def _alphabet(field: str) -> np.ndarray:
    """Boolean lookup table (256,) of the bytes allowed in the data section for ``field``."""
    ok = np.zeros(256, dtype=bool)
    allowed = b"0123456789+- \t\r\n" + (b".eE" if field == "real" else b"")
    ok[np.frombuffer(allowed, dtype=np.uint8)] = True
    return ok


_MALFORMED_NUMBER = re.compile(
    rb"[0-9.+\-][+\-]"  # a sign inside a token ("1-2", "2.5-3", "+-1"), not after an exponent's e
    rb"|[+\-](?![0-9.])"  # a sign with no number after it ("-", "1e+")
    rb"|(?<![0-9.])[eE]"  # an exponent with no mantissa ("e5", "-e5")
    rb"|[eE](?![0-9+\-])"  # an exponent with no digits ("1e", "1e.5")
    rb"|[eE][+\-]?[0-9]*[.eE]"  # a dot or a second exponent after an exponent ("1e5.2", "1e5e5")
    rb"|\.[0-9]*\."  # two dots ("1..2", "1.2.3")
    rb"|(?<![0-9])\.(?![0-9])")  # a dot with no digit beside it (".", "-.")
"""A malformed number in the data section, whose bytes all belong to the alphabet: the parser reads its
longest valid prefix and drops the rest ("1-2" read as 1), so it is found here first."""


def _check_body(p: Path, raw: bytes, h: _MMHeader) -> None:
    """Vectorised checks scipy does not make: number alphabet, well-formed numbers and exact token count."""
    body = np.frombuffer(raw, dtype=np.uint8)[h.body_offset :]
    ok = _alphabet(h.field)
    is_space = np.zeros(256, dtype=bool)
    is_space[np.frombuffer(b" \t\r\n", dtype=np.uint8)] = True
    tokens = 0
    prev_space = True
    for start in range(0, body.size, _CHUNK):
        chunk = body[start : start + _CHUNK]
        good = ok[chunk]
        if not good.all():
            _raise_bad_token(p, raw, h.body_offset + start + int(np.argmin(good)), h.field, h.format)
        space = is_space[chunk]
        tokens += int(np.count_nonzero(space[:-1] & ~space[1:])) + int(prev_space and not space[0])
        prev_space = bool(space[-1])
    if (bad := _MALFORMED_NUMBER.search(raw, h.body_offset)) is not None:
        _raise_bad_token(p, raw, bad.start(), h.field, h.format)
    per_entry = (2 if h.field == "pattern" else 3) if h.format == "coordinate" else 1
    expected = h.entries * per_entry
    if tokens != expected:
        _raise_token_count(p, raw, h, per_entry, tokens)


def _line_bounds(raw: bytes, pos: int) -> tuple[int, str]:
    """1-based line number of byte ``pos`` and that line's text."""
    start = raw.rfind(b"\n", 0, pos) + 1
    end = raw.find(b"\n", pos)
    end = len(raw) if end < 0 else end
    return raw.count(b"\n", 0, pos) + 1, raw[start:end].decode("latin-1").strip()


def _raise_bad_token(p: Path, raw: bytes, pos: int, field: str, fmt: str = "coordinate") -> None:
    lineno, text = _line_bounds(raw, pos)
    # the whitespace-delimited token holding the bad byte
    s = pos
    while s > 0 and raw[s - 1 : s] not in (b" ", b"\t", b"\n", b"\r"):
        s -= 1
    e = pos
    while e < len(raw) and raw[e : e + 1] not in (b" ", b"\t", b"\n", b"\r"):
        e += 1
    token = raw[s:e].decode("latin-1")[:40]
    low = token.lower().lstrip("+-")
    if low.startswith(("nan", "inf")):
        raise MatrixError(f"{p}: line {lineno}: non-finite value {token!r}; only finite values are supported")
    if text.startswith("%"):
        raise MatrixError(f"{p}: line {lineno}: comment line inside the data section")
    before = len(raw[raw.rfind(b"\n", 0, pos) + 1 : s].split())  # tokens before it on its line
    if fmt == "coordinate" and before < 2:
        raise MatrixError(f"{p}: line {lineno}: {token!r} is not an integer {('row', 'column')[before]} index")
    kind = {"real": "a real number", "integer": "an integer", "pattern": "an integer index"}[field]
    raise MatrixError(f"{p}: line {lineno}: {token!r} is not {kind} (field is {field})")


def _data_lines(raw: bytes, h: _MMHeader) -> list[tuple[int, bytes]]:
    """(1-based line number, content) of each non-blank data line; error paths only (Python loop)."""
    out = []
    lineno = h.size_line
    for line in raw[h.body_offset :].split(b"\n"):
        lineno += 1
        if line.strip():
            out.append((lineno, line))
    return out


def _raise_token_count(p: Path, raw: bytes, h: _MMHeader, per_entry: int, tokens: int) -> None:
    lines = _data_lines(raw, h)
    if h.format == "coordinate":
        what = "row col" if h.field == "pattern" else "row col value"
        for lineno, line in lines:
            n = len(line.split())
            if n != per_entry:
                raise MatrixError(f"{p}: line {lineno}: expected {per_entry} numbers ({what}), found {n}")
    found = tokens // per_entry
    what = "entries" if h.format == "coordinate" else "values"
    raise MatrixError(
        f"{p}: size line (line {h.size_line}) declares {h.entries} {what} but the file has {found}"
    )


_SCIPY_LINE = re.compile(r"^Line (\d+): (.*)$")


def refuse_past_memory(what: str, need: int) -> None:
    """A one-line :class:`MatrixError` when ``need`` bytes are more than this machine has available (a size
    line that declares billions of rows would otherwise grow until the OOM killer ends the process)."""
    from sparserl.matrices.generators import available_memory

    have = available_memory()
    if have is not None and need > have:
        raise MatrixError(f"{what} would need about {_size(need)} of memory, and this machine has "
                          f"{_size(have)} available")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _load_matrix_market(p: Path, gz: bool) -> sp.sparray | sp.spmatrix | np.ndarray:
    raw = _read_bytes(p, gz)
    h = _parse_header(p, raw)
    per_entry = 8 if h.format == "array" else 48  # parsed coordinates and values, then CSR
    refuse_past_memory(f"{p}: a {h.rows} x {h.cols} matrix of {h.entries} stored entries",
                       8 * (h.rows + 1) + per_entry * h.entries)
    _check_body(p, raw, h)
    try:
        A = scipy.io.mmread(io.BytesIO(raw), spmatrix=False)
    except _GZIP_ERRORS as exc:  # pragma: no cover - we decompress before parsing
        raise MatrixError(f"{p}: corrupt or truncated gzip data ({_one_line(exc)})") from None
    except (ValueError, OverflowError, RuntimeError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        m = _SCIPY_LINE.match(msg)
        if m:
            what = m.group(2).rstrip(".")
            what = what[0].lower() + what[1:]
            extra = f" (shape is {h.rows} x {h.cols}, indices are 1-based)" if "index" in what else ""
            raise MatrixError(f"{p}: line {m.group(1)}: {what}{extra}") from None
        raise MatrixError(f"{p}: cannot parse Matrix Market data ({msg})") from None
    _check_parsed_values(p, raw, h, A)
    return A


def _check_parsed_values(p: Path, raw: bytes, h: _MMHeader, A: sp.sparray | np.ndarray) -> None:
    """Overflow (1e400 -> inf, 1e39 > float32 max) and skew-symmetric diagonals, with line numbers."""
    if isinstance(A, np.ndarray):
        vals = A
        bad = ~np.isfinite(_to_float32(vals)) if vals.dtype.kind == "f" else None
        if bad is not None and bad.any():
            i, j = np.argwhere(bad)[0]
            raise MatrixError(f"{p}: value at (row {i + 1}, col {j + 1}) is out of float32 range")
        if h.symmetry == "skew-symmetric" and np.any(np.diagonal(vals) != 0):  # pragma: no cover
            raise MatrixError(f"{p}: skew-symmetric matrix has a nonzero diagonal")
        return
    data = A.data
    stored = h.entries  # mmread appends mirrored entries after the file's own, in file order
    if data.dtype.kind == "f":
        bad = ~np.isfinite(_to_float32(data[:stored]))
        if bad.any():
            k = int(np.argmax(bad))
            lineno = _data_lines(raw, h)[k][0]
            raise MatrixError(f"{p}: line {lineno}: value is out of float32 range (max {_F32_MAX:.4g})")
    if h.symmetry in ("symmetric", "skew-symmetric"):
        _check_one_triangle(p, raw, h, A)
    if h.symmetry == "skew-symmetric":
        row, col = A.coords
        diag = (row[:stored] == col[:stored]) & (data[:stored] != 0)
        if diag.any():
            k = int(np.argmax(diag))
            lineno = _data_lines(raw, h)[k][0]
            raise MatrixError(f"{p}: line {lineno}: skew-symmetric matrix has a nonzero diagonal entry")


def _check_one_triangle(p: Path, raw: bytes, h: _MMHeader, A: sp.sparray) -> None:
    """A symmetric file stores each off-diagonal pair once; one that stores an entry and its mirror
    both would have each added twice when mirrored (2.0 where 1.0 was meant): refused, with the line."""
    row, col = (np.asarray(x[: h.entries], dtype=np.int64) for x in A.coords)
    off = row != col
    if not off.any():
        return
    key = np.minimum(row, col) * max(h.rows, h.cols) + np.maximum(row, col)
    upper = off & (row < col)
    both = np.intersect1d(key[upper], key[off & ~upper])
    if both.size:
        pair = np.flatnonzero(off & (key == both[0]))
        k = int(pair[0])
        m = int(next(i for i in pair if upper[i] != upper[k]))
        lines = _data_lines(raw, h)
        raise MatrixError(f"{p}: lines {lines[k][0]} and {lines[m][0]}: a {h.symmetry} file stores one triangle, "
                          f"but entry ({row[k] + 1}, {col[k] + 1}) and its mirror ({col[k] + 1}, {row[k] + 1}) are "
                          "both stored: mirrored, each would be added twice")


# --------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------


def save_matrix(A: object, path: str | os.PathLike[str], *, compress: bool = True) -> None:
    """Write ``A`` (canonicalised first) to ``.mtx``, ``.mtx.gz`` or ``.npz``, chosen by extension.

    ``.npz`` is deflated unless ``compress`` is False: a stored archive is about 30 times faster to write
    (0.14 against 4.4 s for a 21M-nonzero matrix) and 1.3-2x larger, the choice for scratch matrices
    that are generated again at will.

    Matrix Market output is ``coordinate real general`` with 9 significant digits, enough for
    every float32 value to read back bit-identical; explicit zeros are written. ``.mtx.gz`` uses
    gzip level 1 (fast; about 2x smaller than plain text). The file is written next to ``path``
    and renamed into place, so a failed or interrupted write never leaves a half-written matrix,
    and the temporary file is removed on every way out.

    Raises:
        MatrixError: invalid matrix, unknown extension, or the file cannot be written.
    """
    p = Path(path)
    suffix = _suffix(p)
    if suffix is None:
        raise MatrixError(f"{p}: unknown matrix file extension; expected .mtx, .mtx.gz or .npz")
    C = canonicalize(A)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            if suffix == ".npz":
                sp.save_npz(f, C, compressed=compress)
            elif suffix == ".mtx.gz":
                with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=1) as g:
                    _mmwrite(g, C)
            else:
                _mmwrite(f, C)
        os.replace(tmp, p)
    except OSError as exc:
        raise MatrixError(f"{p}: cannot write file ({exc.strerror or _one_line(exc)})") from None
    finally:  # every way out (an error, Ctrl-C, a signal turned into an exception) removes the partial file
        with contextlib.suppress(OSError):  # a folder that is not one: nothing was made
            tmp.unlink(missing_ok=True)
    log.debug("saved %s: %d x %d, %d nonzeros", p, C.shape[0], C.shape[1], C.nnz)


def _mmwrite(f: io.IOBase | gzip.GzipFile, C: sp.csr_array) -> None:
    scipy.io.mmwrite(f, C, comment=" written by sparserl", field="real", precision=9, symmetry="general")

"""Loading, saving and canonicalising matrices: malformed files, round trips, real SuiteSparse files."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.errors import MatrixError
from sparserl.matrices import canonicalize, load_matrix, save_matrix

BANNER = "%%MatrixMarket matrix coordinate real general\n"


def assert_canonical(A: sp.csr_array) -> None:
    assert isinstance(A, sp.csr_array)
    assert A.data.dtype == np.float32
    assert A.indices.dtype == np.int32 and A.indptr.dtype == np.int32
    assert np.isfinite(A.data).all()
    # sorted, duplicate-free columns within every row (checked directly, not via scipy's flag)
    starts = np.zeros(A.nnz, dtype=bool)
    starts[A.indptr[:-1][np.diff(A.indptr) > 0]] = True
    steps = np.diff(A.indices.astype(np.int64))
    assert np.all((steps > 0) | starts[1:])


def assert_one_line_error(exc: BaseException, *needles: str) -> None:
    msg = str(exc)
    assert isinstance(exc, MatrixError)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


# --------------------------------------------------------------------------------------------
# Malformed files: every one is a one-line MatrixError naming the file (and the line, if known)
# --------------------------------------------------------------------------------------------

MALFORMED: dict[str, tuple[str, list[str]]] = {
    # name: (file text, substrings the message must contain)
    "no_banner": ("3 3 1\n1 1 1.0\n", ["line 1", "banner"]),
    "empty_file": ("", ["line 1", "banner"]),
    "banner_too_short": ("%%MatrixMarket matrix coordinate real\n3 3 1\n1 1 1\n", ["line 1", "malformed"]),
    "bad_format": ("%%MatrixMarket matrix sparse real general\n3 3 1\n1 1 1\n", ["line 1", "format"]),
    "bad_field": ("%%MatrixMarket matrix coordinate quaternion general\n3 3 1\n1 1 1\n", ["line 1", "field"]),
    "bad_symmetry": (
        "%%MatrixMarket matrix coordinate real diagonal\n3 3 1\n1 1 1\n",
        ["line 1", "symmetry"],
    ),
    "vector_object": ("%%MatrixMarket vector coordinate real general\n3 1\n1 1.0\n", ["line 1", "vector"]),
    "complex": (
        "%%MatrixMarket matrix coordinate complex general\n3 3 1\n1 1 1.0 2.0\n",
        ["line 1", "complex"],
    ),
    "hermitian": (
        "%%MatrixMarket matrix coordinate real hermitian\n3 3 1\n1 1 1.0\n",
        ["line 1", "hermitian"],
    ),
    "array_pattern": ("%%MatrixMarket matrix array pattern general\n2 2\n", ["line 1", "array pattern"]),
    "no_size_line": (BANNER + "% only a comment\n", ["size line"]),
    "size_line_two_numbers": (BANNER + "3 3\n1 1 1.0\n", ["line 2", "size line"]),
    "size_line_not_numeric": (BANNER + "% c\n3 x 1\n1 1 1.0\n", ["line 3", "size line"]),
    "size_line_negative": (BANNER + "3 -3 1\n1 1 1.0\n", ["line 2", "size line"]),
    "symmetric_not_square": (
        "%%MatrixMarket matrix coordinate real symmetric\n3 4 1\n1 1 1\n",
        ["line 2", "square"],
    ),
    "non_numeric_value": (BANNER + "3 3 2\n1 1 1.0\n3 2 abc\n", ["line 4", "'abc'"]),
    "trailing_garbage_value": (BANNER + "3 3 1\n1 1 1.0x\n", ["line 3", "'1.0x'"]),  # scipy reads 1.0
    "hex_value": (BANNER + "3 3 1\n1 1 0x10\n", ["line 3", "'0x10'"]),  # scipy reads 0
    "fraction_in_integer_field": (
        "%%MatrixMarket matrix coordinate integer general\n3 3 1\n1 1 7.5\n",
        ["line 3", "'7.5'", "integer"],
    ),  # scipy reads 7
    "non_numeric_index": (BANNER + "3 3 1\n1 x 1.0\n", ["line 3", "'x'"]),
    "fractional_index": (BANNER + "3 3 1\n1.5 1 1.0\n", ["line 3"]),
    "fewer_entries": (BANNER + "3 3 3\n1 1 1.0\n3 2 2.0\n", ["declares 3", "has 2"]),
    "more_entries": (BANNER + "3 3 1\n1 1 1.0\n3 2 2.0\n", ["declares 1", "has 2"]),
    "missing_value": (BANNER + "3 3 2\n1 1\n3 2 2.0\n", ["line 3", "found 2"]),
    "extra_value_on_line": (BANNER + "3 3 2\n1 1 1.0 5\n3 2 2.0\n", ["line 3", "found 4"]),  # scipy ignores
    "row_index_too_large": (BANNER + "% c\n3 3 2\n1 1 1.0\n4 2 2.0\n", ["line 5", "row index"]),
    "col_index_too_large": (BANNER + "3 3 2\n1 4 1.0\n3 2 2.0\n", ["line 3", "column index"]),
    "row_index_zero": (BANNER + "3 3 2\n0 1 1.0\n3 2 2.0\n", ["line 3", "row index"]),
    "row_index_negative": (BANNER + "3 3 1\n-1 1 1.0\n", ["line 3", "row index"]),
    "nan_value": (BANNER + "3 3 2\n1 1 1.0\n2 2 nan\n", ["line 4", "non-finite"]),
    "inf_value": (BANNER + "3 3 2\n1 1 -inf\n2 2 1\n", ["line 3", "non-finite"]),
    "value_overflows_float64": (BANNER + "3 3 2\n1 1 1\n\n2 2 1e400\n", ["line 5", "float32"]),  # scipy: inf
    "value_overflows_float32": (BANNER + "3 3 1\n1 1 -1e39\n", ["line 3", "float32"]),
    "integer_overflows_int64": (
        "%%MatrixMarket matrix coordinate integer general\n3 3 1\n1 1 99999999999999999999\n",
        ["line 3"],
    ),
    "comment_in_data": (BANNER + "3 3 2\n1 1 1.0\n% note\n3 2 2.0\n", ["line 4", "comment"]),
    # malformed numbers of the alphabet's bytes: scipy reads the longest valid prefix ("1-2" as 1)
    "sign_inside_value": (BANNER + "3 3 2\n1 1 1.0\n3 2 1-2\n", ["line 4", "'1-2'"]),
    "exponent_without_digits": (BANNER + "3 3 1\n1 1 1e\n", ["line 3", "'1e'"]),
    "two_dots": (BANNER + "3 3 1\n1 1 1.2.3\n", ["line 3", "'1.2.3'"]),
    "second_exponent": (BANNER + "3 3 1\n1 1 1e5e5\n", ["line 3", "'1e5e5'"]),
    "sign_inside_index": (BANNER + "3 3 1\n1-1 1 1.0\n", ["line 3", "'1-1'"]),
    "sign_inside_integer": ("%%MatrixMarket matrix coordinate integer general\n3 3 1\n1 1 5-3\n",
                            ["line 3", "'5-3'", "integer"]),
    "symmetric_entry_and_its_mirror": ("%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n2 1 1.0\n"
                                       "3 3 1.0\n1 2 1.0\n", ["lines 3 and 5", "(2, 1)", "twice"]),
    "skew_with_diagonal": (
        "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 1\n2 2 1.0\n",
        ["line 3", "diagonal"],
    ),
    "no_entries": (BANNER + "3 3 0\n", ["no stored nonzeros"]),
    "zero_rows": (BANNER + "0 3 0\n", ["0 rows"]),
    "array_too_few_values": (
        "%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n",
        ["declares 4", "has 3"],
    ),
    "array_nan": ("%%MatrixMarket matrix array real general\n1 2\n1\nNaN\n", ["line 4", "non-finite"]),
    "array_all_zero": ("%%MatrixMarket matrix array real general\n1 2\n0\n0\n", ["no stored nonzeros"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_matrix_market_is_one_line_matrix_error(tmp_path: Path, case: str) -> None:
    text, needles = MALFORMED[case]
    path = tmp_path / f"{case}.mtx"
    path.write_text(text)
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert_one_line_error(info.value, str(path), *needles)


@pytest.mark.parametrize("case", ["non_numeric_value", "row_index_too_large", "fewer_entries", "nan_value"])
def test_malformed_gzip_content_reports_the_same(tmp_path: Path, case: str) -> None:
    text, needles = MALFORMED[case]
    path = tmp_path / f"{case}.mtx.gz"
    path.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert_one_line_error(info.value, str(path), *needles)


def _good_gz() -> bytes:
    return gzip.compress((BANNER + "3 3 2\n1 1 1.0\n3 2 2.0\n").encode(), mtime=0)  # the same bytes every time


@pytest.mark.parametrize(
    "name,payload",
    [
        ("garbage.mtx.gz", b"\x1f\x8b\x08\x00" + b"not deflate data" * 8),
        ("truncated.mtx.gz", _good_gz()[:-12]),
        ("plain_text.mtx.gz", (BANNER + "3 3 1\n1 1 1.0\n").encode()),
    ],
    ids=["garbage", "truncated", "plain_text"],  # ids from names: every pytest-xdist worker collects the same tests
)
def test_corrupt_gzip(tmp_path: Path, name: str, payload: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(payload)
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert_one_line_error(info.value, str(path), "gzip")


def test_missing_file_directory_and_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(MatrixError) as info:
        load_matrix(tmp_path / "absent.mtx")
    assert_one_line_error(info.value, "absent.mtx", "no such file")
    (tmp_path / "dir.mtx").mkdir()
    with pytest.raises(MatrixError) as info:
        load_matrix(tmp_path / "dir.mtx")
    assert_one_line_error(info.value, "dir.mtx", "a folder, not a matrix file")
    (tmp_path / "plain").mkdir()  # a folder without a matrix suffix: not "unknown extension"
    with pytest.raises(MatrixError) as info:
        load_matrix(tmp_path / "plain")
    assert_one_line_error(info.value, "plain", "a folder, not a matrix file")
    other = tmp_path / "matrix.csv"
    other.write_text("1,2\n")
    with pytest.raises(MatrixError) as info:
        load_matrix(other)
    assert_one_line_error(info.value, "matrix.csv", "extension")
    with pytest.raises(MatrixError) as info:
        save_matrix(sp.eye_array(2, format="csr"), tmp_path / "out.txt")
    assert_one_line_error(info.value, "out.txt", "extension")


def test_bad_npz(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"PK\x03\x04 definitely not a zip")
    with pytest.raises(MatrixError) as info:
        load_matrix(garbage)
    assert_one_line_error(info.value, "garbage.npz", ".npz")
    wrong_keys = tmp_path / "wrong.npz"
    np.savez(wrong_keys, x=np.arange(3))
    with pytest.raises(MatrixError) as info:
        load_matrix(wrong_keys)
    assert_one_line_error(info.value, "wrong.npz", ".npz")
    empty = tmp_path / "empty.npz"
    sp.save_npz(empty, sp.csr_array((4, 4), dtype=np.float32))
    with pytest.raises(MatrixError) as info:
        load_matrix(empty)
    assert_one_line_error(info.value, "empty.npz", "no stored nonzeros")


def test_save_to_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(MatrixError) as info:
        save_matrix(sp.eye_array(3, format="csr"), tmp_path / "nope" / "a.mtx")
    assert_one_line_error(info.value, "a.mtx", "cannot write")


# --------------------------------------------------------------------------------------------
# Matrix Market semantics on small handwritten files
# --------------------------------------------------------------------------------------------


def _load_text(tmp_path: Path, text: str, name: str = "m.mtx") -> sp.csr_array:
    path = tmp_path / name
    path.write_text(text)
    A = load_matrix(path)
    assert_canonical(A)
    return A


def test_general_real_with_comments_blank_lines_and_explicit_zero(tmp_path: Path) -> None:
    A = _load_text(tmp_path, BANNER + "% comment\n%\n\n2 3 3\n1 3 -2.5e+0\n\n2 1 0.0\n1 1 4\n")
    assert A.shape == (2, 3) and A.nnz == 3  # the explicit zero is structure
    np.testing.assert_array_equal(A.toarray(), [[4, 0, -2.5], [0, 0, 0]])
    assert A[1, 0] == 0 and A.indices[A.indptr[1]] == 0


def test_crlf_tabs_and_trailing_spaces(tmp_path: Path) -> None:
    path = tmp_path / "crlf.mtx"
    path.write_bytes(BANNER.replace("\n", "\r\n").encode() + b"% c\r\n3 3 2\r\n1 1 1.0\r\n3\t2 2.0  \r\n")
    np.testing.assert_array_equal(load_matrix(path).toarray(), [[1, 0, 0], [0, 0, 0], [0, 2, 0]])


def test_duplicates_are_summed(tmp_path: Path) -> None:
    A = _load_text(tmp_path, BANNER + "2 2 3\n1 1 1.5\n1 1 2.5\n2 2 1\n")
    assert A.nnz == 2
    np.testing.assert_array_equal(A.toarray(), [[4, 0], [0, 1]])


def test_symmetric_mirrors_off_diagonal_only(tmp_path: Path) -> None:
    A = _load_text(
        tmp_path, "%%MatrixMarket matrix coordinate real symmetric\n3 3 4\n1 1 1\n2 1 2\n3 1 3\n3 3 0\n"
    )
    assert A.nnz == 6  # 2 diagonal (one an explicit zero) + 2 mirrored pairs
    np.testing.assert_array_equal(A.toarray(), [[1, 2, 3], [2, 0, 0], [3, 0, 0]])


def test_skew_symmetric_negates_the_mirror(tmp_path: Path) -> None:
    A = _load_text(tmp_path, "%%MatrixMarket matrix coordinate real skew-symmetric\n3 3 2\n2 1 1.5\n3 2 -2\n")
    np.testing.assert_array_equal(A.toarray(), [[0, -1.5, 0], [1.5, 0, 2], [0, -2, 0]])


def test_pattern_general_and_symmetric(tmp_path: Path) -> None:
    A = _load_text(tmp_path, "%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 3\n2 2\n")
    np.testing.assert_array_equal(A.toarray(), [[0, 0, 1], [0, 1, 0]])
    S = _load_text(tmp_path, "%%MatrixMarket matrix coordinate pattern symmetric\n3 3 2\n1 1\n3 2\n", "s.mtx")
    np.testing.assert_array_equal(S.toarray(), [[1, 0, 0], [0, 0, 1], [0, 1, 0]])


def test_integer_field_and_case_insensitive_banner(tmp_path: Path) -> None:
    A = _load_text(
        tmp_path, "%%MatrixMarket MATRIX Coordinate Integer General\n2 2 2\n1 1 -7\n2 2 16777217\n"
    )
    assert A.dtype == np.float32
    np.testing.assert_array_equal(A.toarray(), [[-7, 0], [0, np.float32(16777217)]])


def test_array_format_general_and_symmetric(tmp_path: Path) -> None:
    A = _load_text(tmp_path, "%%MatrixMarket matrix array real general\n2 2\n1\n0\n3\n4\n")
    np.testing.assert_array_equal(A.toarray(), [[1, 3], [0, 4]])  # column-major; zeros not stored
    assert A.nnz == 3
    S = _load_text(tmp_path, "%%MatrixMarket matrix array real symmetric\n2 2\n1\n2\n4\n", "s.mtx")
    np.testing.assert_array_equal(S.toarray(), [[1, 2], [2, 4]])


def test_uppercase_extension_and_gzip(tmp_path: Path) -> None:
    path = tmp_path / "UPPER.MTX.GZ"
    path.write_bytes(_good_gz())
    A = load_matrix(path)
    np.testing.assert_array_equal(A.toarray(), [[1, 0, 0], [0, 0, 0], [0, 2, 0]])


# --------------------------------------------------------------------------------------------
# canonicalize
# --------------------------------------------------------------------------------------------


def test_canonicalize_inputs() -> None:
    coo = sp.coo_array(
        (np.array([1.0, 2.0, 0.0, 4.0]), (np.array([1, 0, 0, 1]), np.array([2, 1, 0, 2]))), shape=(3, 4)
    )
    A = canonicalize(coo)
    assert_canonical(A)
    assert A.nnz == 3  # (1,2) summed; explicit zero at (0,0) kept
    np.testing.assert_array_equal(A.toarray(), [[0, 2, 0, 0], [0, 0, 5, 0], [0, 0, 0, 0]])
    # unsorted csr_matrix with duplicates, int64 indices
    unsorted = sp.csr_matrix(
        (np.array([1, 2, 3], dtype=np.int64), np.array([3, 0, 3], dtype=np.int64), np.array([0, 3, 3])),
        shape=(2, 4),
    )
    B = canonicalize(unsorted)
    assert_canonical(B)
    np.testing.assert_array_equal(B.toarray(), [[2, 0, 0, 4], [0, 0, 0, 0]])
    assert unsorted.indices.tolist() == [3, 0, 3]  # the input was not modified
    D = canonicalize(np.array([[0.0, 1.0], [2.0, 0.0]]))
    assert_canonical(D)
    assert D.nnz == 2
    for fmt in ("csc", "bsr", "dia", "lil", "dok"):
        E = canonicalize(sp.random_array((7, 5), density=0.4, format=fmt, rng=1))
        assert_canonical(E)
    assert canonicalize(A) is A  # already canonical: returned as is


@pytest.mark.parametrize(
    "bad,needle",
    [
        (sp.csr_array((0, 3), dtype=np.float32), "0 rows"),
        (sp.csr_array((3, 3), dtype=np.float32), "no stored nonzeros"),
        (sp.csr_array(np.array([[1.0, np.nan]])), "non-finite"),
        (sp.coo_array(np.array([[np.inf, 1.0]])), "non-finite"),
        (sp.csr_array(np.array([[1.0, 1e39]])), "overflows float32"),
        (
            sp.coo_array((np.array([3e38, 3e38]), (np.array([0, 0]), np.array([1, 1]))), shape=(2, 2)),
            "overflows float32",
        ),
        (sp.csr_array(np.array([[1 + 2j]])), "complex"),
        (np.array([[np.nan, 1.0]]), "non-finite"),
        (np.zeros((2, 2, 2)), "2-D"),
        (np.zeros((2, 2)), "no stored nonzeros"),
        ([[1.0, 2.0]], "expected a scipy sparse matrix"),
    ],
)
def test_canonicalize_rejects(bad: object, needle: str) -> None:
    with pytest.raises(MatrixError) as info:
        canonicalize(bad)
    assert_one_line_error(info.value, needle)


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------


def _awkward_matrix() -> sp.csr_array:
    """Rectangular, empty rows, explicit zeros (+0 and -0), extreme and subnormal float32 values."""
    rng = np.random.default_rng(5)
    A = sp.random_array((37, 53), density=0.2, format="csr", rng=rng, dtype=np.float64)
    A = canonicalize(A)
    A.data[:] = rng.standard_normal(A.nnz).astype(np.float32) * np.float32(1e3)
    f32 = np.finfo(np.float32)
    specials = np.array(
        [0.0, -0.0, f32.max, -f32.max, f32.tiny, f32.smallest_subnormal, 1 / 3, 16777217.0], dtype=np.float32
    )
    A.data[: specials.size] = specials
    # random finite bit patterns: every float32 exponent range, including subnormals
    bits = rng.integers(0, 2**32, size=A.nnz - specials.size, dtype=np.uint32)
    vals = bits.view(np.float32)
    vals = np.where(np.isfinite(vals), vals, np.float32(1.0))
    A.data[specials.size :] = vals
    A.data[A.indptr[3] : A.indptr[6]] = 0  # a few explicit zeros mid-matrix
    A.data[A.indptr[6] : A.indptr[7]] = -0.0
    return A


@pytest.mark.parametrize("suffix", [".mtx", ".mtx.gz", ".npz"])
def test_round_trip_is_bit_exact(tmp_path: Path, suffix: str) -> None:
    A = _awkward_matrix()
    path = tmp_path / f"a{suffix}"
    save_matrix(A, path)
    B = load_matrix(path)
    assert_canonical(B)
    assert B.shape == A.shape
    np.testing.assert_array_equal(B.indptr, A.indptr)
    np.testing.assert_array_equal(B.indices, A.indices)
    np.testing.assert_array_equal(B.data.view(np.uint32), A.data.view(np.uint32))  # -0.0 kept too
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind


@pytest.mark.parametrize("compress", [True, False])
def test_npz_deflated_or_stored_as_asked(tmp_path: Path, compress: bool) -> None:
    """Kills: ``compress`` ignored (the archive's members are deflated, or stored, either way)."""
    import zipfile

    A = _awkward_matrix()
    path = tmp_path / "a.npz"
    save_matrix(A, path, compress=compress)
    with zipfile.ZipFile(path) as z:
        kinds = {i.compress_type for i in z.infolist()}
    assert kinds == {zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED}
    np.testing.assert_array_equal(load_matrix(path).data.view(np.uint32), A.data.view(np.uint32))


def test_round_trip_with_trailing_empty_rows_and_columns(tmp_path: Path) -> None:
    A = canonicalize(sp.coo_array((np.array([1.0]), (np.array([0]), np.array([0]))), shape=(5, 7)))
    for suffix in (".mtx", ".npz"):
        save_matrix(A, tmp_path / f"t{suffix}")
        B = load_matrix(tmp_path / f"t{suffix}")
        assert B.shape == (5, 7) and B.nnz == 1


def test_save_canonicalises_any_input(tmp_path: Path) -> None:
    save_matrix(np.array([[0, 2], [3, 0]]), tmp_path / "d.mtx")
    np.testing.assert_array_equal(load_matrix(tmp_path / "d.mtx").toarray(), [[0, 2], [3, 0]])


# --------------------------------------------------------------------------------------------
# Real SuiteSparse matrices
# --------------------------------------------------------------------------------------------


def test_all_suitesparse_matrices_load_with_documented_shape_and_nnz(suitesparse: Path) -> None:
    """Every file loads; shape and nnz equal SOURCES.tsv exactly.

    SOURCES.tsv's nnz counts the full (mirrored) matrix *including explicit zeros*, and so do we:
    13 of the 80 files store explicit zeros (zenios: 25877 of its 27191 entries; bayer10 23417;
    memplus 27003; steam2 8100; ...), none has duplicate entries, so the counts match exactly.
    """
    with open(suitesparse / "SOURCES.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 80
    mismatches = []
    zeros = {}
    for row in rows:
        A = load_matrix(suitesparse / f"{row['name']}.mtx.gz")
        assert_canonical(A)
        expected = (int(row["rows"]), int(row["cols"]), int(row["nnz"]))
        if (A.shape[0], A.shape[1], A.nnz) != expected:
            mismatches.append((row["name"], expected, (A.shape[0], A.shape[1], A.nnz)))
        if row["symmetric"] == "yes":
            assert (A != A.T).nnz == 0, row["name"]
        if row["field"] == "pattern":
            assert np.all(A.data == 1.0), row["name"]
        zeros[row["name"]] = int(np.count_nonzero(A.data == 0))
    assert mismatches == []
    assert zeros["zenios"] == 25877 and sum(1 for z in zeros.values() if z) == 13


def test_garbage_npz_never_suggests_unpickling(tmp_path: Path) -> None:
    """numpy reads a file that is not a zip as a pickle and suggests allow_pickle: we never do."""
    noise = tmp_path / "noise.npz"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    objects = tmp_path / "objects.npz"
    np.savez(objects, format=np.array(["csr"], dtype=object), shape=np.array([2, 2]))
    for path, needle in ((noise, "not a zip archive"), (objects, "Python objects, which are never loaded")):
        with pytest.raises(MatrixError) as info:
            load_matrix(path)
        assert_one_line_error(info.value, path.name, needle)
        assert "pickle" not in str(info.value)


@pytest.mark.parametrize("suffix", [".mtx", ".mtx.gz", ".npz"])
def test_interrupted_write_leaves_nothing_behind(tmp_path: Path, monkeypatch, suffix: str) -> None:
    """Ctrl-C in the middle of a write: no hidden .NAME.tmpPID file and no half-written matrix."""
    import sparserl.matrices.io as io_mod

    def interrupted_write(f, C):
        f.write(b"%%MatrixMarket matrix coordinate real general\n" + b"1 1 1.0\n" * 1000)
        raise KeyboardInterrupt

    def interrupted_npz(f, C, compressed=True):
        f.write(b"PK" + b"\0" * 5000)
        raise KeyboardInterrupt

    monkeypatch.setattr(io_mod, "_mmwrite", interrupted_write)
    monkeypatch.setattr(io_mod.sp, "save_npz", interrupted_npz)
    with pytest.raises(KeyboardInterrupt):
        save_matrix(sp.eye_array(50, format="csr"), tmp_path / f"a{suffix}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt, arrays, needle", [
    ("csr", dict(shape=[2, 2], data=[1.0], indices=[5], indptr=[0, 1, 1]), "indices must be < 2"),
    ("csr", dict(shape=[2, 2], data=[1.0, 2.0], indices=[0, 1], indptr=[0, 2, 1]), "non-decreasing"),
    ("csc", dict(shape=[2, 2], data=[1.0], indices=[-1], indptr=[0, 1, 1]), "indices must be >= 0"),
    ("bsr", dict(shape=[4, 4], data=np.ones((1, 2, 2)), indices=[7], indptr=[0, 1, 1]), "must be < 2"),
])
def test_npz_with_indices_out_of_range_is_refused_on_loading(tmp_path: Path, fmt, arrays, needle) -> None:
    """A .npz whose arrays have the right lengths but point outside the matrix: scipy builds it
    without complaint, and the native code that reads it later crashed (a segmentation fault in
    'sparserl matrix info') or raised a traceback. Refused on loading, in one line."""
    path = tmp_path / f"bad_{fmt}.npz"
    np.savez(path, format=np.array(fmt.encode()), **{k: np.asarray(v) for k, v in arrays.items()})
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert_one_line_error(info.value, path.name, "not a valid sparse matrix", needle)


def test_a_folders_matrix_files_are_those_load_matrix_reads(tmp_path: Path) -> None:
    """Every file whose suffix load_matrix reads, in any case, sorted by name; nothing else and no folder.
    Kills a listing that matches suffixes case-sensitively (load_matrix reads ``.MTX``), one that lists a
    folder named like a matrix, and one that keeps the directory's own order."""
    from sparserl.matrices.io import matrices_in

    A = sp.csr_array(np.eye(3))
    for name in ("b.mtx", "a.mtx.gz", "C.MTX", "d.npz"):
        save_matrix(A, tmp_path / name.lower())
        (tmp_path / name.lower()).rename(tmp_path / name)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "e.mtx").mkdir()
    got = matrices_in(tmp_path)
    assert [f.name for f in got] == ["C.MTX", "a.mtx.gz", "b.mtx", "d.npz"]
    assert all(load_matrix(f).shape == (3, 3) for f in got)


def test_a_matrix_past_the_machines_memory_is_refused_before_it_is_built(tmp_path: Path, monkeypatch) -> None:
    """A size line declaring billions of rows (one entry) grew until the OOM killer ended ``matrix info``: the
    loader and the features refuse in one line when their estimate is past the memory available. Kills: either
    check left out (here with 1000 bytes available, a 2000-row matrix passes it)."""
    import sparserl.matrices.generators as gen
    from sparserl.matrices.features import compute_features

    path = tmp_path / "m.mtx"
    path.write_text(BANNER + "2000 2000 1\n1 1 1.0\n")
    A = load_matrix(path)
    monkeypatch.setattr(gen, "available_memory", lambda: 1000)
    with pytest.raises(MatrixError) as info:
        load_matrix(tmp_path / "m.mtx")
    assert_one_line_error(info.value, str(path), "MiB of memory", "available")
    with pytest.raises(MatrixError) as info:
        compute_features(A)
    assert_one_line_error(info.value, "the features of a 2000 x 2000 matrix", "MiB of memory")
    monkeypatch.setattr(gen, "available_memory", lambda: None)  # unknown: nothing refused
    assert compute_features(A).nnz == 1


def test_an_unreadable_npz_says_it_cannot_be_read(tmp_path: Path, monkeypatch) -> None:
    """A .npz the process may not read was "not a .npz file (not a zip archive)": zipfile's check swallows the
    error. (The tests may run as root, so reading is refused here by a stand-in for ``open``.)"""
    import builtins

    import sparserl.matrices.io as mio

    path = tmp_path / "locked.npz"
    sp.save_npz(path, sp.csr_array(np.eye(3, dtype=np.float32)))

    def refuse(file, *args, **kwargs):
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return builtins.open(file, *args, **kwargs)

    monkeypatch.setattr(mio, "open", refuse, raising=False)
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert_one_line_error(info.value, "locked.npz", "cannot read file", "Permission denied")


@pytest.mark.parametrize("entry, message", [
    ("1 x 1.0", "'x' is not an integer column index"),
    ("q 1 1.0", "'q' is not an integer row index"),
    ("1 1 z", "'z' is not a real number (field is real)"),
])
def test_a_bad_token_is_named_by_its_place(tmp_path: Path, entry: str, message: str) -> None:
    """A bad index was reported as a bad value ('x' is not a real number) wherever it stood."""
    p = tmp_path / "m.mtx"
    p.write_text(f"%%MatrixMarket matrix coordinate real general\n2 2 2\n{entry}\n2 2 3.0\n")
    with pytest.raises(MatrixError) as info:
        load_matrix(p)
    assert_one_line_error(info.value, "line 3", message)

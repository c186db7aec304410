"""Value maps read from pattern conversions: new values for the same structure, gathered from CSR
order into a format's value arrays, must be exactly what the converter builds from the revalued
matrix (every format, awkward parameters, generator families, arbitrary matrices), padding
included; a conversion that does not hold each value exactly once is refused.

Mutations this kills: positions read off by one, padding not kept zero, the identity copy taken
for an array that is permuted, a map made from values instead of the structure (the map comes from
the pattern and is applied to new values), a missing exactly-once check, and a transpose order
that mismatches SciPy's transpose."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparserl.errors import FormatError
from sparserl.formats import convert
from sparserl.matrices import canonicalize, generate
from sparserl.operator.values import map_of, pattern_conversion, transpose_order
from tests.formats.test_formats import CHOICES, UNLIMITED  # every format and awkward parameters

FAMILIES = [("powerlaw", 300), ("stencil2d", 400), ("banded", 250), ("block", 256), ("empty_rows", 300),
            ("rectangular", 120), ("skewed", 300)]


def revalued(A: sp.csr_array, values: np.ndarray) -> sp.csr_array:
    return sp.csr_array((values.astype(np.float32), A.indices.copy(), A.indptr.copy()), shape=A.shape)


def check_map(A: sp.csr_array, fmt: str, params: dict, seed: int = 0) -> None:
    fd, vm = pattern_conversion(A, fmt, params, UNLIMITED)
    v = np.random.default_rng(seed).standard_normal(A.nnz).astype(np.float32)
    v[v == 0] = 1.0  # a zero would hide in a padding slot
    want = convert(revalued(A, v), fmt, params, UNLIMITED)
    assert fd.sizes == want.sizes and fd.params == want.params
    for name, arr in want.arrays.items():  # the index arrays are the same conversion's
        if arr.dtype != np.float32:
            np.testing.assert_array_equal(fd.arrays[name], arr, err_msg=f"{fmt} {params} {name}")
    got = vm.apply(v)
    floats = [name for name, a in want.arrays.items() if a.dtype == np.float32]
    assert list(got) == floats
    for name in floats:
        np.testing.assert_array_equal(got[name], want.arrays[name], err_msg=f"{fmt} {params} {name}")
    assert vm.slots == sum(want.arrays[name].size for name in floats)


@pytest.mark.parametrize("fmt,params", CHOICES, ids=[f"{f}{p}" for f, p in CHOICES])
@pytest.mark.parametrize("family,rows", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_gathered_values_equal_the_converters_arrays(fmt, params, family, rows) -> None:
    check_map(generate(family, rows, seed=3), fmt, params)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 40), n=st.integers(1, 40), density=st.floats(0.02, 0.6), seed=st.integers(0, 10_000),
       choice=st.sampled_from(CHOICES))
def test_gathered_values_on_arbitrary_matrices(m, n, density, seed, choice) -> None:
    rng = np.random.default_rng(seed)
    dense = (rng.random((m, n)) < density) * rng.standard_normal((m, n))
    if not dense.any():
        dense[rng.integers(m), rng.integers(n)] = 1.0
    check_map(canonicalize(sp.csr_array(dense.astype(np.float32))), *choice, seed=seed)


def test_identity_formats_copy_and_padding_is_marked() -> None:
    A = generate("skewed", 200, seed=1)
    assert pattern_conversion(A, "CSR", {})[1].where == {"val": None}
    assert pattern_conversion(A, "COO", {})[1].where == {"val": None}
    w = pattern_conversion(A, "ELL", {}, UNLIMITED)[1].where["val"]
    assert w.dtype == np.int32 and (w == 0).sum() == w.size - A.nnz  # every padding slot, no more
    assert np.array_equal(np.sort(w[w > 0]), np.arange(1, A.nnz + 1))  # each value lands exactly once


@pytest.mark.parametrize("corrupt", ["twice", "dropped", "out of range"])
def test_a_conversion_that_misplaces_a_value_is_refused(corrupt) -> None:
    A = generate("banded", 100, seed=0)
    fd, _ = pattern_conversion(A, "ELL", {})
    w = fd.arrays["val"].view(np.int32)
    held = np.flatnonzero(w)
    if corrupt == "twice":
        w[held[1]] = w[held[0]]
    elif corrupt == "dropped":
        w[held[0]] = 0
    else:
        w[held[0]] = A.nnz + 1
    with pytest.raises(FormatError, match="exactly once"):
        map_of(fd)


@pytest.mark.parametrize("family,rows", [("powerlaw", 300), ("rectangular", 80), ("empty_rows", 200)])
def test_transpose_order_matches_scipy(family, rows) -> None:
    A = generate(family, rows, seed=2)
    AT, order = transpose_order(A)
    ref = canonicalize(A.T.tocsr())
    np.testing.assert_array_equal(AT.indptr, ref.indptr)
    np.testing.assert_array_equal(AT.indices, ref.indices)
    np.testing.assert_array_equal(AT.data, ref.data)
    v = np.random.default_rng(0).standard_normal(A.nnz).astype(np.float32)
    np.testing.assert_array_equal(v[order], canonicalize(revalued(A, v).T.tocsr()).data)
    assert canonicalize(AT) is AT  # already canonical: tune() fingerprints it as it is

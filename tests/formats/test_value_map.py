"""Value maps: new values for the same structure, gathered from CSR order into a format's value
arrays, must be exactly what the converter builds from the revalued matrix (every format, awkward
parameters, every generator family, arbitrary matrices), padding slots included.

Mutations this kills: a slot off by one or computed from the wrong row order (SELL's permutation,
a DIA offset, a BSR block), padding slots not kept zero, HYB's overflow entries in the wrong order,
a map that follows the values instead of the structure (the map is made from the first values and
applied to others), and a transpose order that mismatches scipy's transpose."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparserl.formats import ConversionLimits, convert
from sparserl.formats.value_map import transpose_order, value_map
from sparserl.matrices import canonicalize, generate

UNLIMITED = ConversionLimits(max_fill=1e12)
CHOICES = [
    ("CSR", {}), ("COO", {}), ("ELL", {}),
    ("SELL", {"C": 32, "sigma": 1}), ("SELL", {"C": 4, "sigma": 8}), ("SELL", {"C": 3, "sigma": 1}),
    ("SELL", {"C": 8, "sigma": 64}),
    ("DIA", {}),
    ("BSR", {"R": 4, "C": 4}), ("BSR", {"R": 3, "C": 2}), ("BSR", {"R": 1, "C": 8}),
    ("HYB", {}), ("HYB", {"width": 0}), ("HYB", {"width": 2}),
]
FAMILIES = [("powerlaw", 300, {}), ("stencil2d", 400, {}), ("banded", 250, {}), ("block", 256, {}),
            ("empty_rows", 300, {}), ("rectangular", 120, {}), ("skewed", 300, {})]


def revalued(A: sp.csr_array, values: np.ndarray) -> sp.csr_array:
    return sp.csr_array((values.astype(np.float32), A.indices.copy(), A.indptr.copy()), shape=A.shape)


def check_map(A: sp.csr_array, fmt: str, params: dict, seed: int = 0) -> None:
    fd = convert(A, fmt, params, UNLIMITED)
    vm = value_map(A, fd)  # made from A's own values ...
    v = np.random.default_rng(seed).standard_normal(A.nnz).astype(np.float32)  # ... applied to new ones
    v[v == 0] = 1.0  # a zero would hide in a padding slot
    want = convert(revalued(A, v), fmt, params, UNLIMITED)
    got = vm.apply(v)
    floats = [name for name, a in want.arrays.items() if a.dtype == np.float32]
    assert list(got) == floats
    for name in floats:
        np.testing.assert_array_equal(got[name], want.arrays[name], err_msg=f"{fmt} {params} {name}")
    assert vm.slots == sum(want.arrays[name].size for name in floats)


@pytest.mark.parametrize("fmt,params", CHOICES, ids=[f"{f}{p}" for f, p in CHOICES])
@pytest.mark.parametrize("family,rows,kw", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_gathered_values_equal_the_converters_arrays(fmt, params, family, rows, kw) -> None:
    check_map(generate(family, rows, seed=3, **kw), fmt, params)


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
    assert value_map(A, convert(A, "CSR")).gathers == {"val": None}
    assert value_map(A, convert(A, "COO")).gathers == {"val": None}
    src = value_map(A, convert(A, "ELL", {}, UNLIMITED)).gathers["val"]
    assert src.dtype == np.int32 and (src < 0).sum() == src.size - A.nnz  # every padding slot, no more
    assert np.array_equal(np.sort(src[src >= 0]), np.arange(A.nnz))  # each value lands exactly once


def test_a_map_for_another_structure_is_refused() -> None:
    A, B = generate("banded", 100, seed=0), generate("banded", 101, seed=0)
    with pytest.raises(ValueError, match="not a conversion"):
        value_map(A, convert(B, "ELL"))


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

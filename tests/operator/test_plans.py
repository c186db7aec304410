"""The process's remembered conversions: a known structure with new values gets exactly the arrays a
fresh conversion would give (mutation killed: the remembered values reused as they were, or a map
from another structure), and a refused format is refused again."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.errors import FormatError
from sparserl.formats import convert
from sparserl.matrices import generate
from sparserl.matrices.card import structure_fingerprint
from sparserl.operator import plans


@pytest.mark.parametrize("fmt,params", [("SELL", {"C": 8, "sigma": 64}), ("HYB", {}), ("BSR", {"R": 2, "C": 2}),
                                        ("CSR", {})])
def test_a_known_structure_is_revalued_not_converted(fmt, params) -> None:
    plans.forget()
    A = generate("powerlaw", 2000, seed=0)
    fp = structure_fingerprint(A)
    first = plans.conversion(A, fp, fmt, params)
    assert first.map is None  # converted: no map needed yet
    v = np.random.default_rng(0).standard_normal(A.nnz).astype(np.float32)
    B = sp.csr_array((v, A.indices, A.indptr), shape=A.shape)
    again = plans.conversion(B, fp, fmt, params)
    assert again.map is not None
    want = convert(B, fmt, params)
    assert again.data.sizes == want.sizes and again.data.params == want.params
    for name, arr in want.arrays.items():
        np.testing.assert_array_equal(again.data.arrays[name], arr, err_msg=name)
    for name, arr in first.data.arrays.items():  # the remembered conversion is left as it was
        np.testing.assert_array_equal(arr, convert(A, fmt, params).arrays[name])


def test_only_a_few_are_kept_and_refusals_are_not() -> None:
    plans.forget()
    mats = [generate("banded", 500 + i, seed=0) for i in range(plans.KEEP + 2)]
    for A in mats:
        plans.conversion(A, structure_fingerprint(A), "ELL", {})
    assert len(plans._KEPT) == plans.KEEP
    A = generate("powerlaw", 2000, seed=1)
    for _ in range(2):
        with pytest.raises(FormatError):
            plans.conversion(A, structure_fingerprint(A), "DIA", {})
    plans.forget()

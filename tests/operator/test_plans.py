"""The process's remembered pattern conversions: a known structure is not converted again (the same
arrays come back), whatever its values; a refused format is refused again, and only a few are kept.
Mutation killed: a cache keyed by anything but the structure (another structure's conversion
returned, or a known one converted again)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparserl.errors import FormatError
from sparserl.matrices import generate
from sparserl.matrices.card import structure_fingerprint
from sparserl.operator import plans


def test_a_known_structure_is_not_converted_again() -> None:
    plans.forget()
    A = generate("powerlaw", 2000, seed=0)
    fp = structure_fingerprint(A)
    fd, vm = plans.conversion(A, fp, "SELL", {"C": 8, "sigma": 64})
    B = sp.csr_array((np.ones(A.nnz, np.float32), A.indices, A.indptr), shape=A.shape)
    again = plans.conversion(B, structure_fingerprint(B), "SELL", {"C": 8, "sigma": 64})
    assert again[0] is fd and again[1] is vm
    other = generate("powerlaw", 2000, seed=1)
    assert plans.conversion(other, structure_fingerprint(other), "SELL", {"C": 8, "sigma": 64})[0] is not fd
    plans.forget()


def test_only_a_few_are_kept_and_refusals_are_not() -> None:
    plans.forget()
    for i in range(plans.KEEP + 2):
        A = generate("banded", 500 + i, seed=0)
        plans.conversion(A, structure_fingerprint(A), "ELL", {})
    assert len(plans._KEPT) == plans.KEEP
    A = generate("powerlaw", 2000, seed=1)
    for _ in range(2):
        with pytest.raises(FormatError):
            plans.conversion(A, structure_fingerprint(A), "DIA", {})
    plans.forget()

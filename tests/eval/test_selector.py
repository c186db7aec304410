"""The rule-based selector picks the expected format per structure family, and every pick exists."""

from __future__ import annotations

import pytest

from sparserl.request.library import select_variant
from sparserl.kernels.contract import Op
from sparserl.matrices import compute_features, family_names, generate


@pytest.mark.parametrize("family, fmt", [("diagonal", "DIA"), ("banded", "DIA"), ("stencil2d", "DIA"),
                                         ("block", "BSR"), ("random", "ELL"), ("skewed", "CSR"),
                                         ("empty_rows", "CSR"), ("powerlaw", "CSR")])
def test_family_choices(family: str, fmt: str) -> None:
    v = select_variant(compute_features(generate(family, 4096, seed=0)))
    assert v.format == fmt and v.op is Op.SPMV


@pytest.mark.parametrize("family", family_names())
def test_every_family_gets_a_variant_for_both_ops(family: str) -> None:
    f = compute_features(generate(family, 1000, seed=1))
    assert select_variant(f, Op.SPMV).op is Op.SPMV
    assert select_variant(f, Op.SPMM).op is Op.SPMM

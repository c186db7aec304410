"""The reference kernel library: parameterised CUDA kernels rendered as contract completions.

These are the SFT targets and the oracle the model is judged against. Each format's
strategies live in their own module; this module gathers them::

    from sparserl.kernels.library import all_variants, get_variant
    v = get_variant("spmv/csr_vector/-/tpr=8,block=256")
    print(v.render())   # FORMAT: CSR / PARAMS: TPR=8, BLOCK=256 / LAUNCH: ... / extern "C" __global__ ...

A strategy's code is one text shared by all its variants; they differ in their FORMAT and PARAMS
lines only (:mod:`.common`).
"""

from __future__ import annotations

from functools import lru_cache

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op, format_spec
from sparserl.kernels.library import bsr, coo, csr, dia, ell, hyb, sell
from sparserl.kernels.library.common import Variant

__all__ = ["Variant", "all_variants", "get_variant", "variants"]

_MODULES = (csr, coo, ell, sell, dia, bsr, hyb)


@lru_cache(maxsize=1)
def all_variants() -> tuple[Variant, ...]:
    """Every library variant, SpMV then SpMM, grouped by format."""
    out = [v for mod in _MODULES for v in mod.variants()]
    ids = [v.id for v in out]
    if len(set(ids)) != len(ids):
        raise AssertionError("duplicate library variant ids")
    return tuple(sorted(out, key=lambda v: (v.op.value != "spmv", _MODULES.index(_module_of(v)))))


def _module_of(v: Variant):
    return {"CSR": csr, "COO": coo, "ELL": ell, "SELL": sell, "DIA": dia, "BSR": bsr, "HYB": hyb}[v.format]


def variants(op: Op | str | None = None, fmt: str | None = None, k: int | None = None) -> list[Variant]:
    """Variants filtered by op, format, and (SpMM) whether they accept ``k`` columns."""
    op = Op(op) if op is not None else None
    name = format_spec(fmt).name if fmt else None
    return [
        v for v in all_variants()
        if (op is None or v.op is op) and (name is None or v.format == name) and (k is None or v.applicable(k))
    ]


def get_variant(variant_id: str) -> Variant:
    """The variant with this id (see :attr:`Variant.id`)."""
    for v in all_variants():
        if v.id == variant_id:
            return v
    raise SparseRLError(f"no library variant {variant_id!r}; list them with 'sparserl library list'")

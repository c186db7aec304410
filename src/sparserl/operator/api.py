"""``sparserl.tune(A)``: the store first, else a budgeted search, else the library, as an operator.

The choice is :mod:`.tuning`'s, the operator :mod:`.core`'s; this module only joins them, so that
neither of the two imports the other's caller.
"""

from __future__ import annotations

import time

from sparserl.operator.core import SparseOperator
from sparserl.operator.tuning import PASSES, TuneConfig, check_request


def tune(A, op: str = "spmv", k: int | None = None, *, budget: int = 16, store=None, regime: str = "warm",
         seconds: float | None = None, min_speedup: float = 1.0, backward: bool = False, evaluator=None,
         name: str = "matrix", progress: bool = False, retime: int = PASSES) -> SparseOperator:
    """The fastest known kernel for ``A``'s structure, as an operator (``y = op @ x``).

    ``A``: any SciPy sparse matrix (or dense NumPy array). ``op``: 'spmv' (``op @ x``, x of n) or
    'spmm' (``op @ X``, X of n x ``k``, row-major). The best-known store is asked first, by structure
    fingerprint; otherwise a search of ``budget`` candidates runs, the store keeps its results, and its
    fastest are evaluated ``retime`` times again, fresh, before one is chosen (0: the first timings decide).
    ``backward``: tune A's transpose now too (for ``torch`` autograd through an SpMM; otherwise the
    first backward tunes it). The other arguments: see :class:`~.tuning.TuneConfig`. Says what it did
    on one line (``op.report.line``, logged at INFO). Needs a GPU and CuPy.
    """
    from sparserl.harness.device import cupy_module, device_arch
    from sparserl.matrices import canonicalize

    t0 = time.perf_counter()
    opv, k = check_request(op, k)
    cfg = TuneConfig(budget=budget, store=store, regime=regime, seconds=seconds, min_speedup=min_speedup,
                     evaluator=evaluator, name=name, progress=progress, retime=retime)
    cupy_module()  # no GPU: one line, before any work
    operator = SparseOperator.tuned(canonicalize(A), opv, k, cfg, device_arch(), t0)
    if backward:
        operator.transpose()
    return operator

"""Tuned kernels where users need them: ``sparserl.tune(A)`` -> an operator for CuPy and PyTorch.

* :mod:`.api`: ``tune``; :mod:`.tuning`: the choice: the store first (by structure fingerprint), else a
  budgeted search, else the library;
* :mod:`.core`: :class:`SparseOperator` (``op @ x``, ``matvec``/``matmat``, ``update_values``,
  ``as_linear_operator``, ``transpose``);
* :mod:`.torch_op`: the ``torch.ops.sparserl.matmul`` custom op (``torch.compile``, autograd);
* :mod:`.inputs`: the checks every input passes; :mod:`.backends`: kernel or cuSPARSE.

Importing this package needs neither CuPy nor torch.
"""

from __future__ import annotations

__all__ = ["SparseOperator", "TuneConfig", "TuneReport", "from_kernel", "tune"]


def __getattr__(name: str):
    if name == "tune":
        from sparserl.operator.api import tune

        return tune
    if name in ("TuneConfig", "TuneReport"):
        from sparserl.operator import tuning

        return getattr(tuning, name)
    if name in ("SparseOperator", "from_kernel"):
        from sparserl.operator import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Tuned kernels where users need them: ``sparserl.tune(A)`` -> an operator for CuPy and PyTorch.

* :mod:`.api`: ``tune``; :mod:`.tuning`: the choice: the store first (by structure fingerprint), else a
  budgeted search, else the library;
* :mod:`.core`: :class:`SparseOperator` (``op @ x``, ``matvec``/``matmat``, ``update_values``,
  ``as_linear_operator``, ``transpose``);
* :mod:`.solvers`: conjugate gradient with the scalars on the device and the iterations replayed as a
  CUDA graph (``op.cg(b)``);
* :mod:`.torch_op`: the ``torch.ops.sparserl.matmul`` custom op (``torch.compile``, autograd);
* :mod:`.inputs`: the checks every input passes; :mod:`.backends`: kernel or cuSPARSE.

Importing this package needs neither CuPy nor torch.
"""

from __future__ import annotations

__all__ = ["CGResult", "SparseOperator", "TuneConfig", "TuneReport", "cg", "from_kernel", "from_library",
           "solve_cg", "tune"]


def __getattr__(name: str):
    if name == "tune":
        from sparserl.operator.api import tune

        return tune
    if name in ("TuneConfig", "TuneReport"):
        from sparserl.operator import tuning

        return getattr(tuning, name)
    if name in ("SparseOperator", "from_kernel", "from_library"):
        from sparserl.operator import core

        return getattr(core, name)
    if name in ("CGResult", "cg", "solve_cg"):
        from sparserl.operator import solvers

        return getattr(solvers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

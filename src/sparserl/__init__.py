"""SparseRL: language models that write verified, matrix-specialised sparse CUDA kernels."""

from sparserl.errors import SparseRLError

__version__ = "0.1.0"
__all__ = ["SparseRLError", "__version__", "load_kernel", "tune"]


def load_kernel(folder):
    """A kernel written by ``sparserl generate``, as a callable (see :mod:`sparserl.loader`)."""
    from sparserl.loader import load_kernel as _load

    return _load(folder)


def tune(A, op="spmv", k=None, **kwargs):
    """The fastest known kernel for ``A``'s structure, as an operator: ``y = op @ x`` (see
    :func:`sparserl.operator.api.tune`)."""
    from sparserl.operator.api import tune as _tune

    return _tune(A, op, k, **kwargs)

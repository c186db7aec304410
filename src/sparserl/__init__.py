"""SparseRL: language models that write verified, matrix-specialised sparse CUDA kernels."""

from sparserl.errors import SparseRLError

__version__ = "0.1.0"
__all__ = ["SparseRLError", "__version__", "load_kernel"]


def load_kernel(folder):
    """A kernel written by ``sparserl generate``, as a callable (see :mod:`sparserl.loader`)."""
    from sparserl.loader import load_kernel as _load

    return _load(folder)

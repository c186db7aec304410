"""SparseRL: language models that write verified, matrix-specialised sparse CUDA kernels."""

from sparserl.errors import SparseRLError

__version__ = "0.1.0"
__all__ = ["SparseRLError", "__version__"]

"""Sparse matrices: load/save (Matrix Market, npz), structure features, seeded generators.

Every matrix handed around the project is *canonical*: a ``scipy.sparse.csr_array`` with float32
``data``, int32 ``indptr``/``indices``, sorted column indices and no duplicates (see
:func:`canonicalize`). Bad input raises :class:`sparserl.errors.MatrixError` with a one-line message.
"""

from sparserl.matrices.features import MatrixFeatures, compute_features
from sparserl.matrices.generators import FAMILIES, FamilySpec, family_names, generate, generate_many
from sparserl.matrices.io import canonicalize, load_matrix, save_matrix

__all__ = [
    "FAMILIES",
    "FamilySpec",
    "MatrixFeatures",
    "canonicalize",
    "compute_features",
    "family_names",
    "generate",
    "generate_many",
    "load_matrix",
    "save_matrix",
]

"""Exceptions the project raises on bad input.

Every error a user can cause (a malformed file, an impossible option) is a
:class:`SparseRLError` with a one-line message that says what is wrong and, where
it can, what to do. The CLI prints that line and exits with status 2; it never
shows a traceback for them.
"""


class SparseRLError(Exception):
    """Base class for user-facing errors (one-line message)."""


class MatrixError(SparseRLError):
    """A matrix file or matrix value that cannot be used (malformed, complex, NaN, empty, ...)."""


class FormatError(SparseRLError):
    """A sparse format conversion that is invalid or would be wasteful past its limit."""


class ContractError(SparseRLError):
    """A kernel header, signature or LAUNCH expression that breaks the kernel contract."""


"""Operators by number: how the PyTorch custom op (whose arguments are tensors and ints) finds the
operator it applies. Each operator takes a number when it is made; the registry holds it weakly, so
an operator lives as long as its owner (a model, a solver) keeps it."""

from __future__ import annotations

import itertools
import weakref

from sparserl.errors import SparseRLError

_OPERATORS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_NUMBERS = itertools.count(1)


def register(operator) -> int:
    """A new number for ``operator``."""
    handle = next(_NUMBERS)
    _OPERATORS[handle] = operator
    return handle


def find(handle: int):
    """The operator registered under ``handle``, or None (freed, or a number a traced graph made up)."""
    return _OPERATORS.get(int(handle))


def lookup(handle: int):
    """The operator registered under ``handle``."""
    op = find(handle)
    if op is None:
        raise SparseRLError(f"no live sparse operator number {handle}: the operator this call was traced with "
                            "has been freed (keep a reference to it, e.g. as an attribute of the model)")
    return op

"""Kernels that try to fool the harness, one module per attack class, each with the verdict it must get.

Shared by the CPU tests (static and compile-time cases are refused without a GPU; runtime cheats
are *not* refused early for the wrong reason) and the GPU tests (the exact verdict at run time,
and the pool keeps serving afterwards). All are SpMV on CSR.

* :mod:`.classic` - wrong answers, crashes, hangs, the first static rules;
* :mod:`.timed` - telling a timed run from a verification run;
* :mod:`.state` - hidden state across launches (namespaces, macros, const casts, calls out);
* :mod:`.preprocessor` - banned names and files through the preprocessor;
* :mod:`.host` - host functions and variables;
* :mod:`.values` - kernels specialised to the values (run on a unit-valued matrix);
* :mod:`.guards` - writes just outside x and y;
* :mod:`.early` - the batched path's shortcuts: early stopping, conversions shared between kernels.

A verdict of ``none`` means the kernel is correct and timed honestly (it gains nothing).
"""

from __future__ import annotations

from tests.harness.adversarial import classic, early, guards, host, preprocessor, state, timed, values
from tests.harness.adversarial.base import DOT, GOOD, HEAD, HONEST, SIG, csr

CLASSES = {"classic": classic.CASES, "timed": timed.CASES, "state": state.CASES,
           "preprocessor": preprocessor.CASES, "host": host.CASES, "values": values.CASES, "guards": guards.CASES,
           "early": early.CASES}
ADVERSARIAL: dict[str, tuple[str, str]] = {}
for _cases in CLASSES.values():
    assert not set(_cases) & set(ADVERSARIAL), "duplicate case names"
    ADVERSARIAL.update(_cases)
VALUE_CASES = set(values.CASES)
"""Cases that must run on a unit-valued matrix to show their cheat."""
FAR_WRITE = classic.FAR_WRITE
RUNTIME_KINDS = {"incorrect", "input_modified", "crashed", "timeout", "resource_limit", "nondeterministic", "none",
                 "slow"}
"""Verdicts only a GPU run can give."""
SEQUENTIAL_VERDICTS = early.SEQUENTIAL
"""Cases whose verdict differs on the sequential path (``SpeedConfig.classic()``), which never stops early."""

__all__ = ["ADVERSARIAL", "CLASSES", "DOT", "FAR_WRITE", "GOOD", "HEAD", "HONEST", "RUNTIME_KINDS",
           "SEQUENTIAL_VERDICTS", "SIG", "VALUE_CASES", "csr"]

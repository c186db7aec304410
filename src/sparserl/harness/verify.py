"""Verification of a bound kernel on the GPU (runs inside a worker process).

For each input in a fixed, seeded set (several random inputs and adversarial ones:
large signed magnitudes, all zeros, alternating signs), the kernel is launched on
*freshly allocated* x and y buffers (a kernel that caches its answer by pointer, or in
global state, sees new pointers and new values every time):

* y is filled with NaN before the launch (zeroed instead for formats whose contract
  says so), and has a NaN guard region after its end: unwritten rows stay NaN and fail,
  writes past the end of y are caught by the guard;
* the output is compared with the fp64 reference under the documented tolerance
  (:mod:`sparserl.harness.reference`), on the GPU;
* afterwards, x and every matrix array must be bit-for-bit unchanged (a modified
  matrix is restored from a pristine copy before the next job);
* the first input is run again: a kernel without atomics must reproduce its output bit
  for bit; one with atomics must pass the tolerance again (rounding order may differ).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sparserl.harness.launcher import BoundKernel
from sparserl.harness.reference import compare_to, rtol_per_row
from sparserl.harness.result import ErrorKind

GUARD = 256  # poison entries after the end of y


@dataclass(frozen=True)
class VerifyConfig:
    """Which inputs a kernel must get right."""

    random_inputs: int = 3
    """Random inputs (normal and uniform), each a fresh draw."""
    adversarial: bool = True
    """Also: large signed magnitudes (|x| ~ 1e4), all zeros, alternating +1/-1."""
    seed: int = 1234
    """Inputs are seeded per matrix so every kernel sees the same ones."""


@dataclass(frozen=True)
class VerifyOutcome:
    kind: ErrorKind  # NONE when everything passed
    message: str
    max_scaled_error: float


def make_inputs(shape: tuple[int, ...], cfg: VerifyConfig) -> list[tuple[str, np.ndarray]]:
    """The verification inputs for an x (or X) of ``shape``, deterministic in ``cfg.seed``."""
    rng = np.random.default_rng(cfg.seed)
    out = []
    for i in range(cfg.random_inputs):
        if i % 2 == 0:
            out.append((f"normal{i}", rng.standard_normal(shape).astype(np.float32)))
        else:
            out.append((f"uniform{i}", rng.uniform(-1, 1, shape).astype(np.float32)))
    if cfg.adversarial:
        sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        out.append(("large_signed", (sign * rng.uniform(1e3, 1e4, shape)).astype(np.float32)))
        out.append(("zeros", np.zeros(shape, np.float32)))
        alt = np.ones(shape, np.float32)
        alt[1::2] = -1
        out.append(("alternating", alt))
    return out


class Verifier:
    """The inputs and fp64 references for one matrix and shape, kept on the GPU."""

    def __init__(self, A, k: int | None, cfg: VerifyConfig):
        import cupy as cp
        import cupyx.scipy.sparse as csp

        m, n = A.shape
        self.m, self.k = m, k
        shape = (n,) if k is None else (n, k)
        A64 = csp.csr_matrix((cp.asarray(A.data, dtype=cp.float64), cp.asarray(A.indices), cp.asarray(A.indptr)),
                             shape=A.shape)
        absA = csp.csr_matrix((cp.abs(A64.data), A64.indices, A64.indptr), shape=A.shape)
        self.rtol = cp.asarray(rtol_per_row(A))
        self.inputs = []
        for name, xh in make_inputs(shape, cfg):
            x64 = cp.asarray(xh, dtype=cp.float64)
            self.inputs.append((name, xh, A64 @ x64, absA @ cp.abs(x64)))

    def device_arrays(self) -> list:
        """Every array this verifier keeps on the GPU (per-row tolerances, references, magnitudes)."""
        return [self.rtol] + [a for _, _, ref, mag in self.inputs for a in (ref, mag)]

    def _out(self):
        import cupy as cp

        size = self.m * (self.k or 1)
        full = cp.full(size + GUARD, np.nan, dtype=cp.float32)
        y = full[:size] if self.k is None else full[:size].reshape(self.m, self.k)
        return full, y

    def run(self, bound: BoundKernel, uses_atomics: bool,
            matrix_modified: Callable[[], list[str]] = lambda: [],
            phase: Callable[[str], None] = lambda name: None) -> VerifyOutcome:
        """Verify ``bound``; CUDA errors propagate to the worker, which classifies them.

        ``matrix_modified()`` names the matrix arrays that differ from their pristine
        copies; it is checked after every launch, before the output is judged.
        ``phase("verify")`` is called right before each launch of the candidate and
        ``phase("check")`` right after it finished, so the parent's tight time limit for
        a hanging kernel covers the candidate only, not the harness's own checks.
        """
        import cupy as cp

        keep = []  # hold every buffer until the end so no pointer is ever reused
        worst = 0.0
        first_y = None
        for idx, (name, xh, ref, mag) in enumerate(self.inputs + [self.inputs[0]]):
            x = cp.asarray(xh)
            full, y = self._out()
            keep += [x, full]
            cp.cuda.runtime.deviceSynchronize()
            phase("verify")
            bound.run(x, y)
            cp.cuda.runtime.deviceSynchronize()
            phase("check")
            if not bool(cp.array_equal(x, cp.asarray(xh))):
                return VerifyOutcome(ErrorKind.INPUT_MODIFIED, "the kernel wrote to x", worst)
            if modified := matrix_modified():
                return VerifyOutcome(ErrorKind.INPUT_MODIFIED,
                                     f"the kernel wrote to the matrix arrays {', '.join(modified)}", worst)
            if not bool(cp.isnan(full[y.size:]).all()):
                return VerifyOutcome(ErrorKind.INCORRECT, "wrote past the end of y", float("inf"))
            res = compare_to(ref, mag, self.rtol, y)
            worst = max(worst, res.max_scaled_error)
            if not res.ok:
                what = f"{res.nonfinite} entries never written or not finite" if res.nonfinite else "wrong values"
                return VerifyOutcome(ErrorKind.INCORRECT,
                                     f"input '{name}': {res.bad_rows} rows out of tolerance ({what}), "
                                     f"first bad row {res.first_bad_row}, max error {res.max_scaled_error:.3g}x "
                                     f"the tolerance", worst)
            if idx == 0:
                first_y = y.copy()
            elif idx == len(self.inputs) and not uses_atomics and not bool(cp.array_equal(y, first_y)):
                return VerifyOutcome(ErrorKind.NONDETERMINISTIC,
                                     "two runs on the same input differ and the code uses no atomics", worst)
        return VerifyOutcome(ErrorKind.NONE, "", worst)

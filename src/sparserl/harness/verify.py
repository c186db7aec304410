"""Verification of a bound kernel on the GPU (runs inside a worker process).

For each input in a fixed, seeded set (several random inputs, adversarial ones: large signed
magnitudes, all zeros, alternating signs; and a non-negative one), the kernel is launched on
*freshly allocated* x and y buffers (a kernel that caches its answer by pointer, or in
global state, sees new pointers and new values every time), laid out as every launch is
(:class:`~sparserl.harness.buffers.IOBuffers`: NaN guards on both sides of x and of y):

* y is filled with NaN before the launch (zeroed instead for formats whose contract says so):
  unwritten rows stay NaN and fail; a write before the start or past the end of y (or x) is
  caught by the guards;
* the output is compared with the fp64 reference under the documented tolerance
  (:mod:`sparserl.harness.reference`), on the GPU;
* afterwards, x and every matrix array must be bit-for-bit unchanged (a modified
  matrix is restored from a pristine copy before the next job);
* the first input is run again, always, with y holding the second input's output instead of
  NaN (a user's y holds whatever the last call left): a kernel must write all of y whatever it
  held, so one that skips rows already holding a number, or adds to them, is ``incorrect``; and a
  kernel whose compiled code has no atomics must reproduce its output bit for bit; one with atomics
  must pass the tolerance again (rounding order may differ);
* then the kernel runs on the same sparsity pattern with fresh random values
  (``A_alt``, :mod:`sparserl.harness.resident`) on the first ``revalued_inputs`` inputs: a kernel
  may bake the structure into its code, never the values; and on the non-negative input, with
  which no row of ``A_alt`` (one sign to a row) cancels, so a kernel that leaves out terms of a
  long row fails, as it does in every timed run.

The verifier runs on the GPU (CuPy, in a worker) or, with ``xp=numpy``, on the host: the same
rules on the same buffers, for tests with host kernels standing in for CUDA ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sparserl.harness import profile
from sparserl.harness.buffers import IOBuffers
from sparserl.harness.launcher import BoundKernel
from sparserl.harness.result import ErrorKind


@dataclass(frozen=True)
class VerifyConfig:
    """Which inputs a kernel must get right."""

    random_inputs: int = 3
    """Random inputs (normal and uniform), each a fresh draw."""
    adversarial: bool = True
    """Also: large signed magnitudes (|x| ~ 1e4), all zeros, alternating +1/-1."""
    revalued_inputs: int = 2
    """Inputs also run on the same pattern with fresh random values, the non-negative one besides them (0 turns
    all of that off)."""
    seed: int = 1234
    """Inputs are seeded per matrix so every kernel sees the same ones."""

    def __post_init__(self) -> None:
        if self.random_inputs < 1 or self.revalued_inputs < 0:
            raise ValueError("need random_inputs >= 1 and revalued_inputs >= 0")


@dataclass(frozen=True)
class VerifyOutcome:
    kind: ErrorKind  # NONE when everything passed
    message: str
    max_scaled_error: float


@dataclass
class Target:
    """A kernel bound to one version of the matrix, with its reference and its tamper check."""

    bound: BoundKernel
    reference: object
    """The :class:`~sparserl.harness.reference.Fp64Reference` of that version."""
    modified: Callable[[], list[str]]
    """Names of matrix arrays that differ from their pristine copies (restoring them)."""


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
    out.append((NON_NEGATIVE, np.abs(rng.standard_normal(shape)).astype(np.float32)))
    return out


NON_NEGATIVE = "non_negative"
"""The input of |normal| values, verified on ``A`` and on ``A_alt``, whose rows each have one sign: with
it no row of ``A_alt`` cancels, so the tolerance (relative to ``|A| |x|``) holds ``|A x|`` itself."""

STALE_Y = "run again on a y holding another input's output, "
"""How a message names the re-run of the first input (its y not NaN but another input's answer)."""


def verification_runs(inputs: list, main, alt, cfg: VerifyConfig) -> list[tuple]:
    """The launches of a verification in order, each (target, input name, x, where, hint): every
    input on ``main``, the first again (on a y holding another input's output), the first
    ``revalued_inputs`` and the non-negative one on ``alt``. ``where`` prefixes a failure's message,
    ``hint`` ends it."""
    runs = [(main, name, x, "", "") for name, x in inputs]
    stale = stale_source(len(inputs), len(inputs)) is not None
    runs.append((main, inputs[0][0], inputs[0][1], STALE_Y if stale else "",
                 " (the kernel must write all of y, whatever y held)" if stale else ""))
    if alt is not None and cfg.revalued_inputs > 0:
        chosen = inputs[:cfg.revalued_inputs] + [(n, x) for n, x in inputs[cfg.revalued_inputs:] if n == NON_NEGATIVE]
        runs += [(alt, name, x, "with the same pattern and fresh values, ",
                  " (every row's terms have one sign here, so none cancel: the kernel must add every term, and one fp32 "
                  "accumulator drifts on a row of 1.5 million entries or more)"
                  if name == NON_NEGATIVE else " (the kernel must read every value from val)") for name, x in chosen]
    return runs


def stale_source(idx: int, n_inputs: int) -> int | None:
    """The launch whose output fills y before launch ``idx`` (the re-run of the first input gets the
    second input's, a random one: a structured input's product can be all zeros, as the alternating
    input's is under a difference operator), or None: y is NaN (every other launch; the re-run too when
    there is one input)."""
    return 1 if idx == n_inputs and n_inputs > 1 else None


class Verifier:
    """Runs a kernel on the verification inputs and judges every output (module docstring)."""

    def __init__(self, m: int, n: int, k: int | None, cfg: VerifyConfig, xp=None):
        if xp is None:
            import cupy as xp

        self.xp = xp
        self.m, self.n, self.k = m, n, k
        self.cfg = cfg
        self.inputs = [(name, xp.asarray(xh)) for name, xh in make_inputs((n,) if k is None else (n, k), cfg)]

    def device_arrays(self) -> list:
        """The inputs kept on the GPU (fingerprinted by the worker to catch stray writes)."""
        return [x for _, x in self.inputs]

    def run(self, main: Target, alt: Target | None, uses_atomics: bool,
            phase: Callable[[str], None] = lambda name: None) -> VerifyOutcome:
        """Verify; CUDA errors propagate to the worker, which classifies them.

        ``phase("verify")`` is called right before each launch of the candidate and
        ``phase("check")`` right after it finished, so the parent's tight time limit for
        a hanging kernel covers the candidate only, not the harness's own checks.
        """
        keep: list[IOBuffers] = []  # hold every buffer until the end so no pointer is ever reused
        worst = 0.0
        first_y = None
        runs = verification_runs(self.inputs, main, alt, self.cfg)
        for idx, (target, name, x, where, hint) in enumerate(runs):
            with profile.step("verify_inputs"):
                io = IOBuffers(self.m, self.n, self.k, xp=self.xp)
                keep.append(io)
                if (src := stale_source(idx, len(self.inputs))) is not None:
                    io.y[...] = keep[src].y
            bad, y = self._launch(target, io, x, phase)
            if bad is not None:
                return VerifyOutcome(bad[0], f"{where}input '{name}': {bad[1]}", worst if bad[2] is None else bad[2])
            with profile.step("verify_compare"):
                res = target.reference.compare(io.x, y)
            worst = max(worst, res.max_scaled_error)
            if not res.ok:
                return VerifyOutcome(ErrorKind.INCORRECT, f"{where}input '{name}': {res.describe()}{hint}", worst)
            if idx == 0:
                with profile.step("verify_determinism"):
                    first_y = y.copy()
            elif idx == len(self.inputs) and not uses_atomics:
                with profile.step("verify_determinism"):
                    same = bool(self.xp.array_equal(y, first_y))
                if not same:
                    return VerifyOutcome(ErrorKind.NONDETERMINISTIC,
                                         "two runs on the same input differ and the compiled code uses no atomics",
                                         worst)
        return VerifyOutcome(ErrorKind.NONE, "", worst)

    def _sync(self) -> None:
        if self.xp is not np:
            self.xp.cuda.runtime.deviceSynchronize()

    def _launch(self, target: Target, io: IOBuffers, x, phase) -> tuple[tuple | None, object]:
        """Launch once on ``io`` with input ``x``; (failure kind, message, error) or None, and y."""
        with profile.step("verify_inputs"):
            io.load_x(x)
            self._sync()
        phase("verify")
        with profile.step("verify_launch"):
            target.bound.run(io.x, io.y)
            self._sync()
            profile.count("verify_launches")
        phase("check")
        with profile.step("verify_tamper"):
            if not bool(self.xp.array_equal(io.x, x)):
                return (ErrorKind.INPUT_MODIFIED, "the kernel wrote to x", None), io.y
            if modified := target.modified():
                return (ErrorKind.INPUT_MODIFIED, f"the kernel wrote to the matrix arrays {', '.join(modified)}",
                        None), io.y
            if (g := io.guard_problem()) is not None:
                kind = ErrorKind.INPUT_MODIFIED if g.endswith(" x") else ErrorKind.INCORRECT
                return (kind, g, float("inf")), io.y
        return None, io.y

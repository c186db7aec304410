"""The input and output buffers of a launch, laid out the same way whenever a kernel runs.

Verification launches and timed launches both use :class:`IOBuffers`: ``x`` (or ``X``) and ``y``
(or ``Y``) each sit between two guard regions of :data:`GUARD` floats, every guard float holding
one NaN bit pattern. A kernel therefore sees the same thing around its buffers whether it is being
checked or timed, and a write just before the start or just past the end of ``y`` (or ``x``) is
found by :meth:`IOBuffers.guard_problem`, which compares bit patterns (so a different NaN does not
pass).

:class:`CheckedIO` makes a timed launch a checked one (see :func:`sparserl.harness.timing.time_run`):
before every timed run ``x`` gets fresh pseudo-random values in [0, 1) (from a seed the kernel cannot
know, drawn from the OS for each sample) and ``y`` is poisoned with NaN, exactly like a verification
launch. Non-negative because timed runs use ``A_alt``, whose rows each have values of one sign
(:func:`sparserl.harness.resident.revalued`): no row's terms cancel, so the tolerance, which scales
with ``|A| |x|``, is tight against ``|A x|`` itself and a kernel that leaves out part of a long row is
caught; afterwards ``x`` is written again from the same seed (so a kernel that rewrote ``x`` while
timed is judged on the input it was given, not on what it left there) and the output is compared
with the fp64 reference for that ``x``. So a kernel that computes only when its output looks
unwritten, that caches an answer for a repeated input, or that zeroes ``x`` when timed and answers
for the zeroed input, produces wrong timed outputs and is judged ``incorrect``.

Both classes work on the GPU (CuPy, the worker) or on the host (``xp=numpy``: the same layout,
poison, guards and checks, with :func:`host_refresh` computing the fresh inputs the CUDA kernel
computes), so the rules are tested on a CPU with host kernels standing in for CUDA ones.
"""

from __future__ import annotations

import secrets

import numpy as np

from sparserl.harness.device import cupy_module

GUARD = 256
"""Guard floats on each side of x and of y."""
NAN_BITS = 0x7FC00000
"""The NaN every guard and every poisoned output holds."""

_REFRESH = r"""
extern "C" __global__ void refresh_io(float* __restrict__ x, long long nx, float* __restrict__ y, long long ny,
                                      const unsigned long long* __restrict__ seed, unsigned int offset)
{
    // x[i] = uniform in [0, 1) from splitmix64(seed + offset, i); y[i] = NaN (the poison)
    const unsigned long long s = (seed[0] + offset) * 0x9E3779B97F4A7C15ull;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nx + ny;
         i += (long long)gridDim.x * blockDim.x) {
        if (i < nx) {
            unsigned long long z = s + (unsigned long long)i * 0xD1B54A32D192ED03ull;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            x[i] = (float)(z >> 41) * (1.0f / 8388608.0f);
        } else {
            y[i - nx] = __int_as_float(0x7fc00000);
        }
    }
}
"""
_kernel = None
_GOLDEN, _MIX1, _MIX2, _STEP = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD1B54A32D192ED03
_M64 = (1 << 64) - 1


def host_refresh(seed: int, offset: int, count: int) -> np.ndarray:
    """The ``count`` x values :data:`_REFRESH` writes for ``(seed, offset)``, computed on the host:
    splitmix64 of ``(seed + offset) * golden + i * step``, its top 23 bits scaled to [0, 1)."""
    s = np.uint64(((seed + offset) * _GOLDEN) & _M64)
    with np.errstate(over="ignore"):
        z = s + np.arange(count, dtype=np.uint64) * np.uint64(_STEP)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(41)).astype(np.float32) * np.float32(1.0 / 8388608.0)


def _refresh_kernel():
    global _kernel
    if _kernel is None:
        cp = cupy_module()
        _kernel = cp.RawKernel(_REFRESH, "refresh_io")
    return _kernel


class IOBuffers:
    """``x`` (n, or n x k) and ``y`` (m, or m x k), each between NaN guards; ``y`` starts poisoned.

    ``xp``: the array module (default CuPy on the GPU; ``numpy`` for the host path)."""

    def __init__(self, m: int, n: int, k: int | None = None, xp=None):
        cp = xp if xp is not None else cupy_module()
        self.cp = cp
        kk = k or 1
        self.nx, self.ny = n * kk, m * kk
        self.xfull = cp.full(self.nx + 2 * GUARD, np.nan, dtype=cp.float32)
        self.yfull = cp.full(self.ny + 2 * GUARD, np.nan, dtype=cp.float32)
        xs, ys = self.xfull[GUARD:GUARD + self.nx], self.yfull[GUARD:GUARD + self.ny]
        self.x = xs if k is None else xs.reshape(n, k)
        self.y = ys if k is None else ys.reshape(m, k)

    def load_x(self, values) -> None:
        """Copy ``values`` (host or device, the shape of x) into x."""
        self.x[...] = self.cp.asarray(values, dtype=self.cp.float32)

    def poison_y(self) -> None:
        self.y.fill(np.nan)

    def refresh(self, seed, offset: int, poison: bool = True) -> None:
        """Enqueue on the current stream: x from ``(seed[0] + offset)``, and (``poison``) y to NaN.

        ``seed`` is a one-element uint64 device array, so a captured graph reads a new seed on
        every replay."""
        ny = self.ny if poison else 0
        if self.cp is np:  # the host path: the same values, at once
            self.x.reshape(-1)[...] = host_refresh(int(seed[0]), offset, self.nx)
            if poison:
                self.poison_y()
            return
        grid = max(1, min(1024, (self.nx + ny + 255) // 256))
        _refresh_kernel()((grid,), (256,), (self.x, np.int64(self.nx), self.y, np.int64(ny), seed, np.uint32(offset)))

    def guard_problem(self) -> str | None:
        """Which guard a kernel wrote into (None when all four hold their NaN bit pattern)."""
        cp = self.cp
        for full, size, name in ((self.yfull, self.ny, "y"), (self.xfull, self.nx, "x")):
            bits = full.view(cp.uint32)
            if not bool((bits[:GUARD] == NAN_BITS).all()):
                return f"wrote before the start of {name}"
            if not bool((bits[GUARD + size:] == NAN_BITS).all()):
                return f"wrote past the end of {name}"
        return None


STALE_WITHIN = 5
"""The cold run whose y is left holding the previous run's output is one of the first this many (the
early stop's runs: every evaluation that is timed makes them)."""


def stale_y_run(runs: int) -> int | None:
    """The cold run (0-based), chosen from the OS unpredictably among runs 2 to :data:`STALE_WITHIN`, before
    which y is not poisoned but keeps the previous run's output, as a user's y keeps the last call's; None
    when there is no earlier run. Its x is fresh as every run's, so a kernel cannot tell it from a user's
    call: one whose output depends on what y held is wrong there."""
    upto = min(runs, STALE_WITHIN)
    return 1 + secrets.randbelow(upto - 1) if upto >= 2 else None


STALE_Y_NOTE = ", its y holding the previous run's output"
"""Added to the name of the stale-y run in a timed run's failure message."""


class CheckedIO:
    """Fresh x and a poisoned y before each timed run; the output checked after it (module docstring)."""

    def __init__(self, io: IOBuffers, reference=None):
        cp = io.cp
        self.cp = cp
        self.io = io
        self.reference = reference
        """An :class:`~sparserl.harness.reference.Fp64Reference`, or None to prepare without checking
        (cuSPARSE, which is trusted)."""
        self.seed = cp.zeros(1, dtype=cp.uint64)
        self.seed_value = 0
        """The host's copy of the seed last written to ``seed``."""
        self.snapshot = cp.empty_like(io.y) if reference is not None else None
        self.snapshot_rep: int | None = None
        self.checked = 0
        """Outputs compared with the reference so far."""

    def new_seed(self) -> None:
        """A seed from the OS for the next sample (host to device, before the sample is enqueued)."""
        self.seed_value = secrets.randbits(63)
        self.seed[...] = self.seed_value

    def prepare(self, rep: int, poison: bool = True) -> None:
        """Enqueue: x for repetition ``rep`` of this sample, y poisoned (unless not ``poison``: the stale-y
        run, :func:`stale_y_run`)."""
        self.io.refresh(self.seed, rep, poison=poison)

    def choose_snapshot(self, reps: int) -> None:
        """Pick, unpredictably, the repetition whose output a warm sample also keeps and checks."""
        self.snapshot_rep = secrets.randbelow(reps) if self.snapshot is not None else None

    def mark(self, rep: int) -> None:
        """Enqueue after repetition ``rep``: keep its output if it is the chosen one."""
        if rep == self.snapshot_rep:
            self.snapshot[...] = self.io.y

    def check(self, what: str, rep: int) -> str | None:
        """Judge the output left by the last sample, whose last run was repetition ``rep`` (and the kept
        one): a message, or None. Each output is compared with the reference for the x its run was
        given, written again from the seed (the host's copy of it, written to the device again first: the seed's
        device copy is memory a kernel could reach and rewrite to an x it has the answer for): the x left in the
        buffer is whatever the kernel left."""
        if self.reference is None:
            return None
        if (g := self.io.guard_problem()) is not None:
            return f"timed run ({what}) {g}"
        self.seed[...] = self.seed_value  # the host's copy: a kernel that rewrote the seed would choose its own x
        self.io.refresh(self.seed, rep, poison=False)
        res = self.reference.compare(self.io.x, self.io.y)
        self.checked += 1
        if not res.ok:
            return f"timed run ({what}): output differs from the reference: {res.describe()}"
        if self.snapshot_rep is not None:
            self.io.refresh(self.seed, self.snapshot_rep, poison=False)
            res = self.reference.compare(self.io.x, self.snapshot)
            self.checked += 1
            if not res.ok:
                return (f"timed run ({what}, repetition {self.snapshot_rep + 1}): output differs from the "
                        f"reference: {res.describe()}")
        return None

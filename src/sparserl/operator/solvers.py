"""Conjugate gradient on the GPU around an operator's tuned SpMV, with no host round trip per iteration.

``cupyx.scipy.sparse.linalg.cg`` reads the residual norm back to the host after every iteration and
launches each vector step from Python, so on matrices of up to a few million nonzeros an iteration
costs about 200 us however fast the SpMV is (docs/results.md, section 8). Here one iteration is the
SpMV plus four small kernels whose scalars (rho, p.q, r.r, beta) stay on the device, in float64:

1. ``q = A p``: the operator's backend (the tuned kernel's launch sequence, or cuSPARSE);
2. ``pq = p . q``;
3. ``alpha = rho / pq``; ``x += alpha p``; ``r -= alpha q``; ``rr = r . r`` in the same pass;
4. one thread: the iteration count, the stop test (``sqrt(rr) <= atol``, ``maxiter``, or a
   breakdown ``pq <= 0``: A is not positive definite), then ``beta = rr / rho`` and ``rho = rr``;
5. ``p = r + beta p``.

After the stop every kernel but the SpMV returns at once, so the iterate, the count and the residual
are those of the iteration that stopped, as if the loop had exited there. ``check_every`` iterations
are captured in one CUDA graph and replayed; the host reads the stop flag once per replay. The
arithmetic is cupyx's (the same recurrences, no preconditioner, the same ``atol = max(atol,
rtol * |b|)``; an ``x0`` that already meets it returns after no iteration), with the dot products summed in float64, so the iteration counts
agree with cupyx's to within rounding.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sparserl.errors import SparseRLError

log = logging.getLogger(__name__)

# scalars (float64): rho, p.q, r.r, atol^2, beta; flags (int32): stop reason, iterations done, iteration limit
RHO, PQ, RR, ATOL2, BETA = range(5)
STOP, ITERS, LIMIT = range(3)
# stop reasons (CG_SOURCE's cg_scalars writes the same numbers)
RUNNING, CONVERGED, MAXITER, BREAKDOWN = range(4)

THREADS = 256
INT32_MAX = 2**31 - 1

CG_SOURCE = r"""
#define RHO 0
#define PQ 1
#define RR 2
#define ATOL2 3
#define BETA 4
#define STOP 0
#define ITERS 1
#define LIMIT 2

__device__ __forceinline__ double block_sum(double v)
{
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? part[lane] : 0.0;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// s[at] += a . b (the caller zeroes s[at] first); skipped once the solve has stopped
extern "C" __global__ void cg_dot(const float* __restrict__ a, const float* __restrict__ b, double* s, int at,
                                  const int* __restrict__ flags, long long n)
{
    if (flags[STOP]) return;
    double v = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        v += (double)a[i] * (double)b[i];
    v = block_sum(v);
    if (threadIdx.x == 0) atomicAdd(&s[at], v);
}

// alpha = rho / pq; x += alpha p; r -= alpha q; s[RR] += r . r
extern "C" __global__ void cg_update(float* __restrict__ x, float* __restrict__ r, const float* __restrict__ p,
                                     const float* __restrict__ q, double* s, const int* __restrict__ flags,
                                     long long n)
{
    if (flags[STOP] || !(s[PQ] > 0.0)) return;  // a breakdown leaves x and r as they were
    const float alpha = (float)(s[RHO] / s[PQ]);
    double v = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        x[i] += alpha * p[i];
        const float ri = r[i] - alpha * q[i];
        r[i] = ri;
        v += (double)ri * (double)ri;
    }
    v = block_sum(v);
    if (threadIdx.x == 0) atomicAdd(&s[RR], v);
}

// one thread: count the iteration, test the stop, then beta and the next rho; zero the sums
extern "C" __global__ void cg_scalars(double* s, int* flags)
{
    if (flags[STOP]) return;
    if (!(s[PQ] > 0.0)) { flags[STOP] = 3; return; }  // p.q <= 0 or NaN: A is not positive definite
    flags[ITERS] += 1;
    if (s[RR] <= s[ATOL2]) { flags[STOP] = 1; return; }
    if (flags[ITERS] >= flags[LIMIT]) { flags[STOP] = 2; return; }
    s[BETA] = s[RR] / s[RHO];
    s[RHO] = s[RR];
    s[PQ] = 0.0;
    s[RR] = 0.0;
}

// p = r + beta p
extern "C" __global__ void cg_direction(float* __restrict__ p, const float* __restrict__ r, const double* s,
                                        const int* __restrict__ flags, long long n)
{
    if (flags[STOP]) return;
    const float beta = (float)s[BETA];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p[i] = r[i] + beta * p[i];
}
"""

_MODULES: dict[int, Any] = {}


@dataclass(frozen=True)
class CGResult:
    """What :func:`solve_cg` did: the iterate, scipy's ``info`` (0 converged, the iteration count if
    ``maxiter`` ran out, -1 on a breakdown), the iterations run and the final recursive residual norm."""

    x: Any
    info: int
    iterations: int
    residual_norm: float
    atol: float
    replays: int
    graph: bool

    @property
    def converged(self) -> bool:
        return self.info == 0


def _module(cp):
    device = cp.cuda.runtime.getDevice()
    if device not in _MODULES:
        mod = cp.RawModule(code=CG_SOURCE, options=("-std=c++17",))
        for name in ("cg_dot", "cg_update", "cg_scalars", "cg_direction"):
            mod.get_function(name)  # compiled and loaded now, never inside a graph capture
        _MODULES[device] = mod
    return _MODULES[device]


def _vector(cp, v, n: int, what: str):
    """A float32 CuPy vector of length ``n`` on the current device, viewed (not copied) where it is one."""
    from sparserl.operator.inputs import check_operand, describe

    check_operand(describe(v, what), what, (n,), cp.cuda.runtime.getDevice())
    return cp.asarray(v.detach() if hasattr(v, "detach") else v)


def _caller_stream(cp, *given):
    """The stream the caller's work on the inputs runs in: PyTorch's current one for tensors, else CuPy's."""
    for v in given:
        if type(v).__module__.startswith("torch"):
            from sparserl.operator.torch_op import current_stream

            return current_stream(cp, v.device)
    return cp.cuda.get_current_stream()


def solve_cg(op, b, x0=None, *, rtol: float = 1e-5, atol: float | None = None, maxiter: int | None = None,
             check_every: int = 16, graph: bool = True) -> CGResult:
    """Solve ``A x = b`` for a symmetric positive definite ``A`` by conjugate gradient, ``A x`` by the
    operator ``op`` (an SpMV :class:`~sparserl.operator.core.SparseOperator`).

    ``b`` and ``x0``: float32 CuPy arrays or torch CUDA tensors of length n; ``x`` is a new array of
    ``b``'s kind (a tensor views the solver's result without a copy). Stops when ``|r| <= max(atol, rtol |b|)``
    or after ``maxiter`` iterations (default 10 n), as cupyx's ``cg``. ``check_every``: iterations
    per CUDA graph replay, the host's one look at the stop flag; ``graph=False`` launches them one by
    one (the same kernels, for a backend that cannot be captured). The work vectors and the graph are
    made on the first solve and kept with the operator; new values (``update_values``) are written
    where the graph's SpMV reads them, so they stay valid.
    """
    from sparserl.kernels.contract import Op

    if op.op is not Op.SPMV:
        raise SparseRLError("cg needs an SpMV operator: tune with op='spmv'")
    m, n = op.shape
    if m != n:
        raise SparseRLError(f"cg needs a square matrix; this one is {m}x{n}")
    if not rtol >= 0 or (atol is not None and not atol >= 0):
        raise SparseRLError(f"rtol and atol must be >= 0 (got rtol={rtol}, atol={atol})")
    maxiter = 10 * n if maxiter is None else int(maxiter)
    if maxiter < 1:
        raise SparseRLError(f"maxiter must be at least 1 (got {maxiter})")
    maxiter = min(maxiter, INT32_MAX)  # the device counts in int32; 2^31 - 1 iterations is "unbounded"
    if check_every < 1:
        raise SparseRLError(f"check_every must be at least 1 (got {check_every})")
    cp = op._cp
    with cp.cuda.Device(op.device):
        b_in, x0_in = b, x0
        b = _vector(cp, b, n, "b")
        x0 = None if x0 is None else _vector(cp, x0, n, "x0")
        work = _workspace(op, cp, check_every, graph)
        caller = _caller_stream(cp, b_in, x0_in)
        with work.lock:  # one solve at a time on a workspace: its vectors and scalars are shared
            work.stream.wait_event(caller.record())  # b and x0 as the caller's work left them
            with work.stream:
                res = work.solve(b, x0, rtol, atol, maxiter)
            caller.wait_event(work.stream.record())  # the caller's next work sees x as the solve left it
        if type(b_in).__module__.startswith("torch"):  # a tensor in, a tensor out (a view of the result)
            import torch

            res = replace(res, x=torch.as_tensor(res.x, device=b_in.device))
        if res.info < 0:
            log.warning("cg stopped after %d iterations: p.q <= 0, so A is not positive definite", res.iterations)
        return res


_WORKSPACES = threading.Lock()


def _workspace(op, cp, check_every: int, graph: bool) -> "_Workspace":
    with _WORKSPACES:
        cache = op.__dict__.setdefault("_cg_workspaces", {})
        key = (check_every, graph)
        if key not in cache:
            cache[key] = _Workspace(op.backend, op.shape[0], cp, check_every, graph)
        return cache[key]


class _Workspace:
    """One operator's CG vectors, device scalars and captured iterations, kept between solves."""

    def __init__(self, backend, n: int, cp, check_every: int, graph: bool):
        self.cp, self.backend = cp, backend  # the backend, not the operator: no cycle keeps it alive
        self.lock = threading.Lock()
        self.n64 = np.int64(n)
        self.stream = cp.cuda.Stream(non_blocking=True)
        mod = _module(cp)
        self.dot, update = mod.get_function("cg_dot"), mod.get_function("cg_update")
        scalars, direction = mod.get_function("cg_scalars"), mod.get_function("cg_direction")
        sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
        self.grid, self.block = (max(1, min(4 * sms, (n + THREADS - 1) // THREADS)),), (THREADS,)
        with self.stream:
            self.x, self.r, self.p, self.q = (cp.zeros(n, dtype=cp.float32) for _ in range(4))
            self.s = cp.zeros(8, dtype=cp.float64)
            self.flags = cp.zeros(3, dtype=cp.int32)  # stop reason, iterations done, iteration limit
            spmv = backend.runner(self.p, self.q)
            grid, block, x, r, p, q, s, flags, n64 = (self.grid, self.block, self.x, self.r, self.p, self.q, self.s,
                                                      self.flags, self.n64)

            def iteration() -> None:
                spmv()
                self.dot(grid, block, (p, q, s, np.int32(PQ), flags, n64))
                update(grid, block, (x, r, p, q, s, flags, n64))
                scalars((1,), (1,), (s, flags))
                direction(grid, block, (p, r, s, flags, n64))

            self.replay, self.graph = _replayer(self.stream, iteration, check_every, graph)

    def solve(self, b, x0, rtol: float, atol: float | None, maxiter: int) -> CGResult:
        """One solve on the current stream (the workspace's); the host waits for it at the end."""
        cp, x, r, p, q, s, flags = self.cp, self.x, self.r, self.p, self.q, self.s, self.flags
        bnorm = float(cp.linalg.norm(b.astype(cp.float64)))  # in float64: a float32 norm of a large b is inf
        if not np.isfinite(bnorm) or (x0 is not None and not bool(cp.isfinite(x0).all())):
            raise SparseRLError(f"cg: {'b' if not np.isfinite(bnorm) else 'x0'} holds NaN or Inf values")
        tol = rtol * bnorm if atol is None else max(float(atol), rtol * bnorm)
        if bnorm == 0.0:
            return CGResult(cp.zeros_like(b), 0, 0, 0.0, tol, 0, False)
        if x0 is None:
            x.fill(0)
            cp.copyto(r, b)  # r = b - A 0
        else:
            cp.copyto(x, x0)
            self.backend.run(x, q)
            cp.subtract(b, q, out=r)  # r = b - A x0
        cp.copyto(p, r)
        s.fill(0)
        flags.set(np.array([RUNNING, 0, maxiter], dtype=np.int32))
        self.dot(self.grid, self.block, (r, r, s, np.int32(RHO), flags, self.n64))  # rho = r . r
        rho = float(s[RHO].get())
        if rho <= tol * tol:  # x0 solves it already (cupyx would divide 0 by 0 here)
            return CGResult(x.copy(), 0, 0, float(np.sqrt(rho)), tol, 0, False)
        s[ATOL2] = tol * tol
        replays = 0
        while True:
            self.replay()
            replays += 1
            done = flags.get()
            if done[STOP] != RUNNING:
                break
        stop, iters = int(done[STOP]), int(done[ITERS])
        rr = float(s[RHO if stop == BREAKDOWN else RR].get())  # a breakdown: the last r.r kept
        info = {CONVERGED: 0, MAXITER: iters, BREAKDOWN: -1}[stop]
        return CGResult(x.copy(), info, iters, float(np.sqrt(max(rr, 0.0))), tol, replays, self.graph)


def _replayer(stream, iteration, check_every: int, graph: bool):
    """(a function that runs ``check_every`` iterations on ``stream``, whether it replays a CUDA graph):
    the graph captured here, or the launches one by one when capture is off or the backend's
    launches cannot be captured."""

    def eager() -> None:
        for _ in range(check_every):
            iteration()

    if not graph:
        return eager, False
    stream.begin_capture()
    try:
        try:
            for _ in range(check_every):
                iteration()
        finally:
            g = stream.end_capture()  # also where a capture invalidated without a Python error shows
    except Exception as exc:  # noqa: BLE001 - a backend whose launches cannot be captured
        log.warning("cg: the SpMV could not be captured in a CUDA graph (%s); launching one by one", exc)
        return eager, False
    return (lambda: g.launch(stream)), True


def cg(op, b, x0=None, *, rtol: float = 1e-5, atol: float | None = None, maxiter: int | None = None,
       check_every: int = 16) -> tuple[Any, int]:
    """``(x, info)`` as ``cupyx.scipy.sparse.linalg.cg`` returns them; see :func:`solve_cg`."""
    res = solve_cg(op, b, x0, rtol=rtol, atol=atol, maxiter=maxiter, check_every=check_every)
    return res.x, res.info

"""End to end: what a tuned operator saves a user, tuning included, against cupyx and torch.sparse.

Every case runs on one GPU, the tuned operator beside its reference, on the wall clock (the GPU
synchronised before and after; median of ``--reps`` runs after one warm-up):

* **CG** (rtol 1e-8, float32 like the kernels) on SPD matrices: 3D Poisson on the stencil
  generator's structure, SuiteSparse Dubcova1 and bcsstk16, and an irregular one (the Laplacian of
  a symmetrised power-law graph, plus the identity). Ours is the operator's own solver
  (``op.cg``: the scalars on the device, the iterations replayed as a CUDA graph) on the tuned
  SpMV; the reference is ``cupyx.scipy.sparse.linalg.cg`` on a ``cupyx`` CSR matrix (cuSPARSE's
  SpMV). Beside them, to split the gain: our solver on cuSPARSE (``from_library``) and cupyx's cg
  on the tuned operator. Also **GMRES** (cupyx's, restart 20, rtol 1e-5) on the non-symmetric
  SuiteSparse BentPipe2D100, on the tuned operator against cuSPARSE.
* **GCN**, two layers (``relu(A (X W1))``, then ``A (H W2)``), k = 64 and 128, on a 1M-node
  power-law graph and on SuiteSparse soc-brightkite (both with self loops, symmetrically
  normalised), against ``torch.sparse.mm``: the forward pass and a training step (SGD on W1, W2; the
  backward through the tuned transpose), without and with new values before each step, each timed in
  pairs of runs, one of each system, for at least a second in all.

Reported per case: the solve / forward / step time, ours and the reference's; the first tune's
wall time (store lookup, search, compile, conversion) and a second tune's (a store hit: once with
the process's conversions kept, once with them dropped, as in a new process); the break-even
count (first tune's seconds over the time one solve or step saves); the time with the values
updated before every solve / step (``update_values``; the reference writes its CSR values or
builds its sparse tensor anew). A table of ``update_values`` against one SpMV per format follows
(the library kernel of each format on the 3D Poisson matrix).

Checked on every case: the operator's products on the final solution (and on each layer's input
and the backward's gradient) against the fp64 reference within the harness's tolerance, cuSPARSE's
likewise; both solutions' true relative residuals in fp64 and their difference; for GCN, the
outputs against torch.sparse. A failed check is printed and written, never hidden.

    python benchmarks/operator_e2e.py --quick --out $OUT/operator_e2e.json          # about 4 minutes
    python benchmarks/operator_e2e.py --out $OUT/operator_e2e.json                  # larger, budget 32

SuiteSparse matrices are read from ``--suitesparse`` (default: $SPARSERL_SUITESPARSE, the folder the
tests use, or .devdata/suitesparse); cases whose matrix is missing are skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparserl.errors import SparseRLError

log = logging.getLogger("operator_e2e")
REPO = Path(__file__).resolve().parents[1]
CG_RTOL, GMRES_RTOL, GMRES_RESTART = 1e-8, 1e-5, 20


# -- matrices -------------------------------------------------------------------------------------


def suitesparse_dir(given: str | None) -> Path | None:
    for d in ([given] if given else []) + [os.environ.get("SPARSERL_SUITESPARSE"),
                                           str(REPO.parent / "shared" / "matrices" / "suitesparse"),
                                           str(REPO / ".devdata" / "suitesparse")]:
        if d and Path(d).is_dir() and any(Path(d).glob("*.mtx.gz")):
            return Path(d)
    return None


def poisson3d(side: int) -> sp.csr_array:
    """The 3D Poisson matrix (7 points: 6 on the diagonal, -1 off it) on the stencil generator's structure."""
    from sparserl.matrices import generate

    A = generate("stencil3d_7", side**3, seed=0)
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    return sp.csr_array((np.where(rows == A.indices, 6.0, -1.0).astype(np.float32), A.indices, A.indptr),
                        shape=A.shape)


def symmetric_pattern(P) -> sp.csr_array:
    """The undirected graph of ``P``'s pattern, without self loops, weights 1."""
    C = sp.coo_array(P)
    rows, cols = np.concatenate([C.row, C.col]), np.concatenate([C.col, C.row])
    keep = rows != cols
    S = sp.csr_array((np.ones(int(keep.sum()), np.float32), (rows[keep], cols[keep])), shape=P.shape)
    S.sum_duplicates()
    S.data[:] = 1.0
    return S


def graph_laplacian_spd(nodes: int, degree: float) -> sp.csr_array:
    """L + I of a symmetrised power-law graph: irregular rows, symmetric positive definite."""
    from sparserl.matrices import canonicalize, generate

    S = symmetric_pattern(generate("powerlaw", nodes, seed=1, mean_degree=degree))
    deg = np.asarray(S.sum(axis=1)).ravel()
    return canonicalize((sp.diags_array(deg + 1.0) - S).astype(np.float32).tocsr())


def gcn_adjacency(P) -> sp.csr_array:
    """D^-1/2 (S + I) D^-1/2 of the undirected graph of ``P``: the GCN's normalised adjacency."""
    from sparserl.matrices import canonicalize

    S = symmetric_pattern(P) + sp.identity(P.shape[0], dtype=np.float32, format="csr")
    d = 1.0 / np.sqrt(np.asarray(S.sum(axis=1)).ravel())
    return canonicalize((sp.diags_array(d) @ S @ sp.diags_array(d)).astype(np.float32).tocsr())


def load(ss: Path | None, name: str):
    from sparserl.matrices import load_matrix

    if ss is None or not (ss / f"{name}.mtx.gz").exists():
        return None
    return load_matrix(ss / f"{name}.mtx.gz")


# -- timing -------------------------------------------------------------------------------------


def sync() -> None:
    import cupy as cp

    cp.cuda.runtime.deviceSynchronize()


def wall(fn, reps: int) -> float:
    """Median wall seconds of ``fn()`` over ``reps`` runs after one warm-up, the GPU idle at each end."""
    fn()
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


FORWARD_SECONDS = 1.0
"""Wall seconds of forward passes timed at least per GCN case (both systems together)."""


def wall_pair(first, second, reps: int, min_seconds: float = 0.0, max_reps: int = 5000) -> tuple[float, float]:
    """Median wall seconds of two functions timed in alternation (``reps`` runs each, after one
    warm-up each, and more until the runs timed add up to ``min_seconds``, at most ``max_reps``), the
    GPU idle at each end of every run. The floor in seconds keeps a pass of a fraction of a
    millisecond from being judged on a few milliseconds of a machine's jitter."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    while len(times[0]) < reps or (sum(times[0]) + sum(times[1]) < min_seconds and len(times[0]) < max_reps):
        for fn, out in ((first, times[0]), (second, times[1])):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - t)
    return float(np.median(times[0])), float(np.median(times[1]))


def per_call_us(fn, calls: int = 50) -> float:
    """Microseconds per call of ``fn`` enqueued back to back (launch overhead included), CUDA events."""
    import cupy as cp

    fn()
    sync()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1000.0 / calls


def break_even(tune_s: float, ours_s: float, ref_s: float) -> float | None:
    """Solves (or steps) after which tuning has paid for itself; None when ours is not faster."""
    saved = ref_s - ours_s
    return tune_s / saved if saved > 0 else None


# -- tuning ---------------------------------------------------------------------------------------


def tuned(A, op: str, k: int | None, args, ev, store, name: str, backward: bool = False) -> tuple:
    """(operator, first tune seconds, second tune seconds with conversions kept, and dropped)."""
    import sparserl
    from sparserl.operator import plans

    kw = dict(budget=args.budget, store=store, evaluator=ev, regime="warm", seconds=args.tune_seconds, name=name)
    t = time.perf_counter()
    first = sparserl.tune(A, op, k, backward=backward, **kw)
    first_s = time.perf_counter() - t
    print(f"  {first.report.line}", flush=True)
    t = time.perf_counter()
    sparserl.tune(A, op, k, **kw)
    again_kept = time.perf_counter() - t
    plans.forget()
    t = time.perf_counter()
    again = sparserl.tune(A, op, k, **kw)
    again_s = time.perf_counter() - t
    if again.report.searched:  # nothing verified the first time: the store had nothing to find
        print(f"  the second tune searched again: {again.report.line}", flush=True)
    print(f"  second tune: {again_kept:.2f} s (conversions kept), {again_s:.2f} s (dropped)", flush=True)
    return first, first_s, again_kept, again_s


def report_fields(op) -> dict:
    r = op.report
    return {"action": r.action, "line": r.line, "kernel": r.kernel, "format": op.format, "searched": r.searched,
            "stored_speedup": r.speedup, "kernel_us": r.time_us, "cusparse_us": r.cusparse_us}


# -- checks ---------------------------------------------------------------------------------------


def product_check(A, x, y) -> dict:
    """``y`` against ``A x`` in fp64 within the harness's tolerance (computed on the GPU)."""
    import cupy as cp

    from sparserl.harness.reference import Fp64Reference

    c = Fp64Reference(A, cp).compare(cp.ascontiguousarray(x), cp.ascontiguousarray(y))
    return {"ok": bool(c.ok), "max_scaled_error": c.max_scaled_error, "bad_rows": c.bad_rows}


def true_residual(A, b: np.ndarray, x) -> float:
    import cupy as cp

    x64 = cp.asnumpy(x).astype(np.float64)
    return float(np.linalg.norm(b.astype(np.float64) - A.astype(np.float64) @ x64) / np.linalg.norm(b))


# -- solver cases ---------------------------------------------------------------------------------


def solver_case(kind: str, name: str, A, args, ev, store) -> dict:
    import cupy as cp
    import cupyx.scipy.sparse as csp
    from cupyx.scipy.sparse import linalg as cla

    n = A.shape[0]
    print(f"{kind} {name}: {n} rows, {A.nnz} nonzeros", flush=True)
    op, tune_s, retune_kept, retune_s = tuned(A, "spmv", None, args, ev, store, name)
    b_host = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    b = cp.asarray(b_host)
    ref = csp.csr_matrix(A)
    lin = op.as_linear_operator()
    maxiter = args.maxiter

    def solve(M):
        if kind == "cg":
            return cla.cg(M, b, rtol=CG_RTOL, maxiter=maxiter)
        return cla.gmres(M, b, rtol=GMRES_RTOL, restart=GMRES_RESTART, maxiter=maxiter)

    def iterations(M) -> int:
        count = [0]
        if kind == "cg":
            cla.cg(M, b, rtol=CG_RTOL, maxiter=maxiter, callback=lambda xk: count.__setitem__(0, count[0] + 1))
            return count[0]
        cla.gmres(M, b, rtol=GMRES_RTOL, restart=GMRES_RESTART, maxiter=maxiter,
                  callback=lambda r: count.__setitem__(0, count[0] + 1), callback_type="pr_norm")
        return count[0] * GMRES_RESTART

    # CG: ours is the operator's own solver (sparserl.operator.solvers: scalars on the device, iterations
    # replayed as a CUDA graph); beside it the same solver on cuSPARSE, and cupyx's cg on our operator,
    # so the table says what the solver buys and what the tuned SpMV buys
    fused = kind == "cg"
    lib = None
    if fused:
        from sparserl.operator import from_library, solve_cg

        lib = from_library(A)

        def ours(o=None):
            res = solve_cg(o or op, b, rtol=CG_RTOL, maxiter=maxiter)
            return res.x, res.info
    else:
        def ours(o=None):
            return solve(lin)

    x_ours, info_ours = ours()
    x_ref, info_ref = solve(ref)
    at_solution = product_check(A, x_ours, op.matvec(x_ours))
    its_ours = solve_cg(op, b, rtol=CG_RTOL, maxiter=maxiter).iterations if fused else iterations(lin)
    its_ref = iterations(ref)
    ours_s, ref_s = wall(ours, args.reps), wall(lambda: solve(ref), args.reps)
    parts = {}
    if fused:
        x_lib, _ = ours(lib)
        parts = {"solver_on_cusparse_s": wall(lambda: ours(lib), args.reps),
                 "cupyx_on_tuned_s": wall(lambda: solve(lin), args.reps),
                 "iterations_solver_on_cusparse": solve_cg(lib, b, rtol=CG_RTOL, maxiter=maxiter).iterations,
                 "true_residual_solver_on_cusparse": true_residual(A, b_host, x_lib)}
        parts["solver_speedup"] = ref_s / parts["solver_on_cusparse_s"]
        parts["spmv_speedup_in_solver"] = parts["solver_on_cusparse_s"] / ours_s
    # values updated before every solve (a Newton or time step): new values, same structure
    values = [cp.asarray(A.data * np.float32(1.0 + 0.01 * (i + 1))) for i in range(2)]
    turn = [0]

    def updated(solver, update):
        update(values[turn[0] % 2])
        turn[0] += 1
        return solver()

    ours_upd = wall(lambda: updated(ours, op.update_values), args.reps)
    ref_upd = wall(lambda: updated(lambda: solve(ref), lambda v: cp.copyto(ref.data, v)), args.reps)
    last = values[0]  # both set to known values for the checks
    op.update_values(last)
    cp.copyto(ref.data, last)
    A_last = sp.csr_array((cp.asnumpy(last), A.indices, A.indptr), shape=A.shape)
    x_last, _ = ours()
    y = cp.empty(n, dtype=cp.float32)
    spmv_us = per_call_us(lambda: op.matvec(x_last, out=y))
    update_us = per_call_us(lambda: op.update_values(last))
    checks = {
        "spmv_at_solution": at_solution,
        "spmv_after_updates": product_check(A_last, x_last, op.matvec(x_last)),
        "cusparse_spmv": product_check(A_last, x_last, ref @ x_last),
        "true_residual_ours": true_residual(A, b_host, x_ours),
        "true_residual_ref": true_residual(A, b_host, x_ref),
        "solution_difference": float(cp.linalg.norm(x_ours - x_ref) / cp.linalg.norm(x_ref)),
        "converged_ours": int(info_ours) == 0, "converged_ref": int(info_ref) == 0,
    }
    checks["ok"] = checks["spmv_at_solution"]["ok"] and checks["spmv_after_updates"]["ok"]
    if fused:  # the solver must converge where cupyx does, to a solution as good
        checks["ok"] = checks["ok"] and (checks["converged_ours"] or not checks["converged_ref"]) and (
            checks["true_residual_ours"] <= max(10 * checks["true_residual_ref"], 10 * CG_RTOL))
    row = {"case": kind, "matrix": name, "rows": n, "nnz": int(A.nnz), "op": "spmv", "k": None,
           "solver": "sparserl cg (CUDA graph)" if fused else "cupyx",
           **report_fields(op), "tune_s": tune_s, "retune_s": retune_s, "retune_same_process_s": retune_kept,
           "iterations_ours": its_ours, "iterations_ref": its_ref,
           "ours_s": ours_s, "ref_s": ref_s, "speedup": ref_s / ours_s, "break_even": break_even(tune_s, ours_s, ref_s),
           **parts,
           "ours_updated_s": ours_upd, "ref_updated_s": ref_upd, "speedup_updated": ref_upd / ours_upd,
           "update_us": update_us, "spmv_us": spmv_us, "update_over_spmv": update_us / spmv_us, "checks": checks}
    if lib is not None:
        lib.close()
    op.close()
    return row


# -- GCN ------------------------------------------------------------------------------------------


def torch_adjacency(torch, A, layout: str):
    if layout == "csr":
        return torch.sparse_csr_tensor(torch.as_tensor(A.indptr, dtype=torch.int64),
                                       torch.as_tensor(A.indices, dtype=torch.int64), torch.as_tensor(A.data),
                                       size=A.shape, device="cuda")
    coo = A.tocoo()
    idx = torch.as_tensor(np.vstack([coo.row, coo.col]).astype(np.int64))
    return torch.sparse_coo_tensor(idx, torch.as_tensor(coo.data), size=A.shape, device="cuda").coalesce()


def reference_layout(torch, A) -> str:
    """CSR when torch.sparse.mm differentiates through it here (cuSPARSE's faster path), else COO."""
    At = torch_adjacency(torch, A, "csr")
    try:
        X = torch.ones(A.shape[1], 2, device="cuda", requires_grad=True)
        torch.sparse.mm(At, X).sum().backward()
        return "csr"
    except (RuntimeError, NotImplementedError) as exc:
        log.warning("torch.sparse.mm has no CSR backward here (%s): the reference uses COO", str(exc)[:120])
        return "coo"


def gcn_case(name: str, A, k: int, args, ev, store) -> dict:
    import cupy as cp
    import torch

    print(f"gcn {name}: {A.shape[0]} nodes, {A.nnz} nonzeros, k={k}", flush=True)
    op, tune_s, retune_kept, retune_s = tuned(A, "spmm", k, args, ev, store, name, backward=True)
    layout = reference_layout(torch, A)
    At = torch_adjacency(torch, A, layout)
    g = torch.Generator(device="cuda").manual_seed(0)
    X = torch.randn(A.shape[1], k, device="cuda", generator=g)
    W1 = (torch.randn(k, k, device="cuda", generator=g) / math.sqrt(k)).requires_grad_()
    W2 = (torch.randn(k, k, device="cuda", generator=g) / math.sqrt(k)).requires_grad_()
    opt = torch.optim.SGD([W1, W2], lr=1e-3)
    ours_mm, ref_mm = op.matmat, (lambda Y: torch.sparse.mm(At, Y))

    def forward(mm):
        return mm(torch.relu(mm(X @ W1)) @ W2)

    def step(mm):
        opt.zero_grad(set_to_none=True)
        forward(mm).square().mean().backward()
        opt.step()

    with torch.no_grad():
        # a forward is a few milliseconds or less: more runs than a solve gets (at least 21 pairs and
        # FORWARD_SECONDS of them), alternating the two systems so that a drift of the machine falls on both
        ours_fwd, ref_fwd = wall_pair(lambda: forward(ours_mm), lambda: forward(ref_mm), max(args.reps, 21),
                                      min_seconds=FORWARD_SECONDS)
        out_ours, out_ref = forward(ours_mm), forward(ref_mm)
    # a step is a few milliseconds: timed like the forward, in alternation and for at least FORWARD_SECONDS
    ours_step, ref_step = wall_pair(lambda: step(ours_mm), lambda: step(ref_mm), max(args.reps, 21),
                                    min_seconds=FORWARD_SECONDS)
    # learned edge weights: new values before every step
    weights = [torch.as_tensor(A.data * np.float32(1.0 + 0.01 * (i + 1)), device="cuda") for i in range(2)]
    turn = [0]

    def step_updated(ours: bool):
        nonlocal At
        w = weights[turn[0] % 2]
        turn[0] += 1
        if ours:
            op.update_values(w)
            step(ours_mm)
        else:
            if layout == "csr":
                At = torch.sparse_csr_tensor(At.crow_indices(), At.col_indices(), w, size=A.shape)
            else:  # coalesced COO of a canonical CSR matrix keeps the CSR order of the values
                At = torch.sparse_coo_tensor(At.indices(), w, size=A.shape, is_coalesced=True)
            step(ref_mm)

    ours_upd, ref_upd = wall_pair(lambda: step_updated(True), lambda: step_updated(False), max(args.reps, 21),
                                  min_seconds=FORWARD_SECONDS)
    last = weights[0]  # the operator (and its transpose) set to known values for the checks
    op.update_values(last)
    A_last = sp.csr_array((last.cpu().numpy(), A.indices, A.indptr), shape=A.shape)
    Z = (X @ W1).detach()
    G = torch.randn(A.shape[0], k, device="cuda", generator=g)
    Zc, Gc = cp.asarray(Z), cp.asarray(G)
    spmm_us = per_call_us(lambda: op.matmat(Zc))
    with torch.no_grad():  # one product from torch, ours and the reference's (host path included)
        torch_call_us = per_call_us(lambda: op.matmat(Z))
        ref_call_us = per_call_us(lambda: torch.sparse.mm(At, Z))
    update_us = per_call_us(lambda: op.update_values(last))
    diff = float((out_ours - out_ref).abs().max() / out_ref.abs().max().clamp_min(1e-30))
    Y = op.matmat(Z)
    checks = {"spmm_forward": product_check(A_last, Zc, cp.asarray(Y)),
              "spmm_transpose": product_check(sp.csr_array(A_last.T), Gc, op.transpose().matmat(Gc)),
              "output_vs_torch_max_rel": diff}
    checks["ok"] = checks["spmm_forward"]["ok"] and checks["spmm_transpose"]["ok"] and diff < 1e-3
    row = {"case": "gcn", "matrix": name, "rows": A.shape[0], "nnz": int(A.nnz), "op": "spmm", "k": k,
           **report_fields(op), "transpose": op.transpose().report.line, "reference_layout": layout,
           "tune_s": tune_s, "retune_s": retune_s, "retune_same_process_s": retune_kept,
           "ours_s": ours_fwd, "ref_s": ref_fwd, "speedup": ref_fwd / ours_fwd,
           "break_even": break_even(tune_s, ours_fwd, ref_fwd),
           "step_ours_s": ours_step, "step_ref_s": ref_step, "step_speedup": ref_step / ours_step,
           "step_break_even": break_even(tune_s, ours_step, ref_step),
           "ours_updated_s": ours_upd, "ref_updated_s": ref_upd, "speedup_updated": ref_upd / ours_upd,
           "update_us": update_us, "spmv_us": spmm_us, "update_over_spmv": update_us / spmm_us,
           "torch_call_us": torch_call_us, "ref_call_us": ref_call_us, "checks": checks}
    print(f"  one SpMM: {spmm_us:.1f} us from CuPy, {torch_call_us:.1f} us from torch; torch.sparse.mm "
          f"{ref_call_us:.1f} us", flush=True)
    op.close()
    return row


# -- update_values per format ---------------------------------------------------------------------


def update_table(A) -> list[dict]:
    """``update_values`` against one product of each format's library kernel, on one matrix."""
    import cupy as cp

    from sparserl.kernels.library import variants
    from sparserl.operator import from_kernel

    rows = []
    x = cp.asarray(np.random.default_rng(0).standard_normal(A.shape[1]).astype(np.float32))
    y = cp.empty(A.shape[0], dtype=cp.float32)
    v = cp.asarray(A.data * np.float32(1.5))
    for fmt in ("CSR", "COO", "ELL", "SELL", "DIA", "BSR", "HYB"):
        try:
            op = from_kernel(A, variants("spmv", fmt)[0].render(), "spmv")
        except SparseRLError as exc:
            rows.append({"format": fmt, "error": str(exc)})
            continue
        spmv = per_call_us(lambda: op.matvec(x, out=y))
        upd = per_call_us(lambda: op.update_values(v))
        B = sp.csr_array((A.data * np.float32(1.5), A.indices, A.indptr), shape=A.shape)
        rows.append({"format": fmt, "kernel": op.format, "spmv_us": spmv, "update_us": upd, "ratio": upd / spmv,
                     "keeps_csr_order": fmt in ("CSR", "COO", "ELL", "SELL"),
                     "check": product_check(B, x, op.matvec(x))})
        op.close()
    return rows


# -- output ---------------------------------------------------------------------------------------


def fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def table(rows: list[dict]) -> str:
    head = ("| case | matrix | nnz | k | tuned | tune | 2nd tune | ours | ref | speedup | break-even | "
            "step ours/ref (x) | updated every iter ours/ref (x) | update/SpMV | checks |")
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        be = r.get("break_even")
        step = (f"{fmt_s(r['step_ours_s'])} / {fmt_s(r['step_ref_s'])} ({r['step_speedup']:.2f})"
                if "step_ours_s" in r else "-")
        out.append(
            f"| {r['case']} | {r['matrix']} | {r['nnz']} | {r['k'] or '-'} | {r['action']}: {r['format']} | "
            f"{fmt_s(r['tune_s'])} | {fmt_s(r['retune_s'])} | {fmt_s(r['ours_s'])} | {fmt_s(r['ref_s'])} | "
            f"{r['speedup']:.2f}x | {'never' if be is None else f'{be:.0f}'} | {step} | "
            f"{fmt_s(r['ours_updated_s'])} / {fmt_s(r['ref_updated_s'])} ({r['speedup_updated']:.2f}) | "
            f"{r['update_over_spmv']:.2f} | {'ok' if r['checks']['ok'] else 'FAILED'} |")
    return "\n".join(out)


def cg_lines(rows: list[dict]) -> str:
    """Where a CG solve's time goes: cupyx's cg and ours, each on cuSPARSE and on the tuned SpMV."""
    head = ("| matrix | iterations ours / cupyx | cupyx cg, cuSPARSE (ref) | cupyx cg, tuned SpMV | our cg, cuSPARSE | "
            "our cg, tuned SpMV | total | solver's part | SpMV's part |")
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        if "solver_on_cusparse_s" not in r:
            continue
        out.append(f"| {r['matrix']} | {r['iterations_ours']} / {r['iterations_ref']} | {fmt_s(r['ref_s'])} | "
                   f"{fmt_s(r['cupyx_on_tuned_s'])} | {fmt_s(r['solver_on_cusparse_s'])} | {fmt_s(r['ours_s'])} | "
                   f"{r['speedup']:.2f}x | {r['solver_speedup']:.2f}x | {r['spmv_speedup_in_solver']:.2f}x |")
    return "\n".join(out)


def update_lines(rows: list[dict]) -> str:
    out = ["| format | SpMV (us) | update_values (us) | ratio | keeps CSR order | check |", "|" + " --- |" * 6]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['format']} | - | - | - | - | {r['error']} |")
            continue
        out.append(f"| {r['format']} | {r['spmv_us']:.1f} | {r['update_us']:.1f} | {r['ratio']:.2f} | "
                   f"{'yes' if r['keeps_csr_order'] else 'no'} | {'ok' if r['check']['ok'] else 'FAILED'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="small budgets and sizes: about 4 minutes on one H200")
    ap.add_argument("--budget", type=int, help="candidates per tune (default 8 quick, 32 full)")
    ap.add_argument("--tune-seconds", type=float, help="stop each search after this many seconds (default 20 quick)")
    ap.add_argument("--reps", type=int, help="timed runs per measurement (default 3 quick, 7 full)")
    ap.add_argument("--maxiter", type=int, default=5000, help="solver iteration limit")
    ap.add_argument("--cases", default="cg,gmres,gcn,updates", help="comma-separated: cg, gmres, gcn, updates")
    ap.add_argument("--suitesparse", help="folder of SuiteSparse .mtx.gz files")
    ap.add_argument("--store", help="best-known store (default: a fresh one in a temporary folder)")
    args = ap.parse_args(argv)
    args.budget = args.budget or (8 if args.quick else 32)
    args.tune_seconds = args.tune_seconds or (20.0 if args.quick else None)
    args.reps = args.reps or (3 if args.quick else 7)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        from sparserl.harness.device import cupy_module

        cp = cupy_module()
    except SparseRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.matrices import generate

    cases = set(args.cases.split(","))
    ss = suitesparse_dir(args.suitesparse)
    if ss is None:
        print("no SuiteSparse folder found: its cases are skipped", flush=True)
    side, irregular, gcn_nodes, gcn_degree = (48, 200_000, 1_000_000, 4) if args.quick else (100, 1_000_000,
                                                                                               1_000_000, 10)
    tmp = tempfile.TemporaryDirectory(prefix="operator_e2e_")
    store = args.store or str(Path(tmp.name) / "best_known.sqlite")
    gpu = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    result = {"gpu": gpu, "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "sizes": {"poisson_side": side, "irregular_nodes": irregular, "gcn_nodes": gcn_nodes,
                        "gcn_mean_degree": gcn_degree},
              "cases": [], "updates": [], "skipped": []}
    t0 = time.perf_counter()

    def save() -> None:
        result["seconds"] = time.perf_counter() - t0
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))

    ev = Evaluator(HarnessConfig(regimes=("warm",), reward_regime="warm", cache_dir=str(Path(tmp.name) / "cache")))
    try:
        plan: list[tuple] = []
        if "cg" in cases:
            plan += [("cg", f"poisson3d_{side}", lambda: poisson3d(side)),
                     ("cg", "Dubcova1", lambda: load(ss, "Dubcova1")), ("cg", "bcsstk16", lambda: load(ss, "bcsstk16")),
                     ("cg", f"laplacian_powerlaw_{irregular}", lambda: graph_laplacian_spd(irregular, 8))]
        if "gmres" in cases:
            plan.append(("gmres", "BentPipe2D100", lambda: load(ss, "BentPipe2D100")))
        for kind, name, make in plan:
            A = make()
            if A is None:
                result["skipped"].append(f"{kind} {name}: matrix not found")
                continue
            result["cases"].append(solver_case(kind, name, A, args, ev, store))
            save()
        if "gcn" in cases:
            graphs = [(f"powerlaw_{gcn_nodes}", lambda: gcn_adjacency(generate("powerlaw", gcn_nodes, seed=2,
                                                                                mean_degree=gcn_degree))),
                      ("soc-brightkite", lambda: (lambda P: None if P is None else gcn_adjacency(P))(
                          load(ss, "soc-brightkite")))]
            for name, make in graphs:
                A = make()
                if A is None:
                    result["skipped"].append(f"gcn {name}: matrix not found")
                    continue
                for k in (64, 128):
                    result["cases"].append(gcn_case(name, A, k, args, ev, store))
                    save()
        if "updates" in cases:
            result["updates"] = update_table(poisson3d(side))
            save()
    finally:
        ev.close()
        save()
    print()
    print(table(result["cases"]))
    if any("solver_on_cusparse_s" in r for r in result["cases"]):
        print("\nCG, where the time goes (solve times; total = ref / ours = solver's part x SpMV's part):")
        print(cg_lines(result["cases"]))
    if result["updates"]:
        print()
        print(f"update_values against one SpMV, library kernel per format, poisson3d_{side}:")
        print(update_lines(result["updates"]))
    for s in result["skipped"]:
        print(f"skipped: {s}")
    print(f"\n{len(result['cases'])} cases in {result['seconds']:.0f} s; JSON in {args.out}")
    return 0 if all(r["checks"]["ok"] for r in result["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())

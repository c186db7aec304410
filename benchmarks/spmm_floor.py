"""The memory floor of SpMM on the GCN benchmark's 1M-node power-law graph, beside the library's SpMM
kernel and cuSPARSE.

What no SpMM kernel of this design can beat on a graph whose columns are nearly random: the rows of X
that the nonzeros name, gathered in the matrix's order with nothing computed and nothing written
(one float per lane group keeps the loads), plus one write of Y. Printed beside it: the same gather
reading the row and value arrays too and multiplying the values in (what the kernel reads; the rest of
its time is its writes of Y), a plain device copy's bandwidth, cuSPARSE's SpMM and the library's
COO-runs kernel with Y zeroed by a memset before it (both as operators, ``from_library`` and
``from_kernel``), each as a ratio to the floor; and the same walk with Y not zeroed
(``coo_runs_stored``, ``FORMAT: COO zero_y=0``: no memset of Y before it) at the library's points (64,
128 and 256 nonzeros a group in blocks of 256, and at 32 lanes 1024 in blocks of 128; ``--nzpg`` and
``--block``: any counts in one block size, the library's body under its PARAMS line with those
numbers), each run on a NaN-filled Y and compared with cuSPARSE's result (largest error over the
largest entry; a row it never wrote would be NaN).

    python benchmarks/spmm_floor.py --out floor.json            # one H200: about 20 s
    python benchmarks/spmm_floor.py --ks 128 --nzpg 256,1024,2048,4096 --block 128 --out sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

_GATHER = r"""
extern "C" __global__ void __launch_bounds__(256) gather(int nnz, int k, const int* __restrict__ row_idx,
    const int* __restrict__ col_idx, const float* __restrict__ val, const float* __restrict__ X,
    float* __restrict__ sink)
{
    // G lanes per group, NZ nonzeros a group, 4 columns a lane: the COO-runs kernel's loads, no output.
    // FULL 0: the column array and the rows of X only (the floor); FULL 1: also the row and value arrays,
    // each value multiplied in, as the kernel reads them (what the kernel adds above this is its writes)
    const int lane = threadIdx.x & (G - 1);
    const long long j0 = ((long long)blockIdx.x * (256 / G) + threadIdx.x / G) * NZ;
    if (j0 >= nnz) return;
    const int j1 = (int)min(j0 + NZ, (long long)nnz);
    const unsigned gmask = G == 32 ? 0xffffffffu : (((1u << G) - 1) << ((threadIdx.x & 31) & ~(G - 1)));
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    int rows = 0;
    for (int base = (int)j0; base < j1; base += G) {
        const int j = base + lane;
        const int my_c = j < j1 ? __ldg(col_idx + j) : 0;
#if FULL
        const float my_v = j < j1 ? __ldg(val + j) : 0.f;
        rows ^= j < j1 ? __ldg(row_idx + j) : 0;
#endif
        const int cnt = min(G, j1 - base);
        for (int t = 0; t < cnt; t += 8) {
            float4 xv[8];
            #pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int c = __shfl_sync(gmask, my_c, (t + u) & (G - 1), G);
                xv[u] = t + u < cnt ? __ldg(reinterpret_cast<const float4*>(X + (size_t)c * k + lane * 4))
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            #pragma unroll
            for (int u = 0; u < 8; ++u) {
#if FULL
                const float a = __shfl_sync(gmask, my_v, (t + u) & (G - 1), G);
#else
                const float a = 1.f;
#endif
                acc.x = fmaf(a, xv[u].x, acc.x); acc.y = fmaf(a, xv[u].y, acc.y);
                acc.z = fmaf(a, xv[u].z, acc.z); acc.w = fmaf(a, xv[u].w, acc.w);
            }
        }
    }
    if (acc.x + acc.y + acc.z + acc.w == 12345.f || rows == -12345) sink[0] = 1.f;  // keeps the loads
}
"""


def gather_source(k: int, full: bool) -> str:
    """The gather kernel for ``k`` columns (k / 4 lanes a group, 128 nonzeros a group); ``full``: with the
    row and value arrays read and the values multiplied in."""
    return f"#define G {k // 4}\n#define NZ 128\n#define FULL {int(full)}\n" + _GATHER


KS = (8, 16, 32, 64, 128)
"""Column counts measured: 4 columns a lane and a power-of-two lane group (k / 4 lanes, 2 to 32)."""


def stored_kernels(k: int, points=None) -> list[tuple[str, str]]:
    """(name, kernel text) of the ``coo_runs_stored`` kernels timed at ``k``: 4 columns a lane, the
    selector's lanes per group, each (entries a group, threads a block) in ``points`` (default: the
    library's points at those lanes): the library's body under its PARAMS line with those numbers (the
    body reads them by name)."""
    from sparserl.kernels.library import all_variants, get_variant
    from sparserl.request.library import spmm_lanes

    g = spmm_lanes(k)
    if points is None:
        points = [(v.t("nzpg"), v.t("block")) for v in all_variants()
                  if v.strategy == "coo_runs_stored" and v.t("g") == g and v.t("vec") == 4]
    base = get_variant(f"spmm/coo_runs_stored/zero_y=0/g={g},vec=4,nzpg=256,block=256").render()
    line = f"PARAMS: G={g}, VEC=4, NZPG=256, BLOCK=256"
    assert line in base, base[:200]
    return [(f"spmm/coo_runs_stored/zero_y=0/g={g},vec=4,nzpg={n},block={b}",
             base.replace(line, f"PARAMS: G={g}, VEC=4, NZPG={n}, BLOCK={b}")) for n, b in points]


def measure(A, k: int, points=None) -> dict:
    """Floor, copy bandwidth, cuSPARSE and the library kernel for ``A`` at ``k`` columns (one of :data:`KS`)."""
    import cupy as cp

    from operator_e2e import per_call_us  # calls back to back between two events

    from sparserl.kernels.library import get_variant
    from sparserl.operator import from_kernel, from_library
    from sparserl.request.library import spmm_lanes

    g = k // 4
    m = A.shape[0]
    ci = cp.asarray(A.indices.astype(np.int32))
    ri = cp.asarray(np.repeat(np.arange(m, dtype=np.int32), np.diff(A.indptr)))
    vals = cp.asarray(A.data.astype(np.float32))
    X = cp.random.default_rng(0).standard_normal((A.shape[1], k), dtype=cp.float32)
    Y = cp.empty((m, k), dtype=cp.float32)
    sink = cp.zeros(1, dtype=cp.float32)
    grid = (A.nnz + 128 * (256 // g) - 1) // (128 * (256 // g))
    args = (np.int32(A.nnz), np.int32(k), ri, ci, vals, X, sink)
    gather_us, gather_full_us = (
        per_call_us(lambda kern=cp.RawModule(code=gather_source(k, full)).get_function("gather"):
                    kern((grid,), (256,), args))
        for full in (False, True))
    write_us = per_call_us(lambda: Y.fill(0))
    copy_us = per_call_us(lambda: cp.copyto(Y, X[:m]))
    lib = from_library(A, "spmm", k)
    cusparse_us = per_call_us(lambda: lib.matmat(X, out=Y))
    vid = f"spmm/coo_runs/-/g={spmm_lanes(k)},vec=4,nzpg=64,block=256"  # the walk with Y zeroed by a memset first
    ours = from_kernel(A, get_variant(vid).render(), "spmm", k)
    kernel_us = per_call_us(lambda: ours.matmat(X, out=Y))
    ref = cp.empty_like(Y)
    lib.matmat(X, out=ref)
    scale = float(cp.abs(ref).max()) or 1.0
    stored = []  # the same walk with Y not zeroed (FORMAT: COO zero_y=0): no memset of Y before it
    for sid, text in stored_kernels(k, points):
        op = from_kernel(A, text, "spmm", k)
        out = cp.full_like(Y, cp.nan)  # a row the kernel never writes stays NaN
        op.matmat(X, out=out)
        err = float(cp.abs(out - ref).max()) / scale
        stored.append({"kernel": sid, "us": per_call_us(lambda: op.matmat(X, out=out)),
                       "max_error_over_max_y": err if err == err else None})  # NaN: rows left unwritten
        op.close()
    lib.close()
    ours.close()
    floor = gather_us + write_us
    gathered = A.nnz * k * 4
    return {"k": k, "gather_us": gather_us, "gather_full_us": gather_full_us, "write_y_us": write_us, "floor_us": floor,
            "gather_GBps": gathered / gather_us / 1e3, "copy_GBps": 2 * Y.nbytes / copy_us / 1e3,
            "cusparse_us": cusparse_us, "kernel": vid, "kernel_us": kernel_us,
            "floor_over_kernel": floor / kernel_us, "floor_over_cusparse": floor / cusparse_us,
            "kernel_speedup": cusparse_us / kernel_us, "stored": stored,
            "stored_speedup": cusparse_us / min(r["us"] for r in stored)}


def _short(vid: str) -> str:
    """``32,4,256,256`` for a ``coo_runs_stored`` variant id: its lanes, columns a lane, entries a group and
    threads a block."""
    p = dict(kv.split("=") for kv in vid.rsplit("/", 1)[1].split(","))
    return f"{p['g']},{p['vec']},{p['nzpg']},{p['block']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="JSON file to write")
    ap.add_argument("--nodes", type=int, default=1_000_000, help="nodes of the power-law graph")
    ap.add_argument("--ks", default="64,128", help=f"comma-separated column counts, each one of {', '.join(map(str, KS))}")
    ap.add_argument("--nzpg", help="comma-separated entries a group of the Y-unzeroed kernels timed (1-65536), all "
                    "in blocks of --block (default: the library's points)")
    ap.add_argument("--block", type=int, default=256, choices=(128, 256, 512), help="threads a block with --nzpg")
    args = ap.parse_args(argv)
    try:
        ks = [int(v) for v in args.ks.split(",")]
        points = None  # the library's
        if args.nzpg is not None:
            points = [(int(v), args.block) for v in args.nzpg.split(",")]
            if not points or any(not 1 <= n <= 65536 for n, _ in points):
                raise ValueError(f"--nzpg: counts from 1 to 65536, got {args.nzpg}")
        if not ks or any(k not in KS for k in ks):
            raise ValueError(f"each k one of {', '.join(map(str, KS))} (4 columns a lane, 2-32 lanes), got {args.ks}")
        import cupy  # noqa: F401
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise ImportError
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception:  # no CuPy, or no device
        print("error: no NVIDIA GPU here (with CuPy): the floor is a GPU measurement", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from operator_e2e import gcn_adjacency

    from sparserl.matrices import generate

    A = gcn_adjacency(generate("powerlaw", args.nodes, seed=2, mean_degree=4))
    rows = [measure(A, k, points) for k in ks]
    print(f"powerlaw_{args.nodes}: {A.nnz} nonzeros")
    print("| k | gather | + rows, values | write Y | floor | copy GB/s | cuSPARSE | library kernel | floor / kernel "
          "| kernel vs cuSPARSE | Y unzeroed (g, vec, nzpg, block) | its best vs cuSPARSE |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        st = " / ".join(_short(x["kernel"]) + f" {x['us']:.0f} us" + ("" if x["max_error_over_max_y"] is not None
                                               and x["max_error_over_max_y"] < 1e-4 else " (WRONG)")
                        for x in r["stored"])
        print(f"| {r['k']} | {r['gather_us']:.0f} us | {r['gather_full_us']:.0f} us | {r['write_y_us']:.0f} us | "
              f"{r['floor_us']:.0f} us | "
              f"{r['copy_GBps']:.0f} | {r['cusparse_us']:.0f} us | {r['kernel_us']:.0f} us | "
              f"{r['floor_over_kernel']:.2f} | {r['kernel_speedup']:.2f}x | {st} | {r['stored_speedup']:.2f}x |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"matrix": f"powerlaw_{args.nodes}", "nnz": int(A.nnz), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

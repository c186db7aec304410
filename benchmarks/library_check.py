"""Run every reference-library variant on a GPU through the harness's verification.

For each matrix (a few per generator family, awkward shapes included, plus real SuiteSparse
matrices if a folder is given) and each variant, it compiles the kernel (NVRTC or nvcc, cached;
the compiled code must pass the PTX checks), converts the matrix to the variant's format and
runs the worker's own verification in this process (sparserl.harness.verify.Verifier on a
sparserl.harness.resident.ResidentMatrix): seven inputs with NaN-poisoned outputs and guards on both
sides of x and y, inputs and matrix unchanged, the determinism re-run, and three inputs on the same
pattern with fresh random values, all against the fp64 reference under the documented
tolerance. No timing. Conversions a format refuses (e.g. DIA on a random matrix) are counted as
"refused", not as failures.

    python benchmarks/library_check.py --out results/library_check.json \
        [--suitesparse DIR] [--ops spmv,spmm] [--k 8,32,5] [--strategies csr_adaptive,csr_lanes]
    python benchmarks/library_check.py --ops spmv --families arrow,dense_lines,lp,circuit --family-rows 1000000

Prints a table per (op, format, strategy) and exits non-zero if any variant fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from sparserl.harness.compile import CompileOptions, compile_many
from sparserl.harness.device import cupy_module, device_arch, num_sms
from sparserl.harness.launcher import BoundKernel
from sparserl.harness.resident import ResidentMatrix
from sparserl.harness.result import ErrorKind
from sparserl.harness.verify import Target, VerifyConfig
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import all_variants
from sparserl.matrices import canonicalize, generate, load_matrix

log = logging.getLogger("library_check")

# (name, family, rows, params): small enough to run ~100 variants each in seconds,
# shaped to hit edge cases (sizes not multiples of blocks/slices/warps, empty rows,
# a dense row, rectangular both ways).
MATRICES = [
    ("diagonal_1001", "diagonal", 1001, {}),
    ("banded9_20011", "banded", 20011, {"bands": 9}),
    ("stencil2d_10k", "stencil2d", 10000, {}),
    ("stencil3d7_27k", "stencil3d_7", 27000, {}),
    ("stencil3d27_8k", "stencil3d_27", 8000, {}),
    ("block8_1003", "block", 1003, {"block": 8, "blocks_per_row": 3}),
    ("block4_4096", "block", 4096, {"block": 4, "blocks_per_row": 6}),
    ("random16_5003", "random", 5003, {"nnz_per_row": 16}),
    ("powerlaw_20k", "powerlaw", 20000, {}),
    ("skewed_10k", "skewed", 10000, {}),
    ("empty_rows_5k", "empty_rows", 5000, {}),
    ("rect_wide_3k", "rectangular", 3001, {"cols": 7001}),
    ("rect_tall_7k", "rectangular", 7001, {"cols": 3001}),
    ("single_row", "random", 1, {"nnz_per_row": 40}),
    ("dense_lines_6k", "dense_lines", 6007, {}),
    ("rmat_16k", "rmat", 16384, {}),
]


def dense_row_matrix(rows: int = 3000, seed: int = 7):
    """A sparse matrix with one completely dense row (and a few empty ones)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    A = generate("random", rows, seed=seed, nnz_per_row=3).tolil()
    A[rows // 2, :] = rng.uniform(0.5, 1.5, size=(1, rows))
    A[7, :] = 0
    return canonicalize(sp.csr_array(A))


def build_matrices(suitesparse: Path | None, limit: int) -> list[tuple[str, object]]:
    out = [(name, generate(fam, rows, seed=1, **params)) for name, fam, rows, params in MATRICES]
    out.append(("dense_row_3k", dense_row_matrix()))
    if suitesparse is not None:
        files = sorted(suitesparse.glob("*.mtx.gz"))[:limit]
        out += [(f.name.removesuffix(".mtx.gz"), load_matrix(f)) for f in files]
    return out


def verify_one(st: ResidentMatrix, header, op: Op, built, k: int | None, sms: int) -> tuple[str, dict]:
    """The harness's verification of one compiled variant on one matrix: (status, details)."""
    targets = []
    for which in ("A", "A_alt"):
        bound = BoundKernel.bind(header, op, built.cubin_path, st.on_device[which], k, sms)
        if isinstance(bound, str):
            return "refused", {"reason": bound}
        key = (which, bound.conversion_key)
        if key not in st.pristine:
            st.keep_pristine(key, bound.dev.arrays)
        targets.append(Target(bound, st.references[which],
                              lambda b=bound, key=key: st.modified(key, b.dev.arrays)))
    out = st.verifier(k, VerifyConfig()).run(targets[0], targets[1], built.uses_atomics)
    if out.kind is ErrorKind.NONE:
        return "pass", {"max_scaled_error": out.max_scaled_error}
    return "fail", {"kind": out.kind.value, "message": out.message}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("library_check.json"))
    ap.add_argument("--suitesparse", type=Path, default=None, help="folder of *.mtx.gz to add")
    ap.add_argument("--suitesparse-limit", type=int, default=80)
    ap.add_argument("--ops", default="spmv,spmm")
    ap.add_argument("--k", default="8,32,5", help="SpMM column counts (5 exercises k %% 4 != 0)")
    ap.add_argument("--strategies", default=None, help="only these strategies, comma-separated [default: all]")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fresh values (the harness draws them from the OS)")
    ap.add_argument("--families", default="", help="generator families to run instead of the built-in matrices, "
                    "comma-separated (e.g. arrow,dense_lines,lp,circuit: the longest rows)")
    ap.add_argument("--family-rows", type=int, default=1_000_000, help="rows of each --families matrix")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    cp = cupy_module()
    arch = device_arch()
    sms = num_sms()
    ops = [Op(o) for o in args.ops.split(",")]
    ks = [int(k) for k in args.k.split(",")]
    variants = [v for v in all_variants() if v.op in ops]
    if args.strategies:
        wanted = set(args.strategies.split(","))
        unknown = wanted - {v.strategy for v in all_variants()}
        if unknown:
            raise SystemExit(f"unknown strategies {sorted(unknown)}")
        variants = [v for v in variants if v.strategy in wanted]
    log.info("GPU %s (%s, %d SMs); %d variants", cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
             arch, sms, len(variants))

    t0 = time.perf_counter()
    parsed = [split_completion(v.render(), v.op) for v in variants]
    compiled = compile_many([code for _, code in parsed], CompileOptions(arch=arch))
    log.info("compiled %d variants in %.1f s (%d failed, %d refused by the compiled-code checks)", len(compiled),
             time.perf_counter() - t0, sum(not c.ok for c in compiled), sum(bool(c.ok and c.ptx_violation) for c in compiled))

    if args.families:
        matrices = [(f"{fam}_{args.family_rows}", generate(fam, args.family_rows, seed=1))
                    for fam in args.families.split(",")]
    else:
        matrices = build_matrices(args.suitesparse, args.suitesparse_limit)
    records = []
    for mname, A in matrices:
        st = ResidentMatrix(A, seed=args.seed)
        m, n = A.shape
        for v, (header, _), c in zip(variants, parsed, compiled):
            rec = {"variant": v.id, "matrix": mname, "rows": m, "cols": n, "nnz": int(A.nnz)}
            if not c.ok or c.ptx_violation:
                records.append(rec | {"status": "compile_error", "log": (c.ptx_violation or c.log)[-2000:]})
                continue
            for k in ks if v.op is Op.SPMM else [None]:
                if not v.applicable(k):
                    continue
                status, extra = verify_one(st, header, v.op, c, k, sms)
                records.append(rec | {"k": k, "status": status} | extra)
                if status == "refused":
                    break  # refusals do not depend on k
                if status != "pass":
                    log.warning("FAIL %s on %s (k=%s): %s", v.id, mname, k, extra)
        log.info("%-24s %8d x %-8d nnz %-9d done", mname, m, n, A.nnz)

    summary: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        op, strategy = r["variant"].split("/")[:2]
        fmt = next(v.format for v in variants if v.id == r["variant"])
        summary[(op, fmt, strategy)][r["status"]] += 1
    print(f"\n{'op':5} {'format':6} {'strategy':15} {'variants':>8} {'pass':>6} {'fail':>5} {'refused':>8} {'cerr':>5}")
    nvar = defaultdict(int)
    for v in variants:
        nvar[(v.op.value, v.format, v.strategy)] += 1
    for key in sorted(summary):
        s = summary[key]
        print(f"{key[0]:5} {key[1]:6} {key[2]:15} {nvar[key]:>8} {s['pass']:>6} {s['fail']:>5} {s['refused']:>8} {s['compile_error']:>5}")
    totals = defaultdict(int)
    for r in records:
        totals[r["status"]] += 1
    print(f"\nvariants {len(variants)}, matrices {len(matrices)}, checks {len(records)}: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "arch": arch,
                                    "variants": len(variants), "matrices": [m for m, _ in matrices],
                                    "totals": totals, "records": records}, indent=1))
    return 1 if totals.get("fail") or totals.get("compile_error") else 0


if __name__ == "__main__":
    sys.exit(main())

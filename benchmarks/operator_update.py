"""How long ``op.update_values`` takes per call, from a PyTorch tensor and from a CuPy array.

On SuiteSparse soc-brightkite's GCN adjacency (self loops, symmetric normalisation: 0.48M nonzeros,
a graph small enough that an update is bound by the host), one SpMM operator (k = 128) per format:
the COO kernel the GCN benchmark's tune picks, the first CSR and ELL library variants (ELL does not
bind on this graph's uneven rows: the operator runs the library, cuSPARSE on CSR). Per call: 2000
updates enqueued back to back, alternating two value vectors, the GPU synchronised at both ends; one
torch-side SpMM likewise for scale. After the last update the operator's values are read back and
compared with the vector given (``values_ok``).

    PYTHONPATH=src:benchmarks python benchmarks/operator_update.py --out $OUT/update.json

Run it under two source trees (``PYTHONPATH=OLD/src:benchmarks``) to compare two versions of the
operator in one call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

VARIANTS = (("COO", "spmm/coo_runs/-/g=32,vec=4,nzpg=16,block=256"), ("CSR", None), ("ELL", None))
CALLS = 2000


def per_call_us(fn, args_cycle, sync) -> float:
    for _ in range(20):
        fn(args_cycle[0])
    sync()
    t = time.perf_counter()
    for i in range(CALLS):
        fn(args_cycle[i % len(args_cycle)])
    sync()
    return (time.perf_counter() - t) / CALLS * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suitesparse", default=None, help="folder of SuiteSparse .mtx files (default: as operator_e2e)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    try:
        import cupy as cp
        import torch

        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except ImportError as exc:
        print(f"error: this benchmark needs an NVIDIA GPU with CuPy and PyTorch ({exc})", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, however the script is started
    from operator_e2e import gcn_adjacency, load, suitesparse_dir
    from sparserl.kernels.library import variants
    from sparserl.operator import from_kernel

    P = load(suitesparse_dir(args.suitesparse), "soc-brightkite")
    if P is None:
        print("error: soc-brightkite.mtx.gz not found: pass --suitesparse DIR (or set SPARSERL_SUITESPARSE)",
              file=sys.stderr)
        return 2
    A = gcn_adjacency(P)
    out = {"matrix": "soc-brightkite (GCN adjacency)", "nnz": int(A.nnz), "k": 128, "calls": CALLS, "rows": []}
    for fmt, vid in VARIANTS:
        vs = variants("spmm", fmt, 128)
        v = next((v for v in vs if v.id == vid), vs[0])
        op = from_kernel(A, v.render(), "spmm", 128)
        vals = [torch.as_tensor(A.data * np.float32(1 + 0.01 * i), device="cuda") for i in range(2)]
        cvals = [cp.asarray(t) for t in vals]
        X = torch.randn(A.shape[1], 128, device="cuda")
        row = {"variant": v.id, "backend": op.backend.name,
               "torch_us": per_call_us(op.update_values, vals, torch.cuda.synchronize),
               "cupy_us": per_call_us(op.update_values, cvals, torch.cuda.synchronize),
               "spmm_torch_us": per_call_us(op.matmat, [X], torch.cuda.synchronize)}
        op.update_values(vals[1])
        row["values_ok"] = bool(cp.array_equal(op.values(), cvals[1]))
        out["rows"].append(row)
        print(f"{v.id} ({row['backend']}): update {row['torch_us']:.1f} us from torch, {row['cupy_us']:.1f} us "
              f"from CuPy; one SpMM {row['spmm_torch_us']:.1f} us; values read back equal: {row['values_ok']}")
        op.close()
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

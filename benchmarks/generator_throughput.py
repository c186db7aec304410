"""Throughput of the matrix generators and of compute_features at a target size (CPU only).

For each family, a small pilot run measures nonzeros per row, the row count is chosen to give
about ``--nnz`` nonzeros, and ``generate()`` and ``compute_features()`` are timed separately
(best of ``--repeat`` runs, wall clock). With ``--io``, saving and loading the ``random`` matrix as
``.mtx``, ``.mtx.gz`` and ``.npz`` is timed too. Prints a table and writes JSON.

    python benchmarks/generator_throughput.py --nnz 10000000 --out runs/generator_throughput.json
    python benchmarks/generator_throughput.py --rows 1000000 --application --out runs/generator_1m.json

``--rows`` generates every family at that many rows instead (no pilot); ``--application`` adds the
application families (circuit, lp, kkt, ...) to the default list of the classic ones.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy
from rich.console import Console
from rich.table import Table

from sparserl.matrices import compute_features, family_names, generate, load_matrix, save_matrix

PILOT_ROWS = 1 << 16


def _best_of(repeat: int, fn: Any) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def bench_family(family: str, target_nnz: int, repeat: int, seed: int, rows: int | None = None) -> dict[str, Any]:
    """Time generate() and compute_features() for ``family`` at about ``target_nnz`` nonzeros (or
    at ``rows`` rows)."""
    if rows is None:
        pilot = generate(family, PILOT_ROWS, seed=seed)  # also warms up code paths
        per_row = pilot.nnz / pilot.shape[0]
        rows = max(1, round(target_nnz / per_row))
    t_gen, A = _best_of(repeat, lambda: generate(family, rows, seed=seed))
    t_feat, _ = _best_of(repeat, lambda: compute_features(A))
    return {
        "family": family,
        "rows": int(A.shape[0]),
        "cols": int(A.shape[1]),
        "nnz": int(A.nnz),
        "generate_s": t_gen,
        "generate_mnnz_per_s": A.nnz / t_gen / 1e6,
        "features_s": t_feat,
        "features_mnnz_per_s": A.nnz / t_feat / 1e6,
    }


def bench_io(target_nnz: int, seed: int) -> list[dict[str, Any]]:
    """Time save_matrix/load_matrix of a ``random`` matrix of about ``target_nnz`` nonzeros."""
    A = generate("random", max(1, target_nnz // 16), seed=seed)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".mtx", ".mtx.gz", ".npz"):
            path = Path(tmp) / f"random{suffix}"
            t0 = time.perf_counter()
            save_matrix(A, path)
            t1 = time.perf_counter()
            B = load_matrix(path)
            t2 = time.perf_counter()
            assert B.nnz == A.nnz
            out.append(
                {
                    "format": suffix,
                    "nnz": int(A.nnz),
                    "bytes": path.stat().st_size,
                    "save_s": t1 - t0,
                    "load_s": t2 - t1,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nnz", type=int, default=10_000_000, help="target nonzeros per matrix")
    parser.add_argument(
        "--out", type=Path, default=Path("runs/generator_throughput.json"), help="JSON output path"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", nargs="*", default=None,
                        help="subset of families (default: the classic ones, with --application all)")
    parser.add_argument("--application", action="store_true", help="add the application families to the default")
    parser.add_argument("--rows", type=int, default=None, help="rows of every matrix (instead of --nnz)")
    parser.add_argument("--io", action="store_true", help="also time save/load of .mtx, .mtx.gz, .npz")
    args = parser.parse_args()

    console = Console()
    results = []
    for family in args.families or family_names(include_application=args.application):
        res = bench_family(family, args.nnz, args.repeat, args.seed, args.rows)
        results.append(res)
        console.log(
            f"{family}: {res['nnz']} nnz, generate {res['generate_s']:.3f}s, features {res['features_s']:.3f}s"
        )

    size = f"{args.rows:,} rows" if args.rows else f"target {args.nnz:,} nnz"
    table = Table(title=f"generator throughput, {size} ({os.cpu_count()} CPUs)")
    for col in ("family", "rows", "nnz", "generate s", "gen Mnnz/s", "features s", "feat Mnnz/s"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for r in results:
        table.add_row(
            r["family"], f"{r['rows']:,}", f"{r['nnz']:,}",
            f"{r['generate_s']:.3f}", f"{r['generate_mnnz_per_s']:.1f}",
            f"{r['features_s']:.3f}", f"{r['features_mnnz_per_s']:.1f}",
        )  # fmt: skip
    console.print(table)

    io_results = bench_io(args.nnz, args.seed) if args.io else []
    if io_results:
        io_table = Table(title="save/load of the random matrix")
        for col in ("format", "nnz", "MB", "save s", "load s"):
            io_table.add_column(col, justify="right")
        for r in io_results:
            io_table.add_row(
                r["format"],
                f"{r['nnz']:,}",
                f"{r['bytes'] / 1e6:.1f}",
                f"{r['save_s']:.2f}",
                f"{r['load_s']:.2f}",
            )
        console.print(io_table)

    report = {
        "benchmark": "generator_throughput",
        "target_nnz": None if args.rows else args.nnz,
        "rows": args.rows,
        "repeat": args.repeat,
        "seed": args.seed,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scipy": scipy.__version__,
        },
        "results": results,
        "io": io_results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

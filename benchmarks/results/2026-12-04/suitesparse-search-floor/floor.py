"""How much of the SuiteSparse search's geometric mean over the oracle is held at 1.0 by matrices whose best
kernel is the oracle's own and takes a few microseconds (a launch and an L2 flush), and what the other
matrices would need for the target. Reads search_bench.py JSON files; prints a table and writes floor.json here.

    PYTHONPATH=src python benchmarks/results/2026-12-04/suitesparse-search-floor/floor.py FILE [FILE ...]
"""
import json
import sys
from pathlib import Path

from sparserl.improve.table import geomean_of as geomean

TARGET = 1.08

out = {}
for f in sys.argv[1:]:
    ms = json.loads(Path(f).read_text())["matrices"]
    ratios = [m["ratio"] for m in ms if m.get("ratio")]
    same = [m for m in ms if m.get("ratio") and abs(m["ratio"] - 1.0) < 1e-9]
    rest = [m["ratio"] for m in ms if m.get("ratio") and abs(m["ratio"] - 1.0) >= 1e-9]
    need = TARGET ** (len(ratios) / len(rest)) if rest else None  # the rest's geomean for the target overall
    times = sorted(m["search_us"] for m in same)
    row = {"matrices": len(ratios), "geomean": geomean(ratios), "oracle_pick_kept": len(same),
           "their_best_us": {"min": times[0], "median": times[len(times) // 2], "max": times[-1]} if times else None,
           "under_8us_of_them": sum(t < 8 for t in times),
           "their_cusparse_us_median": sorted(m["cusparse_us"] for m in same)[len(same) // 2] if same else None,
           "their_nnz_max": max(m["nnz"] for m in same) if same else None,
           "rest": len(rest), "rest_geomean": geomean(rest), "rest_needs_for_target": need}
    out[Path(f).name] = row
    print(f"{Path(f).name}: {len(ratios)} matrices, geomean {row['geomean']:.3f}; the search kept the oracle's "
          f"pick on {len(same)} (best {times[0]:.1f}-{times[-1]:.1f} us, median {row['their_best_us']['median']:.1f}); "
          f"cuSPARSE median {row['their_cusparse_us_median']:.1f} us, at most {row['their_nnz_max']} nonzeros; "
          f"the other {len(rest)}: geomean {row['rest_geomean']:.3f}, {need:.3f} needed for {TARGET} overall")
(Path(__file__).parent / "floor.json").write_text(json.dumps(out, indent=1))

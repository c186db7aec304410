"""A template as it renders now against the same template at an earlier revision: every seed point of
both forms verified and timed side by side, in one harness, passes alternated in order; or, on a CPU,
both forms compiled one at a time, their compile seconds, registers and spills, and whether their SASS
is the same.

For a change to a template's body (the specialised DIA and BSR templates reading the shape at run
time, say), the question is what it costs in speed on the matrices the template is for. The earlier
form's module is loaded from ``--before``: a git revision (``git show REV:PATH``), or a folder that
holds the module files by name (``dia.py``, ``bsr.py``: where the working tree travels without its
git history, copy them there first). Each matrix gets the template's seed points in both forms; all
of them go through the full harness (verification on fresh inputs, then cold-regime timing, L2
flushed) ``--passes`` times, every other pass in reverse order. Per point the fastest pass is kept;
per matrix the best point of each form; the ratio is before over now (above 1: now is faster).

    python benchmarks/template_revision_speed.py --before d6ab30c --out speed.json
    git show d6ab30c:src/sparserl/kernels/templates/dia.py > BEFORE/dia.py   # and bsr.py; then, on a GPU:
    python benchmarks/template_revision_speed.py --before BEFORE --out speed.json
    python benchmarks/template_revision_speed.py --before 238fc8e --compile-times --out compile.json   # CPU

``--compile-times`` compiles with NVRTC into an empty cache, one kernel at a time (the seconds a
search pays for a candidate it has not seen), and compares the SASS of the two forms (``cuobjdump``
from the PATH or from Triton's NVIDIA backend; ``same_sass`` is None without it).

Matrices (``--rows``, 1M by default; sizes off a multiple of 4 on purpose): diagonal, banded with 5
and 9 bands, stencil2d, stencil3d_7 and stencil3d_27 for ``dia_window_spec``, and two of 20,003 rows
with 64 diagonals (the most a card lists), 37 apart (each its own cluster of ``x``) and contiguous;
4x4 and 8x8 blocks (the 8x8 one with a cut last block column) for ``bsr_stream_spec``; rows of 16 and of 7
entries (one length for every row) for ``csr_lanes_spec``; skewed and power-law rows for ``csr_split_spec``.

The earlier form renders with the library modules its template module imports from as they were at ``--before``
too (``csr_irregular`` holds the CUDA of the CSR templates): a template whose body lives there is compared with
its own past, not with itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import logging
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from params_equivalence import cuobjdump_path, sass_of  # noqa: E402

from sparserl.harness.compile import CompileOptions, compile_many  # noqa: E402
from sparserl.harness.evaluator import Evaluator, HarnessConfig  # noqa: E402
from sparserl.harness.matrix_facts import materialise  # noqa: E402
from sparserl.improve.table import geomean_of  # noqa: E402
from sparserl.kernels.contract import Op, split_completion  # noqa: E402
from sparserl.kernels.templates import Template, get_template  # noqa: E402
from sparserl.matrices import generate  # noqa: E402
from sparserl.matrices.card import matrix_card  # noqa: E402

log = logging.getLogger("template_revision_speed")
REPO = Path(__file__).resolve().parents[1]


WIDE_ROWS = 20_003
"""Rows of the two 64-diagonal matrices (their compile time, not their size, is the question)."""


def _diagonals(offsets: list[int]) -> sp.csr_array:
    m = WIDE_ROWS
    return sp.csr_array(sp.diags([np.ones(m - abs(o), dtype=np.float32) for o in offsets], offsets, shape=(m, m)))


def matrix_set(rows: int) -> list[tuple[str, str, Callable[[], sp.csr_array]]]:
    """(name, template, the matrix's builder) of the default set."""
    def gen(family: str, m: int, cols: int | None = None, **options):
        return lambda: generate(family, m, cols=cols, seed=1, **options)
    return [("diagonal", "dia_window_spec", gen("diagonal", rows + 3)),
            ("banded5", "dia_window_spec", gen("banded", rows + 1, bands=5)),
            ("banded9", "dia_window_spec", gen("banded", rows + 2, bands=9)),
            ("stencil2d", "dia_window_spec", gen("stencil2d", rows)),
            ("stencil3d_7", "dia_window_spec", gen("stencil3d_7", rows)),
            ("stencil3d_27", "dia_window_spec", gen("stencil3d_27", rows)),
            ("wide64_apart37", "dia_window_spec", lambda: _diagonals([i * 37 - 1000 for i in range(64)])),
            ("wide64_contiguous", "dia_window_spec", lambda: _diagonals(list(range(-32, 32)))),
            ("block4", "bsr_stream_spec", gen("block", rows, block=4, blocks_per_row=4)),
            ("block8_cut", "bsr_stream_spec", gen("block", rows, rows - 3, block=8, blocks_per_row=3)),
            ("rows16", "csr_lanes_spec", gen("random", rows, nnz_per_row=16)),
            ("rows7", "csr_lanes_spec", gen("random", rows + 1, nnz_per_row=7)),
            ("skewed", "csr_split_spec", gen("skewed", rows)),
            ("powerlaw", "csr_split_spec", gen("powerlaw", rows + 1))]


def _source_at(path: Path, before: str, required: bool = True) -> str | None:
    """The source of the file at ``path`` (in this checkout) as it was at ``before``: a git revision, or a folder
    holding module files by name (a file the folder lacks: None, or an error when ``required``)."""
    folder = Path(before)
    if folder.is_dir():
        if (folder / path.name).exists():
            return (folder / path.name).read_text()
        if required:
            raise SystemExit(f"error: no {path.name} in {folder}")
        return None
    rel = path.resolve().relative_to(REPO).as_posix()
    shown = subprocess.run(["git", "show", f"{before}:{rel}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"error: cannot read {rel} at {before}: {shown.stderr.strip()}")
    return shown.stdout


def _load(name: str, source: str, file_name: str):
    """A module made from ``source`` (registered as ``name`` while it runs: dataclasses look their module up)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / file_name
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


_LIBRARY_IMPORT = re.compile(r"^from sparserl\.kernels\.library\.(\w+) import", re.M)


def template_before(name: str, before: str) -> Template:
    """The template called ``name`` as its module defined it at ``before``, rendering with the library modules it
    imports from (``sparserl.kernels.library.*``, where the CUDA of some templates lives) as they were then too:
    those are put in place of today's while the module loads, then today's are restored. In a folder, a library
    module the folder lacks stays today's."""
    now = get_template(Op.SPMV, name)
    path = Path(inspect.getsourcefile(now.renderer)).resolve()
    source = _source_at(path, before)
    libraries = sorted(set(_LIBRARY_IMPORT.findall(source)), key=lambda lib: lib != "common")  # common first
    saved = {}
    try:
        for lib in libraries:
            full = f"sparserl.kernels.library.{lib}"
            lib_path = Path(importlib.import_module(full).__file__)
            old = _source_at(lib_path, before, required=False)
            if old is not None:
                saved[full] = sys.modules[full]
                sys.modules[full] = _load(full, old, lib_path.name)
        module = _load(f"before_{path.stem}", source, path.name)
    finally:
        sys.modules.update(saved)
    for attr in dir(module):
        if attr.endswith("_templates") and callable(getattr(module, attr)):
            for t in getattr(module, attr)():
                if t.name == name and t.op == now.op:
                    return t
    raise SystemExit(f"error: no template {name} in {path.name} at {before}")


def _cases(args: argparse.Namespace):
    """(name, template name, matrix, its card, the seed points both forms render, the two forms) of each
    matrix of the set (or of --only)."""
    only = set(filter(None, args.only.split(",")))
    befores: dict[str, Template] = {}  # each template's earlier module, loaded once
    for name, tname, build in matrix_set(args.rows):
        if only and name not in only:
            continue
        now = get_template(Op.SPMV, tname)
        if tname not in befores:
            befores[tname] = template_before(tname, args.before)
        old = befores[tname]
        A = build()
        card = matrix_card(A)
        points = [p for p in now.seeds(card) if now.check(p, card) is None]
        yield name, tname, A, card, points, {"before": old, "now": now}


def compile_times(args: argparse.Namespace) -> dict:
    """Each seed point of both forms compiled alone with NVRTC into an empty cache: seconds, registers,
    spills, and whether the two forms' SASS is the same."""
    options, rows, tool = CompileOptions(backend="nvrtc"), [], cuobjdump_path()
    for name, tname, A, card, points, forms in _cases(args):
        for p in points:
            row = {"matrix": name, "template": tname, "point": str(p)}
            sass = {}
            for form, t in forms.items():
                code = split_completion(materialise(t.render(p, card), Op.SPMV, card), Op.SPMV)[1]  # facts it names
                with tempfile.TemporaryDirectory() as cache:
                    t0 = time.perf_counter()
                    r = compile_many([code], options, cache_dir=cache, jobs=1)[0]
                    row[f"{form}_s"] = time.perf_counter() - t0
                    res = r.resources_of("spmv_kernel") if r.ok else None
                    sass[form] = sass_of(Path(r.cubin_path).read_bytes(), ("spmv_kernel",)) if r.ok and tool else None
                row[f"{form}_ok"] = r.ok
                row[f"{form}_registers"] = res.registers if res else None
                row[f"{form}_spill_bytes"] = (res.spill_store_bytes + res.stack_bytes) if res else None
            row["same_sass"] = None if None in sass.values() else sass["before"] == sass["now"]
            log.info("%-18s %-28s before %5.1f s (%s regs)  now %5.1f s (%s regs)  same SASS %s", name, row["point"],
                     row["before_s"], row["before_registers"], row["now_s"], row["now_registers"], row["same_sass"])
            rows.append(row)
    ratios = [r["before_s"] / r["now_s"] for r in rows if r["before_ok"] and r["now_ok"]]
    summary = {"points": len(rows), "same_sass": sum(r["same_sass"] is True for r in rows),
               "geomean_before_over_now_seconds": geomean_of(ratios),
               "failures": sum(not (r["before_ok"] and r["now_ok"]) for r in rows)}
    return {"before": args.before, "rows": args.rows, "compile_times": rows, "summary": summary}


def run(args: argparse.Namespace) -> dict:
    rows = []
    with Evaluator(HarnessConfig(reward_regime="cold", memo=0)) as ev:
        if not ev.has_gpu:
            raise SystemExit("error: timing needs a GPU (on a CPU: --compile-times)")
        for name, tname, A, card, points, forms in _cases(args):
            old, now = forms["before"], forms["now"]
            m = int(A.shape[0])
            cands = [(str(p), form, t.render(p, card)) for p in points for form, t in (("before", old), ("now", now))]
            ref = ev.register(A, name)
            times: dict[tuple[str, str], list[float]] = {(p, f): [] for p, f, _ in cands}
            failures = []
            for rep in range(args.passes):
                order = cands if rep % 2 == 0 else cands[::-1]
                for (point, form, _), r in zip(order, ev.evaluate_many([(t, ref, Op.SPMV, None) for *_, t in order])):
                    if r.ok:
                        times[(point, form)].append(r.timings["cold"].median_us)
                    else:
                        failures.append({"point": point, "form": form, "error": r.error_kind.value,
                                         "message": r.message[:200]})
            fastest = {k: min(v) for k, v in times.items() if v}
            best = {f: min((t for (_, ff), t in fastest.items() if ff == f), default=None) for f in ("before", "now")}
            row = {"matrix": name, "template": tname, "rows": m, "cols": int(A.shape[1]), "nnz": int(A.nnz),
                   "points_us": {f"{p} {f}": t for (p, f), t in fastest.items()}, "best_before_us": best["before"],
                   "best_now_us": best["now"], "failures": failures,
                   "before_over_now": best["before"] / best["now"] if best["before"] and best["now"] else None}
            log.info("%-14s %-16s before %s us, now %s us, before/now %s, %d failures", name, tname, best["before"],
                     best["now"], row["before_over_now"], len(failures))
            rows.append(row)
        gpu = ev.pool.gpu
    ratios = [r["before_over_now"] for r in rows if r["before_over_now"]]
    by_template = {t: geomean_of([r["before_over_now"] for r in rows if r["template"] == t and r["before_over_now"]])
                   for t in dict.fromkeys(r["template"] for r in rows)}
    summary = {"geomean_before_over_now": geomean_of(ratios), "by_template": by_template,
               "min": min(ratios, default=None), "max": max(ratios, default=None),
               "failures": sum(len(r["failures"]) for r in rows)}
    return {"before": args.before, "rows": args.rows, "passes": args.passes, "gpu": gpu, "matrices": rows,
            "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="a git revision, or a folder holding the modules' earlier files")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the matrices (default 1M)")
    ap.add_argument("--passes", type=int, default=3, help="timed passes, every other one in reverse order")
    ap.add_argument("--compile-times", action="store_true",
                    help="CPU: compile both forms one kernel at a time (seconds, registers, spills, same SASS)")
    ap.add_argument("--only", default="", help="comma-separated matrix names of the set (default: all)")
    ap.add_argument("--out", type=Path, default=Path("template_revision_speed.json"))
    args = ap.parse_args()
    if unknown := set(filter(None, args.only.split(","))) - {name for name, *_ in matrix_set(16)}:
        ap.error(f"--only: no matrix {', '.join(sorted(unknown))} in the set")
    if args.rows < 16 or args.passes < 1:
        ap.error("--rows must be at least 16 and --passes at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = compile_times(args) if args.compile_times else run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    s = out["summary"]
    if args.compile_times:
        print(f"{s['points']} points: compile seconds before/now, geomean {s['geomean_before_over_now_seconds']}; "
              f"the same SASS on {s['same_sass']}; {s['failures']} failed to compile")
        return 1 if s["failures"] else 0
    print(f"before/now, geomean over {len(out['matrices'])} matrices: {s['geomean_before_over_now']}; "
          f"by template {s['by_template']}; {s['failures']} failures")
    return 1 if s["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

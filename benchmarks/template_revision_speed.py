"""A template as it renders now against the same template at an earlier revision: every seed point of
both forms verified and timed side by side, in one harness, passes alternated in order.

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
    python benchmarks/template_revision_speed.py --before d6ab30c --rows 3000 --compile-only   # CPU: render, compile

Matrices (``--rows``, 1M by default; sizes off a multiple of 4 on purpose): diagonal, banded with 5
and 9 bands, stencil2d, stencil3d_7 and stencil3d_27 for ``dia_window_spec``; 4x4 and 8x8 blocks
(the 8x8 one with a cut last block column) for ``bsr_stream_spec``.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import logging
import math
import subprocess
import sys
import tempfile
from pathlib import Path

from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.kernels.contract import Op
from sparserl.kernels.templates import Template, get_template
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card

log = logging.getLogger("template_revision_speed")
REPO = Path(__file__).resolve().parents[1]


def matrix_set(rows: int) -> list[tuple[str, str, str, int, dict, int | None]]:
    """(name, template, family, rows, generator options, columns) of the default set."""
    return [("diagonal", "dia_window_spec", "diagonal", rows + 3, {}, None),
            ("banded5", "dia_window_spec", "banded", rows + 1, {"bands": 5}, None),
            ("banded9", "dia_window_spec", "banded", rows + 2, {"bands": 9}, None),
            ("stencil2d", "dia_window_spec", "stencil2d", rows, {}, None),
            ("stencil3d_7", "dia_window_spec", "stencil3d_7", rows, {}, None),
            ("stencil3d_27", "dia_window_spec", "stencil3d_27", rows, {}, None),
            ("block4", "bsr_stream_spec", "block", rows, {"block": 4, "blocks_per_row": 4}, None),
            ("block8_cut", "bsr_stream_spec", "block", rows, {"block": 8, "blocks_per_row": 3}, rows - 3)]


def _module_source(template: Template, before: str) -> tuple[str, str]:
    """(file name, source) of the module that defines ``template``, as it was at ``before``."""
    path = Path(inspect.getsourcefile(template.renderer)).resolve()
    folder = Path(before)
    if folder.is_dir():
        return path.name, (folder / path.name).read_text()
    rel = path.relative_to(REPO).as_posix()
    shown = subprocess.run(["git", "show", f"{before}:{rel}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"error: cannot read {rel} at {before}: {shown.stderr.strip()}")
    return path.name, shown.stdout


def template_before(name: str, before: str) -> Template:
    """The template called ``name`` as its module defined it at ``before``."""
    now = get_template(Op.SPMV, name)
    file_name, source = _module_source(now, before)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / file_name
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"before_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    for attr in dir(module):
        if attr.endswith("_templates") and callable(getattr(module, attr)):
            for t in getattr(module, attr)():
                if t.name == name and t.op == now.op:
                    return t
    raise SystemExit(f"error: no template {name} in {file_name} at {before}")


def _geomean(v: list[float]) -> float | None:
    return math.exp(sum(map(math.log, v)) / len(v)) if v else None


def run(args: argparse.Namespace) -> dict:
    rows, befores = [], {}
    cfg = HarnessConfig(reward_regime="cold", memo=0, compile_only=args.compile_only)
    with Evaluator(cfg) as ev:
        for name, tname, family, m, options, cols in matrix_set(args.rows):
            now = get_template(Op.SPMV, tname)
            old = befores.setdefault(tname, template_before(tname, args.before))
            A = generate(family, m, cols=cols, seed=1, **options)
            card = matrix_card(A)
            points = [p for p in now.seeds(card) if now.check(p, card) is None]
            cands = [(str(p), form, t.render(p, card)) for p in points for form, t in (("before", old), ("now", now))]
            ref = ev.register(A, name)
            times: dict[tuple[str, str], list[float]] = {(p, f): [] for p, f, _ in cands}
            failures = []
            for rep in range(args.passes):
                order = cands if rep % 2 == 0 else cands[::-1]
                for (point, form, _), r in zip(order, ev.evaluate_many([(t, ref, Op.SPMV, None) for *_, t in order])):
                    if r.ok:
                        times[(point, form)].append(r.timings["cold"].median_us)
                    elif not args.compile_only or not r.compiled:
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
        gpu = ev.pool.gpu if ev.has_gpu else "no GPU (compile only)"
    ratios = [r["before_over_now"] for r in rows if r["before_over_now"]]
    by_template = {t: _geomean([r["before_over_now"] for r in rows if r["template"] == t and r["before_over_now"]])
                   for t in dict.fromkeys(r["template"] for r in rows)}
    summary = {"geomean_before_over_now": _geomean(ratios), "by_template": by_template,
               "min": min(ratios, default=None), "max": max(ratios, default=None),
               "failures": sum(len(r["failures"]) for r in rows)}
    return {"before": args.before, "rows": args.rows, "passes": args.passes, "gpu": gpu,
            "compile_only": args.compile_only, "matrices": rows, "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="a git revision, or a folder holding the modules' earlier files")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the matrices (default 1M)")
    ap.add_argument("--passes", type=int, default=3, help="timed passes, every other one in reverse order")
    ap.add_argument("--compile-only", action="store_true", help="render and compile both forms (no GPU)")
    ap.add_argument("--out", type=Path, default=Path("template_revision_speed.json"))
    args = ap.parse_args()
    if args.rows < 16 or args.passes < 1:
        ap.error("--rows must be at least 16 and --passes at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    s = out["summary"]
    print(f"before/now, geomean over {len(out['matrices'])} matrices: {s['geomean_before_over_now']}; "
          f"by template {s['by_template']}; {s['failures']} failures")
    return 1 if s["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

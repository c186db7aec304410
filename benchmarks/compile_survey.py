"""What the search space costs to compile, on a CPU: every SpMV template's points on each matrix's card,
each distinct kernel text compiled with NVRTC into an empty cache, its seconds, registers and spills.

A search pays a candidate's compile before anything runs on the GPU (the harness caches by text, so
each distinct text once). A point that takes many seconds to build, or that builds into spilling code,
is a cost, or a slow kernel, that no GPU timing of a few seed points shows: ``dia_window_spec`` on a card
of 64 scattered diagonals took 8-25 s and spilled until its inner loop was rewritten (results of
2026-12-04, dia-spec-compile-time). This walks the whole set of templates over the generator families and,
with ``--suitesparse DIR``, real matrices, so such points are found before a search meets them.

Per card and template: the template's seed points and ``--random N`` points drawn from its space (seeded), those
its checker accepts for the card. Texts are de-duplicated (a generic template renders one text for every card),
and each distinct one is compiled once, ``--jobs`` at a time. The JSON holds every distinct kernel (where it was
first met, its point, seconds, the most registers, spill-store bytes and stack-frame bytes of its kernels, or the
compile error), a summary per template (kernels, median and largest seconds, kernels that spill, errors, time-outs)
and the slowest ones. A spill is counted from ptxas's spill stores alone: the stack frame holds the spilled values,
and a local array with no spill, too.

    python benchmarks/compile_survey.py --out compile_survey.json                        # the families at 1M rows
    python benchmarks/compile_survey.py --suitesparse DIR --random 4 --out survey.json  # and real matrices
    python benchmarks/compile_survey.py --templates dia_window_spec,csr_split_spec --rows 200000

A compile error here is a defect of the template (its checker let a point through that does not build); the
run's exit status is 1 when there is one. A time-out (NVRTC past the harness's compile limit) is counted apart:
the slowest build of all, not a wrong one; it also makes the exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("compile_survey")
SLOW_S = 3.0
"""A kernel this slow to build is listed as slow (the harness's aim for a whole candidate is 3 s)."""


def cards(args: argparse.Namespace) -> list[tuple[str, object]]:
    """(name, card) of each matrix of the survey: the families at ``--rows`` and the real matrices of
    ``--suitesparse`` (``--limit`` of them, evenly spaced). The matrices themselves are not kept."""
    from sparserl.eval.compare import evenly
    from sparserl.matrices import family_names, generate, load_matrix
    from sparserl.matrices.card import matrix_card
    from sparserl.matrices.io import matrices_in

    out = []
    fams = [f for f in args.families.split(",") if f] or list(family_names())
    for fam in fams:
        out.append((f"{fam}_{args.rows}", matrix_card(generate(fam, args.rows, seed=1))))
    if args.suitesparse:
        files = matrices_in(args.suitesparse)
        for f in evenly(files, args.limit):
            out.append((f.name.split(".")[0], matrix_card(load_matrix(f))))
    return out


def survey_points(template, card, rng: np.random.Generator, n_random: int) -> list[dict]:
    """The template's seed points on ``card`` and up to ``n_random`` drawn ones, each once."""
    points = list(template.seeds(card))
    for _ in range(n_random):
        p = template.random_point(rng, card)
        if p is not None and p not in points:
            points.append(p)
    return points


def kernels(args: argparse.Namespace) -> list[dict]:
    """Every distinct kernel text of the survey, with where it was first met and how often it was met."""
    from sparserl.harness.matrix_facts import materialise
    from sparserl.kernels.contract import Op, split_completion
    from sparserl.kernels.templates import templates

    wanted = {t for t in args.templates.split(",") if t}
    chosen = [t for t in templates(Op.SPMV) if not wanted or t.name in wanted]
    unknown = wanted - {t.name for t in chosen}
    if unknown:
        raise SystemExit(f"error: no SpMV template {sorted(unknown)}; templates are "
                         f"{', '.join(sorted(t.name for t in templates(Op.SPMV)))}")
    rng = np.random.default_rng(args.seed)
    seen: dict[str, dict] = {}
    for name, card in cards(args):
        for t in chosen:
            for p in survey_points(t, card, rng, args.random):
                code = split_completion(materialise(t.render(p, card), Op.SPMV, card), Op.SPMV)[1]  # facts it names
                key = hashlib.sha256(code.encode()).hexdigest()
                if key in seen:
                    seen[key]["met"] += 1
                else:
                    seen[key] = {"template": t.name, "matrix": name, "point": p, "code": code, "met": 1}
    return list(seen.values())


def compile_all(found: list[dict], jobs: int) -> None:
    """Compile each kernel with NVRTC into one empty cache (every text is distinct, so nothing is shared),
    ``jobs`` at a time; its seconds, resources or error go into its row."""
    from sparserl.harness.compile import CompileOptions, compile_many
    from sparserl.progress import progress

    with tempfile.TemporaryDirectory() as cache, progress() as bar:
        task = bar.add_task("compile", total=len(found))
        results = compile_many([k["code"] for k in found], CompileOptions(backend="nvrtc"), cache_dir=cache,
                               jobs=jobs, on_done=lambda i, r: bar.update(task, advance=1))
    for k, r in zip(found, results):
        del k["code"]
        k["ok"] = r.ok
        k["seconds"] = r.build_seconds or r.seconds
        k["registers"] = max((x.registers for x in r.resources), default=None)
        k["spill_bytes"] = max((x.spill_store_bytes for x in r.resources), default=None)  # stored; the frame holds them
        k["stack_bytes"] = max((x.stack_bytes for x in r.resources), default=None)
        k["error_kind"] = r.error_kind
        if not r.ok:
            k["error"] = next((line for line in r.log.splitlines() if "error" in line), r.log[:200] or r.error_kind)


def summarize(found: list[dict], worst: int) -> dict:
    """Per template: kernels, median and largest compile seconds, spilling kernels, errors, time-outs; and the
    ``worst`` slowest kernels overall (pure)."""
    by: dict[str, list[dict]] = {}
    for k in found:
        by.setdefault(k["template"], []).append(k)
    per = {}
    for name, ks in sorted(by.items()):
        built = [k for k in ks if k["ok"]]
        secs = [k["seconds"] for k in built]
        per[name] = {"kernels": len(ks), "errors": sum(not k["ok"] and k.get("error_kind") != "timeout" for k in ks),
                     "median_s": statistics.median(secs) if secs else None, "max_s": max(secs, default=None),
                     "slow": sum(s > SLOW_S for s in secs),
                     "timeouts": sum(k.get("error_kind") == "timeout" for k in ks),
                     "spilling": sum(bool(k["spill_bytes"]) for k in built),
                     "max_registers": max((k["registers"] or 0 for k in built), default=None)}
    slowest = sorted((k for k in found if k["ok"]), key=lambda k: -k["seconds"])[:worst]
    return {"kernels": len(found), "errors": sum(not k["ok"] and k.get("error_kind") != "timeout" for k in found),
            "timeouts": sum(k.get("error_kind") == "timeout" for k in found),
            "slow": sum(k["ok"] and k["seconds"] > SLOW_S for k in found),
            "spilling": sum(k["ok"] and bool(k["spill_bytes"]) for k in found),
            "per_template": per,
            "slowest": [{key: k.get(key) for key in ("template", "matrix", "point", "seconds", "registers",
                                                  "spill_bytes", "stack_bytes")} for k in slowest]}


def table(summary: dict) -> str:
    lines = ["| template | kernels | median s | max s | over 3 s | spilling | most registers | errors | time-outs |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, s in summary["per_template"].items():
        med = "-" if s["median_s"] is None else f"{s['median_s']:.2f}"
        top = "-" if s["max_s"] is None else f"{s['max_s']:.2f}"
        lines.append(f"| {name} | {s['kernels']} | {med} | {top} | {s['slow']} | {s['spilling']} | "
                     f"{s['max_registers']} | {s['errors']} | {s['timeouts']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of each generated family's matrix")
    ap.add_argument("--families", default="", help="comma-separated generator families (default: the classic ones)")
    ap.add_argument("--suitesparse", type=Path, help="a folder of real matrices (.mtx/.mtx.gz/.npz) as well")
    ap.add_argument("--limit", type=int, default=0, help="at most this many real matrices, evenly spaced (0: all)")
    ap.add_argument("--templates", default="", help="comma-separated SpMV templates (default: all)")
    ap.add_argument("--random", type=int, default=0, help="points drawn from each template's space per card")
    ap.add_argument("--jobs", type=int, default=2, help="compiles at a time")
    ap.add_argument("--worst", type=int, default=12, help="the slowest kernels listed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("compile_survey.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.suitesparse is not None and not args.suitesparse.is_dir():
        print(f"error: --suitesparse {args.suitesparse} is not a folder", file=sys.stderr)
        return 2
    if args.rows < 1 or args.random < 0 or args.jobs < 1 or args.limit < 0:
        print("error: --rows and --jobs are at least 1, --random and --limit at least 0", file=sys.stderr)
        return 2
    from sparserl.harness import nvrtc

    if nvrtc.load_nvrtc() is None:
        print("error: NVRTC (libnvrtc) is not found: install the CUDA toolkit or nvidia-cuda-nvrtc", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    found = kernels(args)
    log.info("%d distinct kernels from the templates' points; compiling", len(found))
    compile_all(found, args.jobs)
    summary = summarize(found, args.worst)
    print(table(summary))
    for k in summary["slowest"]:
        print(f"  {k['seconds']:6.2f} s  {k['template']:<22} {k['matrix']:<24} {k['point']}  "
              f"{k['registers']} registers, {k['spill_bytes']} bytes spilled, {k['stack_bytes']} of stack")
    for k in found:
        if not k["ok"]:
            what = "compile time-out" if k.get("error_kind") == "timeout" else "compile error"
            print(f"  {what}: {k['template']} {k['matrix']} {k['point']}: {k.get('error')}")
    result = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "seconds": time.perf_counter() - t0, "summary": summary, "kernels": found}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} ({result['seconds']:.0f} s)")
    return 1 if summary["errors"] or summary["timeouts"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

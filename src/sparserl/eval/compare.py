"""``sparserl evaluate``: systems side by side on a matrix set, in one run.

Systems: policy checkpoints (each sampled ``samples`` times per matrix), and the baselines
cuSPARSE (speedup 1 by definition), the library oracle (fastest verified library variant)
and the rule-based selector (:mod:`sparserl.eval.selector`). Everything goes through the
same harness in the same run, so every ratio is measured side by side.

Per system: compile rate and correctness over all samples, unbiased pass@1 and pass@k,
fast_p (p = 1.0, 1.2, 1.5) on each matrix's best correct kernel, geometric-mean speedup
of the best of the ``samples`` kernels (a matrix with no correct kernel, or only correct kernels
slower than cuSPARSE, counts as 1.0: the user keeps cuSPARSE; :func:`~sparserl.eval.metrics.kept_speedup`)
and, at their raw speed, over the matrices it covers; speedup@1 (what one sampled kernel
gives, estimated from all samples, by the same rule), roofline fraction; broken down per structure family and per format
chosen, with a format confusion table against the oracle, and where the policies' samples come
from against the library (:mod:`sparserl.eval.provenance`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sparserl.errors import SparseRLError
from sparserl.eval.metrics import fast_p, geomean, kept_speedup, mean_pass_at_k, speedup_at_1
from sparserl.eval.provenance import provenance_table
from sparserl.kernels.contract import Op

log = logging.getLogger(__name__)

# Figures from the paper as quoted in this project's issue tracker (not re-measured here).
PAPER = {"source": "SparseRL, ICLR 2026 (figures as quoted in the project's issues)",
         "compile_rate": 0.575, "pass_at_1": 0.10, "geomean_speedup": 1.42, "gpu": "V100"}
FAST_PS = (1.0, 1.2, 1.5)
BASELINES = ("cusparse", "oracle", "selector")
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate and on which matrices."""

    matrices: str = "runs/data"
    """An SFT data folder (uses ``split``), a folder of .mtx/.mtx.gz/.npz, or 'families' (one generated per family)."""
    split: str = "test"
    """Split of an SFT data folder: 'train', 'val' or 'test'."""
    family_rows: int = 200_000
    """Rows of each generated matrix when matrices='families'."""
    checkpoints: tuple[str, ...] = ()
    """Policy checkpoints as NAME=PATH (or PATH; the folder name is used)."""
    baselines: tuple[str, ...] = BASELINES
    """Baselines run beside the policies: 'cusparse', 'oracle', 'selector'."""
    op: str = "spmv"
    """'spmv' or 'spmm'."""
    k: int = 32
    """SpMM columns (unused for spmv)."""
    samples: int = 8
    """Completions per matrix per checkpoint (pass@k uses them)."""
    temperature: float = 1.0
    """Sampling temperature (> 0)."""
    max_new_tokens: int = 1536
    """Longest completion, in tokens."""
    gen_batch: int = 32
    """Completions generated together (across matrices): the policy's batch size."""
    out: str = "runs/eval"
    """Output folder (eval.json, eval.md, completions.jsonl, plots)."""
    compile_only: bool = False
    """No GPU: compile rates only (no correctness, speed or speedup plots)."""
    plots: bool = True
    """Write plots (needs matplotlib)."""
    seed: int = 0
    """Sampling seed."""

    def __post_init__(self) -> None:
        bad = set(self.baselines) - set(BASELINES)
        if bad:
            raise SparseRLError(f"unknown baselines {sorted(bad)}; choose from {BASELINES}")
        if self.samples < 1 or self.gen_batch < 1 or self.op not in ("spmv", "spmm"):
            raise SparseRLError("need samples >= 1, gen_batch >= 1 and op spmv or spmm")
        if self.split not in SPLITS:
            raise SparseRLError(f"--split {self.split!r}: a data folder's splits are {', '.join(SPLITS)}")
        if not self.temperature > 0:
            raise SparseRLError(f"temperature must be > 0 (1.0 samples the policy as it is), got {self.temperature}")
        if self.max_new_tokens < 1:
            raise SparseRLError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def matrix_set(cfg: EvalConfig) -> list[tuple[str, str, object]]:
    """(name, family, matrix) triples of the evaluation set."""
    from sparserl.matrices import family_names, generate, load_matrix

    if cfg.matrices == "families":
        return [(f"{f}_{cfg.family_rows}", f, generate(f, cfg.family_rows, seed=cfg.seed + 7)) for f in family_names()]
    p = Path(cfg.matrices)
    if not (p / f"{cfg.split}.jsonl").exists() and any((p / f"{s}.jsonl").exists() for s in SPLITS):
        raise SparseRLError(f"{p} is a data folder without a {cfg.split!r} split ({cfg.split}.jsonl): "
                            f"choose --split from {', '.join(s for s in SPLITS if (p / f'{s}.jsonl').exists())}")
    if (p / f"{cfg.split}.jsonl").exists():
        from sparserl.data.sft_build import read_jsonl

        rows = read_jsonl(p / f"{cfg.split}.jsonl")
        seen: dict[str, str] = {}
        for r in rows:
            seen.setdefault(r["matrix"], r.get("family", "?"))
        return [(Path(m).name.split(".")[0], fam, load_matrix(m)) for m, fam in sorted(seen.items())]
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.name.endswith((".mtx", ".mtx.gz", ".npz")))
        if files:
            return [(f.name.split(".")[0], "real", load_matrix(f)) for f in files]
    raise SparseRLError(f"{cfg.matrices}: no matrices (give a data folder, a folder of matrices, or 'families')")


def _record(results, family: str) -> dict:
    """Summary of one system's evaluations on one matrix."""
    good = [r for r in results if r.correct and r.speedup]
    best = max(good, key=lambda r: r.speedup) if good else None
    return {"family": family, "n": len(results), "compiled": sum(r.compiled for r in results),
            "correct": sum(r.correct for r in results), "best_speedup": best.speedup if best else None,
            "best_format": best.format if best else None, "roofline": best.roofline if best else None,
            "kinds": dict(Counter(r.error_kind.value for r in results)),
            "sample_speedups": [r.speedup if r.correct and r.speedup else None for r in results]}


def summarize(per_matrix: dict[str, dict], samples: int) -> dict:
    """Aggregate one system's per-matrix records (pure)."""
    recs = list(per_matrix.values())
    n = sum(r["n"] for r in recs)
    best = [r["best_speedup"] for r in recs]
    out = {"matrices": len(recs), "samples": n, "compile_rate": sum(r["compiled"] for r in recs) / n if n else None,
           "correct_rate": sum(r["correct"] for r in recs) / n if n else None,
           "pass@1": mean_pass_at_k([(r["n"], r["correct"]) for r in recs], 1),
           f"pass@{samples}": mean_pass_at_k([(r["n"], r["correct"]) for r in recs if r["n"] >= samples], samples)
           if all(r["n"] >= samples for r in recs) else None,
           "coverage": sum(b is not None for b in best) / len(recs) if recs else None,
           "geomean_speedup": geomean([kept_speedup(b) for b in best]) if recs else None,
           "geomean_speedup_covered": geomean([b for b in best if b is not None]) if any(best) else None,
           "speedup@1": speedup_at_1([r["sample_speedups"] for r in recs])
           if recs and all(r.get("sample_speedups") for r in recs) else None,
           "roofline_mean": float(np.mean([r["roofline"] for r in recs if r["roofline"] is not None]))
           if any(r["roofline"] is not None for r in recs) else None,
           "formats": dict(Counter(r["best_format"] for r in recs if r["best_format"]))}
    for p in FAST_PS:
        out[f"fast_{p}"] = fast_p(best, p)
    fams: dict[str, list] = defaultdict(list)
    for r in recs:
        fams[r["family"]].append(r["best_speedup"])
    out["per_family_geomean"] = {f: geomean([kept_speedup(b) for b in v]) for f, v in fams.items()}
    compiled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in recs:
        compiled[r["family"]][0] += r["compiled"]
        compiled[r["family"]][1] += r["n"]
    out["per_family_compile_rate"] = {f: c / n if n else None for f, (c, n) in compiled.items()}
    return out


def _baselines(cfg: EvalConfig, ev, ref, A, fam: str, op: Op, k: int | None) -> dict[str, dict]:
    """The baselines' records on one matrix: cuSPARSE, the library oracle, the rule-based selector."""
    from sparserl.eval.selector import select_variant
    from sparserl.kernels.library import variants
    from sparserl.matrices import compute_features

    out = {}
    if "cusparse" in cfg.baselines:
        b = ev.baseline(ref, op, k)["baselines"]["cold"]
        out["cuSPARSE"] = {"family": fam, "n": 1, "compiled": 1, "correct": 1, "best_speedup": 1.0,
                           "best_format": "CSR (cuSPARSE)", "roofline": b["roofline"], "kinds": {"none": 1},
                           "sample_speedups": [1.0]}
    if "oracle" in cfg.baselines:
        rec = _record(ev.evaluate_many([(v.render(), ref, op, k) for v in variants(op, None, k)]), fam)
        rec["n"], rec["compiled"], rec["correct"] = 1, 1, int(rec["best_speedup"] is not None)
        rec["sample_speedups"] = [rec["best_speedup"]]  # the oracle is one pick: its best
        out["library oracle"] = rec
    if "selector" in cfg.baselines:
        v = select_variant(compute_features(A), op)
        out["rule-based selector"] = _record([ev.evaluate(v.render(), ref, op, k)], fam)
    return out


def evaluate(cfg: EvalConfig, evaluator=None, policies: dict | None = None) -> dict:
    """Run the evaluation; writes eval.json, eval.md and plots to ``cfg.out``; returns the summary."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.matrices.card import prompt_card
    from sparserl.model.policy import make_sample, uses_card

    t0 = time.perf_counter()
    op = Op(cfg.op)
    k = cfg.k if op is Op.SPMM else None
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    own = evaluator is None
    ev = evaluator or Evaluator(HarnessConfig(compile_only=cfg.compile_only, regimes=("cold",)))
    if not cfg.compile_only and not ev.has_gpu:
        raise SparseRLError("no GPU visible: evaluation needs the harness on a GPU (or --compile-only)")
    policies = dict(policies or {})
    if cfg.checkpoints:
        from sparserl.model.policy import Policy
        from sparserl.devices import pick_device

        device = str(pick_device("auto"))
        for spec in cfg.checkpoints:
            name, _, path = spec.rpartition("=") if "=" in spec else (Path(spec).name, "", spec)
            policies[name] = Policy.open(path, device=device)
    systems: dict[str, dict[str, dict]] = defaultdict(dict)
    oracle_fmt: dict[str, str | None] = {}
    (out / "completions.jsonl").unlink(missing_ok=True)
    todo: list[tuple[str, str, object, dict]] = []  # (matrix, family, harness ref, {policy: Sample})
    drawn: list[tuple[str, str, bool]] = []  # (policy, completion, correct): where samples come from
    try:
        for mname, fam, A in matrix_set(cfg):
            ref = ev.register(A, mname)
            card = prompt_card(A) if any(uses_card(pol.config) for pol in policies.values()) else None  # once
            todo.append((mname, fam, ref, {pname: make_sample(A, pol.config, op, k, card=card)
                                           for pname, pol in policies.items()}))
            if not cfg.compile_only:  # the baselines are timings: nothing to compare without a GPU
                for name, rec in _baselines(cfg, ev, ref, A, fam, op, k).items():
                    systems[name][mname] = rec
                if "library oracle" in systems:
                    oracle_fmt[mname] = systems["library oracle"][mname]["best_format"]
                log.info("baselines done for %s", mname)
        for pname, pol in policies.items():  # all matrices' samples in full batches, then the harness
            jobs = [(mname, fam, ref, samples[pname]) for mname, fam, ref, samples in todo for _ in range(cfg.samples)]
            texts: list[str] = []
            for i in range(0, len(jobs), cfg.gen_batch):
                texts += pol.generate([j[3] for j in jobs[i:i + cfg.gen_batch]], max_new_tokens=cfg.max_new_tokens,
                                      temperature=cfg.temperature, seed=cfg.seed + i)
                log.info("%s: generated %d of %d completions", pname, len(texts), len(jobs))
            rs = ev.evaluate_many([(t, j[2], op, k) for t, j in zip(texts, jobs)])
            for n, (mname, fam, _, _) in enumerate(todo):
                systems[pname][mname] = _record(rs[n * cfg.samples:(n + 1) * cfg.samples], fam)
            drawn += [(pname, t, r.correct) for t, r in zip(texts, rs)]
            with (out / "completions.jsonl").open("a") as f:  # every sample, for reading the failures
                for t, j, r in zip(texts, jobs, rs):
                    f.write(json.dumps({"system": pname, "matrix": j[0], "verdict": r.error_kind.value,
                                        "message": (r.message or "")[:500], "format": r.format,
                                        "speedup": r.speedup, "completion": t}) + "\n")
            log.info("evaluated %s on %d matrices", pname, len(todo))
    finally:
        if own:
            ev.close()
    summary = {name: summarize(recs, cfg.samples) for name, recs in systems.items()}
    confusion = {name: dict(Counter(f"{oracle_fmt.get(m)} -> {r['best_format']}" for m, r in recs.items()))
                 for name, recs in systems.items() if name in policies and oracle_fmt}
    result = {"config": asdict(cfg), "op": op.value, "k": k, "summary": summary, "per_matrix": systems,
              "format_confusion_vs_oracle": confusion, "paper": PAPER, "seconds": time.perf_counter() - t0,
              "compile_only": cfg.compile_only}
    if not cfg.compile_only:  # compile-only verifies nothing, so no sample is correct
        result["provenance"] = provenance_table(drawn, op)
    (out / "eval.json").write_text(json.dumps(result, indent=1, default=str))
    from sparserl.eval.report import markdown, plots

    (out / "eval.md").write_text(markdown(result))
    if cfg.plots and not cfg.compile_only:  # compile-only: nothing was timed, so no speedup to plot
        result["plots"] = plots(result, out)
    return result

"""``sparserl evaluate``: systems side by side on a matrix set, in one run.

Systems: policy checkpoints (each sampled ``samples`` times per matrix), and the baselines
cuSPARSE (speedup 1 by definition), the library oracle (fastest verified library variant)
and the rule-based selector (:func:`sparserl.request.library.select_variant`). Everything goes through the
same harness in the same run, so every ratio is measured side by side.

Per system: compile rate and correctness over all samples, unbiased pass@1 and pass@k,
fast_p (p = 1.0, 1.2, 1.5) on each matrix's best correct kernel, geometric-mean speedup
of the best of the ``samples`` kernels (a matrix with no correct kernel, or only correct kernels
slower than cuSPARSE, counts as 1.0: the user keeps cuSPARSE; :func:`~sparserl.eval.metrics.kept_speedup`)
and, at their raw speed, over the matrices it covers; speedup@1 (what one sampled kernel
gives, estimated from all samples, by the same rule), roofline fraction; broken down per structure family and per format
chosen, with a format confusion table against the oracle, and where the policies' samples come
from against the library (:mod:`sparserl.eval.library_match`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sparserl.checks import check_op, require, require_folders
from sparserl.data.rows import read_nonempty
from sparserl.devices import pick_device
from sparserl.errors import SparseRLError
from sparserl.eval.library_match import library_match_table
from sparserl.eval.metrics import fast_p, geomean, kept_speedup, mean_pass_at_k, speedup_at_1
from sparserl.eval.report import markdown, plots
from sparserl.eval.specs import checkpoint_specs, system_temperatures
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import family_names, generate_many
from sparserl.matrices.card import MatrixCard, structure_fingerprint
from sparserl.matrices.fingerprints import structures_in
from sparserl.matrices.io import matrices_in
from sparserl.model.config import POLICY_TEMPERATURE
from sparserl.parallel import parallel_map
from sparserl.request.context import MatrixContext
from sparserl.request.library import select_variant
from sparserl.request.warm import warm_contexts

if TYPE_CHECKING:
    from sparserl.model.policy import Policy

log = logging.getLogger(__name__)

# The paper's own figures, as it reports them (not re-measured here).
PAPER = {"source": "SparseRL, ICLR 2026 (the paper's reported figures)",
         "compile_rate": 0.575, "pass_at_1": 0.10, "geomean_speedup": 1.42, "gpu": "V100"}
FAST_PS = (1.0, 1.2, 1.5)
BASELINES = ("cusparse", "oracle", "selector")
SPLITS = ("train", "val", "test")
REAL_MATRICES = ("all", "only", "none")


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate and on which matrices."""

    matrices: str = "runs/data"
    """An SFT data folder (uses ``split``), a folder of .mtx/.mtx.gz/.npz, or 'families' (one generated per family)."""
    split: str = "test"
    """Split of an SFT data folder: 'train', 'val' or 'test'."""
    real_matrices: str = "all"
    """Of a data folder's split, 'all' its matrices, 'only' the real ones (family 'real': a folder of real
    matrices given to ``data build --real-dir``) or 'none' of those (the generated ones)."""
    family_rows: int = 200_000
    """Rows of each generated matrix when matrices='families'."""
    checkpoints: tuple[str, ...] = ()
    """Policy checkpoints as NAME=PATH (or PATH; the folder name is used)."""
    baselines: tuple[str, ...] = BASELINES
    """Baselines run beside the policies: 'cusparse', 'oracle', 'selector'."""
    op: str = "spmv"
    """'spmv' or 'spmm'."""
    k: int | None = None
    """SpMM columns (required for spmm, refused for spmv)."""
    samples: int = 8
    """Completions per matrix per checkpoint (pass@k uses them)."""
    temperature: float = POLICY_TEMPERATURE
    """Sampling temperature (> 0; :data:`sparserl.model.config.POLICY_TEMPERATURE` by default)."""
    system_temperatures: tuple[str, ...] = ()
    """NAME=T: the checkpoint named NAME sampled at T instead of ``temperature``. One checkpoint given twice under
    two names (``-c a=CKPT -c a_t0.7=CKPT``) is then sampled at two temperatures on the same matrices, beside the
    same baselines' timings (and opened once)."""
    header_grammar: bool = False
    """Sample each header within the contract's grammar (:mod:`sparserl.model.header_grammar`)."""
    max_new_tokens: int | None = None
    """Longest completion, in tokens (None: the longest library kernel in the policy's tokens plus a margin,
    :mod:`sparserl.model.budget`)."""
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
    limit: int = 0
    """At most this many of a listed set's matrices, evenly spaced in its order (0: all)."""
    distinct_from: tuple[str, ...] = ()
    """Folders of the matrices a policy was trained on (a data folder, the teacher's matrices): the set is
    refused when one of its matrices has the structure of one of theirs (it would not be held out)."""
    retime: int = 0
    """Passes of a second look (0: none): on each matrix, every system's best kernel (the oracle's pick, the
    selector's, each policy's best sample) timed again side by side, fresh, one evaluation at a time and every
    other pass in the reverse order (:func:`sparserl.eval.retime.retime_distinct`). A best of N and the oracle's
    pick are each the fastest of single timings; their medians over these passes carry no such selection, so
    ratios between systems (``geomean_speedup_retimed``) are read off them."""

    def __post_init__(self) -> None:
        bad = set(self.baselines) - set(BASELINES)
        if bad:
            raise SparseRLError(f"unknown baselines {sorted(bad)}; choose from {BASELINES}")
        check_op(self.op, self.k)
        require(self.samples >= 1, "--samples", ">= 1", self.samples)
        require(self.gen_batch >= 1, "--gen-batch", ">= 1", self.gen_batch)
        require(self.family_rows >= 1, "--family-rows", ">= 1", self.family_rows)
        if self.split not in SPLITS:
            raise SparseRLError(f"--split {self.split!r}: a data folder's splits are {', '.join(SPLITS)}")
        if self.real_matrices not in REAL_MATRICES:
            raise SparseRLError(f"real_matrices {self.real_matrices!r}: one of {', '.join(REAL_MATRICES)}")
        if self.matrices == "families" and self.real_matrices != "all":
            raise SparseRLError("--real-matrices picks among a data folder's matrices; 'families' are all generated")
        require(self.temperature > 0, "--temperature", "> 0 (1.0: the policy as trained)", self.temperature)
        named = {name for name, _ in checkpoint_specs(self.checkpoints)}
        for spec in self.system_temperatures:
            (name,) = system_temperatures((spec,))  # raises on a malformed spec, naming it
            if name not in named:
                raise SparseRLError(f"--system-temperature {spec!r}: no checkpoint is named {name!r} "
                                    f"(named: {', '.join(sorted(named)) or 'none'})")
        require(self.max_new_tokens is None or self.max_new_tokens >= 1, "--max-new-tokens", ">= 1",
                self.max_new_tokens)
        require(self.seed >= 0, "--seed", ">= 0", self.seed)
        require(self.limit >= 0, "--limit", ">= 0 (0: every matrix)", self.limit)
        require(self.retime >= 0, "--retime", ">= 0 (0: no second look)", self.retime)
        if self.retime and self.compile_only:
            raise SparseRLError("--retime times the kernels again on a GPU, and this run is compile-only "
                                "(--compile-only, or no GPU visible)")
        require_folders("--distinct-from", self.distinct_from, "a data folder or a folder of matrices")


def evenly(items: list, n: int) -> list:
    """``n`` of ``items`` evenly spaced in their order (all of them when ``n`` is 0 or at least their number)."""
    if n <= 0 or n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def matrix_files(cfg: EvalConfig) -> list[tuple[str, str]] | None:
    """(file, family) of the evaluation set's matrices (``cfg.limit`` of them evenly spaced, when
    set), checked and listed without loading them; None for 'families' (generated, one per family).
    Raises SparseRLError for a set that has none."""
    if cfg.matrices == "families":
        return None
    return evenly(_listed_files(cfg), cfg.limit)


def _listed_files(cfg: EvalConfig) -> list[tuple[str, str]]:
    p = Path(cfg.matrices)
    if not (p / f"{cfg.split}.jsonl").exists() and any((p / f"{s}.jsonl").exists() for s in SPLITS):
        raise SparseRLError(f"{p} is a data folder without a {cfg.split!r} split ({cfg.split}.jsonl): "
                            f"choose --split from {', '.join(s for s in SPLITS if (p / f'{s}.jsonl').exists())}")
    if (p / f"{cfg.split}.jsonl").exists():
        seen: dict[str, str] = {}
        for r in read_nonempty(p / f"{cfg.split}.jsonl"):
            if r.matrix and {"all": True, "only": r.family == "real", "none": r.family != "real"}[cfg.real_matrices]:
                seen.setdefault(r.matrix, r.family or "?")
        if not seen and cfg.real_matrices != "all":
            raise SparseRLError(f"{p}: the {cfg.split} split holds no "
                                + ("real matrices (build the data with --real-dir)" if cfg.real_matrices == "only"
                                   else "generated matrices (only real ones: ask for all or only those)"))
        return sorted(seen.items())
    if p.is_dir():
        files = matrices_in(p)
        if files and cfg.real_matrices != "all":
            raise SparseRLError(f"{p} is a folder of matrices, all of them real: --real-matrices picks among a "
                                "data folder's (leave it at all)")
        if files:
            return [(str(f), "real") for f in files]
    raise SparseRLError(f"{cfg.matrices}: no matrices (give a data folder, a folder of matrices, or 'families')")


FAMILY_SET_SEED = 7
"""Added to :attr:`EvalConfig.seed` for the families set's matrices (``--matrices families``)."""


def family_set(family_rows: int, seed: int = 0) -> list[tuple[str, object]]:
    """(family, matrix) of the families set at ``family_rows`` rows, as ``evaluate --matrices families`` (and the
    policy script's held-out families set) makes it with seed ``seed``: one matrix per classic family."""
    fams = family_names()
    return list(zip(fams, generate_many(fams, family_rows, seed=seed + FAMILY_SET_SEED)))


def matrix_set(cfg: EvalConfig, files: list[tuple[str, str]] | None = None) -> list[tuple[MatrixContext, str]]:
    """(matrix, family) pairs of the evaluation set (``files``: :func:`matrix_files`'s, when listed
    already), each matrix asked for ``cfg``'s op."""
    op = Op(cfg.op)
    if cfg.matrices == "families":
        out = [(MatrixContext(A, f"{f}_{cfg.family_rows}", op, cfg.k), f)
               for f, A in family_set(cfg.family_rows, cfg.seed)]
    else:
        listed = files or matrix_files(cfg)
        loaded = parallel_map(lambda mf: MatrixContext.load(mf[0], op, cfg.k), listed, name="load")
        out = [(ctx, fam) for ctx, (_, fam) in zip(loaded, listed)]
    if cfg.distinct_from:
        trained = structures_in(cfg.distinct_from)
        for ctx, _ in out:
            if (same := trained.get(structure_fingerprint(ctx.A))) is not None:
                raise SparseRLError(f"{ctx.name} has the structure of {same} in {', '.join(cfg.distinct_from)}: "
                                    "it is not held out from them")
    return out


def _best(results) -> int | None:
    """The index of the fastest correct, timed result (None: none is)."""
    good = [i for i, r in enumerate(results) if r.correct and r.speedup]
    return max(good, key=lambda i: results[i].speedup) if good else None


def _record(results, family: str) -> dict:
    """Summary of one system's evaluations on one matrix."""
    i = _best(results)
    best = results[i] if i is not None else None
    timing = best.timings.get(best.regime) if best is not None else None  # the regime its speedup is in
    return {"family": family, "n": len(results), "compiled": sum(r.compiled for r in results),
            "correct": sum(r.correct for r in results), "best_speedup": best.speedup if best else None,
            "best_us": timing.median_us if timing is not None else None,
            "best_format": best.format if best else None, "roofline": best.roofline if best else None,
            "kinds": dict(Counter(r.error_kind.value for r in results)),
            "sample_speedups": [r.speedup if r.correct and r.speedup else None for r in results]}


TIMED_FIGURES = ("correct_rate", "pass@1", "coverage", "geomean_speedup", "geomean_speedup_covered", "speedup@1",
                 "roofline_mean", *(f"fast_{p}" for p in FAST_PS))
"""What a compile-only run (no GPU) cannot measure: nothing was run, so nothing is correct or fast."""


def summarize(per_matrix: dict[str, dict], samples: int, timed: bool = True) -> dict:
    """Aggregate one system's per-matrix records (pure). ``timed``: whether the kernels ran on a GPU;
    without (compile-only) only compile rates are measured, and every other figure is None (a
    speedup of 1.0 or a correct rate of 0 would be a figure nobody measured)."""
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
    if recs and all("retimed_speedup" in r for r in recs):  # the evaluation's second look (EvalConfig.retime)
        again = [r["retimed_speedup"] for r in recs]
        out["geomean_speedup_retimed"] = geomean([kept_speedup(s) for s in again])
        out["retime_failed"] = sum(r["best_speedup"] is not None and s is None for r, s in zip(recs, again))
    fams: dict[str, list] = defaultdict(list)
    for r in recs:
        fams[r["family"]].append(r["best_speedup"])
    out["per_family_geomean"] = {f: geomean([kept_speedup(b) for b in v]) for f, v in fams.items()}
    compiled: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in recs:
        compiled[r["family"]][0] += r["compiled"]
        compiled[r["family"]][1] += r["n"]
    out["per_family_compile_rate"] = {f: c / n if n else None for f, (c, n) in compiled.items()}
    if not timed:
        out |= {key: None for key in (*TIMED_FIGURES, f"pass@{samples}")} | {"per_family_geomean": {}}
    return out


def cusparse_times(ev, ref, op, k, name: str) -> dict:
    """``ev.baseline`` on one matrix, run once more if it fails (a worker killed for time or lost to a
    fault is restarted, and a set of matrices should not end on one such job); a second failure stops the
    evaluation with the matrix and the harness's message, since no speedup means anything without it."""
    for attempt in (1, 2):
        res = ev.baseline(ref, op, k)
        if "baselines" in res:
            return res
        why = f"{res.get('error_kind', 'error')}: {res.get('message', 'no message')}"
        if attempt == 1:
            log.warning("cuSPARSE's baseline on %s failed (%s); running it once more", name, why)
    raise SparseRLError(f"cuSPARSE's baseline on {name} failed twice ({why}): the matrix cannot be evaluated "
                        "without it")


def _baselines(cfg: EvalConfig, ev, ctx: MatrixContext, fam: str) -> tuple[dict[str, dict], dict[str, str]]:
    """The baselines' records on one matrix (cuSPARSE, the library oracle, the rule-based selector) and the
    text of each one's best kernel (cuSPARSE has none)."""
    out, texts = {}, {}
    ref, op, k = ctx.ref(ev), ctx.op, ctx.k
    if "cusparse" in cfg.baselines:
        b = cusparse_times(ev, ref, op, k, ctx.name)["baselines"]["cold"]
        out["cuSPARSE"] = {"family": fam, "n": 1, "compiled": 1, "correct": 1, "best_speedup": 1.0,
                           "best_format": "CSR (cuSPARSE)", "roofline": b["roofline"], "kinds": {"none": 1},
                           "sample_speedups": [1.0]}
    if "oracle" in cfg.baselines:
        library = [v.render() for v in variants(op, None, k)]
        rs = ev.evaluate_many([(t, ref, op, k) for t in library], contenders=True)
        rec = _record(rs, fam)  # only its fastest verified kernel counts: hopeless ones stop after one launch
        if (i := _best(rs)) is not None:
            texts["library oracle"] = library[i]
        rec["n"], rec["compiled"], rec["correct"] = 1, 1, int(rec["best_speedup"] is not None)
        rec["sample_speedups"] = [rec["best_speedup"]]  # the oracle is one pick: its best
        out["library oracle"] = rec
    if "selector" in cfg.baselines:
        text = select_variant(ctx.features, op, k).render()
        out["rule-based selector"] = rec = _record([ev.evaluate(text, ref, op, k)], fam)
        if rec["best_speedup"] is not None:
            texts["rule-based selector"] = text
    return out, texts


def temperature_of(cfg: EvalConfig, name: str) -> float:
    """The temperature the system ``name`` is sampled at (:attr:`EvalConfig.system_temperatures`, else the
    set's)."""
    return system_temperatures(cfg.system_temperatures).get(name, cfg.temperature)


def open_policies(checkpoints, given: dict | None = None) -> dict[str, Policy]:
    """The policies to evaluate: those given, and ``checkpoints`` (NAME=PATH or PATH) opened unless one of
    that name was given opened (a caller evaluating several sets opens each once, then hands them over)."""
    policies = dict(given or {})
    specs = [(name, path) for name, path in checkpoint_specs(checkpoints) if name not in policies]
    if specs:
        from sparserl.model.policy import Policy  # torch

        device = str(pick_device("auto"))
        opened: dict[str, Policy] = {}  # one checkpoint under two names (two temperatures) is opened once
        for name, path in specs:
            if path not in opened:
                opened[path] = Policy.open(path, device=device)
            policies[name] = opened[path]
    return policies


def _run_policy(cfg: EvalConfig, ev, name: str, policy: Policy, todo: list[tuple[MatrixContext, str]],
                completions: Path, phases: dict[str, float]
                ) -> tuple[dict[str, dict], list[tuple[str, str, bool, str, str, MatrixCard]], dict[str, str]]:
    """One policy's samples on every matrix (generated in full batches across matrices, then judged
    by the harness): its per-matrix records, (system, completion, correct, verdict, message, the
    matrix's card) of every sample, and its best sample's text by matrix; each sample is appended to
    ``completions``, and the seconds of generating and judging are added to ``phases``."""
    jobs = [ctx for ctx, _ in todo for _ in range(cfg.samples)]
    texts: list[str] = []
    t0 = time.perf_counter()
    for i in range(0, len(jobs), cfg.gen_batch):
        texts += policy.generate([ctx.sample(policy.config) for ctx in jobs[i:i + cfg.gen_batch]],
                                 max_new_tokens=cfg.max_new_tokens, temperature=temperature_of(cfg, name),
                                 seed=cfg.seed + i,
                                 header_grammar=cfg.header_grammar)
        log.info("%s: generated %d of %d completions", name, len(texts), len(jobs))
    t1 = time.perf_counter()
    rs = ev.evaluate_many([(t, ctx.ref(ev), ctx.op, ctx.k) for t, ctx in zip(texts, jobs)])
    phases[f"{name}: generate"], phases[f"{name}: judge"] = t1 - t0, time.perf_counter() - t1
    records, best = {}, {}
    for n, (ctx, fam) in enumerate(todo):
        mine = rs[n * cfg.samples:(n + 1) * cfg.samples]
        records[ctx.name] = _record(mine, fam)
        if (i := _best(mine)) is not None:
            best[ctx.name] = texts[n * cfg.samples + i]
    with completions.open("a") as f:  # every sample, for reading the failures
        for t, ctx, r in zip(texts, jobs, rs):
            f.write(json.dumps({"system": name, "matrix": ctx.name, "verdict": r.error_kind.value,
                                "message": (r.message or "")[:500], "format": r.format,
                                "speedup": r.speedup, "completion": t}) + "\n")
    log.info("evaluated %s on %d matrices", name, len(todo))
    return records, [(name, t, r.correct, r.error_kind.value, r.message or "", ctx.card)
                     for t, ctx, r in zip(texts, jobs, rs)], best


def second_look(cfg: EvalConfig, ev, todo: list[tuple[MatrixContext, str]], systems: dict[str, dict[str, dict]],
                best: dict[str, dict[str, str]]) -> None:
    """Each matrix's best kernels (``best``: system -> matrix -> text) timed again side by side,
    ``cfg.retime`` passes (:func:`sparserl.eval.retime.retime_distinct`); every system's record gets
    ``retimed_us`` (the passes' median; None where the system has no best or one pass failed) and
    ``retimed_speedup`` (cuSPARSE's time in the harness, from its first timing, over that median)."""
    from sparserl.eval.retime import median_us, retime_distinct

    for n, (ctx, _) in enumerate(todo, 1):
        texts = {name: picks[ctx.name] for name, picks in best.items() if ctx.name in picks}
        times = (retime_distinct(ev, ctx.ref(ev), ctx.op, ctx.k, texts, cfg.retime, ev.config.reward_regime)
                 if texts else {})
        for name, recs in systems.items():
            rec = recs.get(ctx.name)
            if rec is None or name == "cuSPARSE":
                continue
            again = median_us(times.get(name))
            cusparse_us = rec["best_speedup"] * rec["best_us"] if rec.get("best_us") else None
            rec["retimed_us"] = again
            rec["retimed_speedup"] = cusparse_us / again if again and cusparse_us else None
            if name in texts and again is None:
                log.warning("%s's best kernel on %s failed its second look: %s", name, ctx.name, times.get(name))
        log.info("second look: %d of %d matrices (%s)", n, len(todo), ctx.name)


def evaluate(cfg: EvalConfig, evaluator=None, policies: dict | None = None) -> dict:
    """Run the evaluation; writes eval.json, eval.md and plots to ``cfg.out``; returns the summary."""
    t0 = time.perf_counter()
    files = matrix_files(cfg)  # a set that has no matrices fails before anything is loaded or written
    policies = open_policies(cfg.checkpoints, policies)
    if not policies and (cfg.compile_only or not cfg.baselines):
        raise SparseRLError("nothing to evaluate: no policy was given (-c NAME=PATH)"
                            + (", and the baselines are timings, which need a GPU" if cfg.compile_only
                               else " and no baseline was asked for"))
    phases: dict[str, float] = {"open policies": time.perf_counter() - t0}
    t1 = time.perf_counter()
    todo = matrix_set(cfg, files)  # before anything is written: a set that does not load leaves no folder behind
    phases["matrices"] = time.perf_counter() - t1
    out = Path(cfg.out)
    ev = evaluator or Evaluator(HarnessConfig(compile_only=cfg.compile_only, regimes=("cold",)))
    systems: dict[str, dict[str, dict]] = defaultdict(dict)
    drawn: list[tuple] = []  # (policy, completion, correct, verdict, message, card) of every sample
    best: dict[str, dict[str, str]] = defaultdict(dict)  # system -> matrix -> its best kernel's text
    try:
        if not cfg.compile_only and not ev.has_gpu:
            raise SparseRLError("no GPU visible: evaluation needs the harness on a GPU (or --compile-only)")
        out.mkdir(parents=True, exist_ok=True)
        (out / "completions.jsonl").unlink(missing_ok=True)
        if policies:  # the prompts' cards and inputs, in threads: otherwise the GPU waits on them in generation
            phases["cards"] = warm_contexts((ctx for ctx, _ in todo), (p.config for p in policies.values()))
        t1 = time.perf_counter()
        for ctx, fam in todo:
            if not cfg.compile_only:  # the baselines are timings: nothing to compare without a GPU
                records, texts = _baselines(cfg, ev, ctx, fam)
                for name, rec in records.items():
                    systems[name][ctx.name] = rec
                for name, text in texts.items():
                    best[name][ctx.name] = text
                log.info("baselines done for %s", ctx.name)
        phases["baselines"] = time.perf_counter() - t1
        for name, policy in policies.items():
            systems[name], samples, best[name] = _run_policy(cfg, ev, name, policy, todo,
                                                             out / "completions.jsonl", phases)
            drawn += samples
        if cfg.retime:  # never with compile_only (EvalConfig refuses the two together)
            t1 = time.perf_counter()
            second_look(cfg, ev, todo, systems, best)
            phases["second look"] = time.perf_counter() - t1
    finally:
        if evaluator is None:
            ev.close()
    result = _result(cfg, systems, policies, drawn, time.perf_counter() - t0)
    result["phase_seconds"] = phases
    (out / "eval.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "eval.md").write_text(markdown(result))
    if cfg.plots and not cfg.compile_only:  # compile-only: nothing was timed, so no speedup to plot
        result["plots"] = plots(result, out)
    return result


def _result(cfg: EvalConfig, systems: dict[str, dict[str, dict]], policies: dict, drawn: list, seconds: float) -> dict:
    """eval.json: the config, every system's summary and per-matrix records, the formats the policies
    chose against the oracle's, and where the policies' samples come from against the library."""
    op = Op(cfg.op)
    oracle_fmt = {m: r["best_format"] for m, r in systems.get("library oracle", {}).items()}
    confusion = {name: dict(Counter(f"{oracle_fmt.get(m)} -> {r['best_format']}" for m, r in recs.items()))
                 for name, recs in systems.items() if name in policies and oracle_fmt}
    result = {"config": asdict(cfg), "op": op.value, "k": cfg.k,
              "summary": {name: summarize(recs, cfg.samples, not cfg.compile_only) for name, recs in systems.items()},
              "per_matrix": systems, "format_confusion_vs_oracle": confusion, "paper": PAPER, "seconds": seconds,
              "compile_only": cfg.compile_only}
    if not cfg.compile_only:  # compile-only verifies nothing, so no sample is correct
        result["library_match"] = library_match_table(drawn, op)
    return result

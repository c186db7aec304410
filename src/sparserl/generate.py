"""The main job: give SparseRL a matrix, get back a verified kernel and a report.

``generate_kernel`` samples N completions from the policy for the matrix, evaluates all of
them with the harness (verified against fp64, timed against cuSPARSE), and writes:

* ``kernel.cu``: the best correct kernel, as a contract completion (FORMAT/LAUNCH header + code);
* ``launch.json``: format and parameters, the LAUNCH lines, the kernel argument order, and
  the launch geometry evaluated for this matrix;
* ``report.json`` / ``report.md``: verdict, times, speedup vs cuSPARSE, roofline fraction,
  conversion cost and break-even call count, sample statistics, the runners-up.

If no sample is correct, the best verified *library* variant is returned instead, labelled
as such; if nothing beats cuSPARSE the report says so plainly. Without a GPU nothing can be
verified: ``compile_only`` writes the best *compiling* sample, marked unverified.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.harness.extract import Extracted, extract
from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.kernels.contract import Op, evaluate_launches, kernel_params

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateConfig:
    """One generate run."""

    matrix: str
    """.mtx, .mtx.gz or .npz file."""
    op: str = "spmv"
    k: int | None = None
    """SpMM columns."""
    model: str = "runs/ppo/checkpoint"
    """Policy checkpoint (or HF model folder)."""
    samples: int = 16
    temperature: float = 1.0
    max_new_tokens: int = 1536
    out: str | None = None
    """Output folder (default runs/generate/<matrix name>)."""
    library_fallback: bool = True
    """When no sample is correct, return the best verified library variant (labelled)."""
    regime: str = "cold"
    device: str = "auto"
    compile_only: bool = False
    seed: int = 0
    search: int = 0
    """After sampling, search this many more candidates (templates, mutations, policy refinements;
    see sparserl.search) and return the overall best; 0: no search."""
    store: str | None = None
    """Best-known store the search reads and updates (default: under the harness cache root)."""

    def __post_init__(self) -> None:
        if self.op not in ("spmv", "spmm"):
            raise SparseRLError(f"op must be spmv or spmm, got {self.op!r}")
        if self.op == "spmm" and (self.k is None or self.k < 1):
            raise SparseRLError("SpMM needs --k K (K >= 1)")
        if self.samples < 1:
            raise SparseRLError("samples must be >= 1")
        if self.search < 0:
            raise SparseRLError(f"--search must be >= 0 candidates, got {self.search}")


def _name(path: str) -> str:
    return Path(path).name.split(".")[0]


def _candidates(texts: list[str], results: list[EvalResult], op: Op, source: str) -> list[dict]:
    out = []
    for t, r in zip(texts, results):
        ex = extract(t, op)
        out.append({"text": ex.text if isinstance(ex, Extracted) else t, "result": r, "source": source})
    return out


def _converts(text: str, op: Op, A) -> bool:
    from sparserl.formats import accepts

    ex = extract(text, op)
    return isinstance(ex, Extracted) and accepts(A, ex.header.format, ex.header.params)


def _launch_info(text: str, op: Op, A, k: int | None) -> dict:
    from sparserl.formats import convert

    ex = extract(text, op)
    assert isinstance(ex, Extracted)
    fd = convert(A, ex.header.format, ex.header.params)
    cfgs = evaluate_launches(ex.header, op, fd.launch_env(op, k, 132))
    return {
        "op": op.value, "k": k, "format": fd.format, "format_params": fd.params,
        "launch_lines": [l.render() for l in ex.header.launches],
        "kernel_args": [f"{p.ctype} {p.name}" for p in kernel_params(fd.format, op)],
        "sizes": fd.sizes, "zero_fill_y": fd.zero_fill_y,
        "launches_for_this_matrix": [{"kernel": c.kernel, "grid": c.grid, "block": c.block, "smem": c.smem}
                                     for c in cfgs],
        "geometry_note": "grid/block evaluated with num_sms = 132 (H100/H200); LAUNCH lines hold the formulas",
    }


def _report_md(rep: dict) -> str:
    b = rep["best"]
    lines = [f"# SparseRL kernel for {rep['matrix']}", "",
             f"- matrix: {rep['shape'][0]} x {rep['shape'][1]}, {rep['nnz']} nonzeros; op {rep['op']}"
             + (f", k = {rep['k']}" if rep["k"] else ""),
             f"- verdict: **{rep['verdict']}**", f"- source: {rep['source']}",
             f"- {rep['samples'].get('label', 'samples')}: {rep['samples']['n']} "
             f"{rep['samples'].get('verb', 'drawn')}, {rep['samples']['compiled']} compiled, "
             f"{rep['samples']['correct']} correct"]
    if b.get("speedup") is not None:
        t = b["timings"].get(b["regime"], {})
        base = b["baseline"].get(b["regime"], {})
        lines += [f"- time ({b['regime']} L2): kernel {t.get('median_us', 0):.2f} us, cuSPARSE "
                  f"{base.get('median_us', 0):.2f} us ({b.get('baseline_alg')}): **{b['speedup']:.2f}x**",
                  f"- roofline fraction: {b['roofline']:.2f}",
                  f"- format {b['format']}: conversion {b['conversion_seconds'] * 1e3:.1f} ms on the host; "
                  + (f"pays off after {b['break_even_calls']:.0f} calls" if b.get("break_even_calls") is not None
                     else "not faster than cuSPARSE, so it never pays off")]
    if rep["runners_up"]:
        lines += ["", "## Runners-up (distinct kernels)", "", "| source | format | verdict | speedup |", "| --- | --- | --- | --- |"]
        for r in rep["runners_up"]:
            sp = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
            lines.append(f"| {r['source']} | {r.get('format') or '-'} | {r['verdict']} | {sp} |")
    lines += ["", "Use it: `sparserl.load_kernel(folder)` returns a callable; see launch.json for the contract."]
    return "\n".join(lines) + "\n"


def write_kernel_report(out: Path, text: str, op: Op, A, k: int | None, rep: dict, extra_md: str = "") -> None:
    """kernel.cu, launch.json, report.json and report.md (``extra_md`` appended) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel.cu").write_text(text)
    (out / "launch.json").write_text(json.dumps(_launch_info(text, op, A, k), indent=1))
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=str))
    (out / "report.md").write_text(_report_md(rep) + extra_md)


def generate_kernel(cfg: GenerateConfig, evaluator=None, policy=None) -> dict:
    """Run the main job; returns the report dict (also written to the output folder)."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
    from sparserl.kernels.library import variants
    from sparserl.matrices import load_matrix

    t0 = time.perf_counter()
    op = Op(cfg.op)
    k = cfg.k if op is Op.SPMM else None
    A = load_matrix(cfg.matrix)
    name = _name(cfg.matrix)
    out = Path(cfg.out or f"runs/generate/{name}")
    own = evaluator is None
    ev = evaluator or Evaluator(HarnessConfig(compile_only=cfg.compile_only, regimes=("cold", "warm"),
                                              reward_regime=cfg.regime))
    try:
        if not cfg.compile_only and not ev.has_gpu:
            raise SparseRLError("no GPU visible: a kernel can only be verified and timed on a GPU "
                                "(use --compile-only to see what the model writes, unverified)")
        if policy is None:
            from sparserl.model.policy import Policy
            from sparserl.devices import pick_device

            policy = Policy.open(cfg.model, device=str(pick_device(cfg.device)))
        from sparserl.encoding import MatrixInput
        from sparserl.model.policy import Sample

        sample = Sample(MatrixInput.from_matrix(A, policy.config.encoding), op, k, int(A.nnz))
        texts: list[str] = []
        for i in range(0, cfg.samples, 16):
            n = min(16, cfg.samples - i)
            texts += policy.generate([sample] * n, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                     seed=cfg.seed + i)
        ref = ev.register(A, name)
        results = ev.evaluate_many([(t, ref, op, k) for t in texts])
        cands = _candidates(texts, results, op, "model")
        searched = None
        if cfg.search:  # more candidates from a search; the best of all is returned below
            from sparserl.search.run import search_after_sampling

            extra, searched = search_after_sampling(cfg, A, name, ev, policy, texts, results, out)
            cands += extra
        if cfg.compile_only:  # nothing ran: at least the format must accept the matrix
            good = [c for c in cands if c["result"].error_kind is ErrorKind.NO_GPU and _converts(c["text"], op, A)]
        else:
            good = [c for c in cands if c["result"].ok]
        source = "model"
        if not good and cfg.library_fallback and not cfg.compile_only:
            lib = variants(op, None, k)
            lib_res = ev.evaluate_many([(v.render(), ref, op, k) for v in lib])
            lib_c = _candidates([v.render() for v in lib], lib_res, op, "library")
            good = [c for c in lib_c if c["result"].ok]
            cands += lib_c
            source = "library (no sampled kernel was correct)"
        if not good:
            raise SparseRLError(f"no {'compiling' if cfg.compile_only else 'correct'} kernel for {name}: "
                                f"{', '.join(sorted({c['result'].error_kind.value for c in cands}))}")
        key = (lambda c: c["result"].speedup or 0.0) if not cfg.compile_only else (lambda c: 0.0)
        good.sort(key=key, reverse=True)
        best = good[0]
        br = best["result"]
        if cfg.compile_only:
            verdict = "compiled, NOT verified (no GPU): do not use without checking on a GPU"
        elif br.speedup is not None and br.speedup > 1.0:
            verdict = f"correct, {br.speedup:.2f}x faster than cuSPARSE"
        else:
            verdict = (f"correct, but not faster than cuSPARSE ({br.speedup:.2f}x); "
                       "returned the best correct kernel anyway")
        runners, seen = [], {" ".join(best["text"].split())}
        for c in sorted(cands, key=key, reverse=True):  # distinct kernels only (samples often repeat)
            norm = " ".join(c["text"].split())
            if norm in seen:
                continue
            seen.add(norm)
            runners.append({"source": c["source"], "format": c["result"].format,
                            "verdict": "correct" if c["result"].correct else c["result"].error_kind.value,
                            "error_kind": c["result"].error_kind.value, "speedup": c["result"].speedup})
            if len(runners) == 5:
                break
        rep = {"matrix": name, "path": cfg.matrix, "shape": list(A.shape), "nnz": int(A.nnz), "op": op.value, "k": k,
               "verdict": verdict, "source": best["source"] if source == "model" else source,
               "verified": not cfg.compile_only, "best": br.to_dict(),
               "samples": {"n": len(texts), "compiled": sum(r.compiled for r in results),
                           "correct": sum(r.correct for r in results)},
               "runners_up": runners, "config": asdict(cfg), "seconds": time.perf_counter() - t0}
        if searched is not None:
            rep["search"] = searched
        write_kernel_report(out, best["text"], op, A, k, rep)
        rep["out"] = str(out)
        return rep
    finally:
        if own:
            ev.close()

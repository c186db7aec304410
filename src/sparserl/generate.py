"""The main job: give SparseRL a matrix, get back a verified kernel and a report.

``generate_kernel`` samples N completions from the policy for the matrix, evaluates all of
them with the harness (verified against fp64, timed against cuSPARSE), and writes:

* ``kernel.cu``: the best correct kernel, as a contract completion (FORMAT/LAUNCH header + code);
* ``launch.json``: format and parameters, the LAUNCH lines, the kernel argument order, and
  the launch geometry evaluated for this matrix;
* ``report.json`` / ``report.md``: verdict, times, speedup vs cuSPARSE, roofline fraction,
  conversion cost and break-even call count, sample statistics, the runners-up.

Every user gets a kernel:

* If no sample is usable, the reference library is searched instead: every variant is
  evaluated on the matrix and the fastest verified one returned, labelled as such.
* With no trained model (nothing at ``model``), no model is used: the library alone, with a
  note that says how to train one.
* Without a GPU nothing can be verified: ``compile_only`` returns the best *compiling*
  candidate (the model's, else the rule-based selector's library choice), marked unverified,
  with the one command that verifies it on a GPU.

Candidates from any source (samples, ``search`` more from :mod:`sparserl.search`, the library)
go through one function, :func:`best_of`, so another source of kernel texts plugs in there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sparserl.errors import SparseRLError
from sparserl.harness.extract import Extracted, extract
from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.kernel_report import write_kernel_report
from sparserl.kernels.contract import Op

log = logging.getLogger(__name__)

TRAIN_HINT = ("train one with 'sparserl demo' (every stage, small), or 'sparserl pretrain', 'sparserl data build', "
              "'sparserl sft' and 'sparserl ppo' (see the README), then pass --model")


@dataclass(frozen=True)
class GenerateConfig:
    """One generate run."""

    matrix: str
    """.mtx, .mtx.gz or .npz file."""
    op: str = "spmv"
    """'spmv' or 'spmm'."""
    k: int | None = None
    """SpMM columns (required for spmm, refused for spmv)."""
    model: str = "runs/ppo/checkpoint"
    """Policy checkpoint (or HF model folder); when there is none, only the library is searched."""
    samples: int = 16
    """Completions sampled from the policy."""
    temperature: float = 1.0
    """Sampling temperature (> 0)."""
    max_new_tokens: int = 1536
    """Longest completion, in tokens."""
    out: str | None = None
    """Output folder (default runs/generate/<matrix name>)."""
    library_fallback: bool = True
    """When no sample is usable (or there is no model), return the best library variant (labelled)."""
    regime: str = "cold"
    """L2 regime the speedup refers to: 'cold' (flushed) or 'warm'."""
    device: str = "auto"
    """Device of the model: auto, cpu or cuda[:N]."""
    compile_only: bool = False
    """No GPU: the best compiling kernel, unverified."""
    seed: int = 0
    """Sampling seed."""
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
        if self.op == "spmv" and self.k is not None:
            raise SparseRLError("--k is the column count of X for --op spmm; SpMV multiplies one vector: "
                                "leave --k out")
        if self.samples < 1:
            raise SparseRLError("samples must be >= 1")
        if not self.temperature > 0:
            raise SparseRLError(f"temperature must be > 0 (1.0 samples the policy as it is), got {self.temperature}")
        if self.regime not in ("cold", "warm"):
            raise SparseRLError(f"regime must be cold or warm, got {self.regime!r}")
        if self.search < 0:
            raise SparseRLError(f"--search must be >= 0 candidates, got {self.search}")


@dataclass
class Candidate:
    """One kernel text from some source, with its harness verdict."""

    text: str
    source: str
    """'model', 'search: ...' (a searched candidate), 'selector' (the rule-based selector's library
    variant) or 'library'."""
    result: EvalResult


def _name(path: str) -> str:
    return Path(path).name.split(".")[0]


def has_model(path: str) -> bool:
    """Whether ``path`` holds a policy checkpoint or a Hugging Face model folder."""
    return (Path(path) / "policy.json").exists() or (Path(path) / "config.json").exists()


def _converts(text: str, op: Op, A) -> bool:
    from sparserl.formats import accepts

    ex = extract(text, op)
    return isinstance(ex, Extracted) and accepts(A, ex.header.format, ex.header.params)


def best_of(texts: list[tuple[str, str]], ev, ref, A, op: Op, k: int | None,
            compile_only: bool) -> tuple[list[Candidate], list[Candidate]]:
    """Evaluate ``(text, source)`` pairs on the matrix; returns (every candidate, the usable
    ones best first). Usable: verified correct (fastest first); compile-only: compiled, with a
    format that accepts the matrix (in the given order, since nothing was timed)."""
    results = ev.evaluate_many([(t, ref, op, k) for t, _ in texts])
    cands = []
    for (t, source), r in zip(texts, results):
        ex = extract(t, op)
        cands.append(Candidate(ex.text if isinstance(ex, Extracted) else t, source, r))
    if compile_only:
        good = [c for c in cands if c.result.error_kind is ErrorKind.NO_GPU and _converts(c.text, op, A)]
    else:
        good = sorted((c for c in cands if c.result.ok), key=lambda c: c.result.speedup or 0.0, reverse=True)
    return cands, good


def best_of_results(records: list[dict], A, op: Op, compile_only: bool) -> tuple[list[Candidate], list[Candidate]]:
    """:func:`best_of` for candidates already evaluated elsewhere (``{"text", "result", "source"}``
    records, as the search returns them)."""
    cands = [Candidate(r["text"], r["source"], r["result"]) for r in records]
    if compile_only:
        good = [c for c in cands if c.result.error_kind is ErrorKind.NO_GPU and _converts(c.text, op, A)]
    else:
        good = sorted((c for c in cands if c.result.ok), key=lambda c: c.result.speedup or 0.0, reverse=True)
    return cands, good


def library_texts(A, op: Op, k: int | None) -> list[tuple[str, str]]:
    """Every library variant for the op, the rule-based selector's choice first."""
    from sparserl.eval.selector import select_variant
    from sparserl.kernels.library import variants
    from sparserl.matrices import compute_features

    pick = select_variant(compute_features(A), op)
    rest = [v for v in variants(op, None, k) if v.id != pick.id]
    return [(pick.render(), "selector")] + [(v.render(), "library") for v in rest]


def open_policy(cfg: GenerateConfig, policy=None):
    """The policy to sample: the one given, else ``cfg.model`` opened, else None (no model there)."""
    if policy is not None or not has_model(cfg.model):
        return policy
    from sparserl.devices import pick_device
    from sparserl.model.policy import Policy

    return Policy.open(cfg.model, device=str(pick_device(cfg.device)))


def sample_texts(cfg: GenerateConfig, A, op: Op, k: int | None, policy) -> list[str]:
    """``cfg.samples`` completions from the policy."""
    from sparserl.model.policy import make_sample
    from sparserl.progress import progress

    sample = make_sample(A, policy.config, op, k)
    texts: list[str] = []
    with progress() as bar:
        task = bar.add_task("sampling kernels", total=cfg.samples)
        for i in range(0, cfg.samples, 16):
            n = min(16, cfg.samples - i)
            texts += policy.generate([sample] * n, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                     seed=cfg.seed + i)
            bar.update(task, advance=n)
    return texts


def _verdict(best: Candidate, compile_only: bool) -> str:
    r = best.result
    if compile_only:
        return "compiled, NOT verified (no GPU): do not use it before checking it on a GPU"
    if r.speedup is not None and r.speedup > 1.0:
        return f"correct, {r.speedup:.2f}x faster than cuSPARSE"
    return f"correct, but not faster than cuSPARSE ({r.speedup:.2f}x); returned the best correct kernel anyway"


def _source_label(best: Candidate, used_model: bool, compile_only: bool) -> str:
    if best.source == "model":
        return "written by the model"
    if best.source.startswith("search: "):
        return best.source
    why = "no model was used" if not used_model else (
        "no sampled kernel compiled" if compile_only else "no sampled kernel was correct")
    if compile_only:  # nothing was timed: the library kernel is the selector's choice when it compiles
        pick = "the rule-based format selector's choice" if best.source == "selector" else "the first compiling variant"
        return f"library kernel: {pick} ({why})"
    return f"library kernel: the fastest verified library variant ({why})"


def _runners_up(cands: list[Candidate], best: Candidate, compile_only: bool) -> list[dict]:
    """Up to five distinct kernels after the best (samples often repeat)."""
    key = (lambda c: 0.0) if compile_only else (lambda c: c.result.speedup or 0.0)
    runners, seen = [], {" ".join(best.text.split())}
    for c in sorted(cands, key=key, reverse=True):
        norm = " ".join(c.text.split())
        if norm in seen:
            continue
        seen.add(norm)
        kind = c.result.error_kind
        verdict = "correct" if c.result.correct else "compiled" if kind is ErrorKind.NO_GPU else kind.value
        runners.append({"source": c.source, "format": c.result.format, "verdict": verdict,
                        "error_kind": kind.value, "speedup": c.result.speedup})
        if len(runners) == 5:
            break
    return runners


def _choose(cfg: GenerateConfig, A, op: Op, k: int | None, ev, ref, policy, out: Path) -> tuple:
    """The best candidate, every candidate, the model's results, the search's summary (or None)
    and notes for the user."""
    notes: list[str] = []
    policy = open_policy(cfg, policy)
    texts = sample_texts(cfg, A, op, k, policy) if policy is not None else []
    if policy is None:
        if not cfg.library_fallback and not cfg.search:
            raise SparseRLError(f"no model at {cfg.model} and --no-library-fallback given: {TRAIN_HINT}")
        notes.append(f"no model was used (nothing at {cfg.model}): this kernel was not written for your matrix "
                     f"by a model; to get one that is, {TRAIN_HINT}")
        log.warning("no model at %s: searching without one", cfg.model)
    cands, good = best_of([(t, "model") for t in texts], ev, ref, A, op, k, cfg.compile_only)
    model_results = [c.result for c in cands]
    searched = None
    if cfg.search:  # more candidates from a search (the samples enter it as evaluated)
        from sparserl.search.run import search_after_sampling

        extra, searched = search_after_sampling(cfg, A, _name(cfg.matrix), ev, policy, texts, model_results, out)
        found, good_found = best_of_results(extra, A, op, cfg.compile_only)
        cands += found
        good = sorted(good + good_found, key=lambda c: c.result.speedup or 0.0, reverse=True) \
            if not cfg.compile_only else good + good_found
    if not good and cfg.library_fallback:
        lib_texts = library_texts(A, op, k)
        if cfg.compile_only:  # nothing is timed: the selector's choice when it compiles, the rest only if not
            lib, good = best_of(lib_texts[:1], ev, ref, A, op, k, True)
            cands += lib
            lib_texts = [] if good else lib_texts[1:]
        lib, good_lib = best_of(lib_texts, ev, ref, A, op, k, cfg.compile_only)
        cands += lib
        good = good or good_lib
    if not good:
        what = "compiling" if cfg.compile_only else "correct"
        kinds = ", ".join(sorted({c.result.error_kind.value for c in cands})) or "no candidates"
        raise SparseRLError(f"no {what} kernel for {_name(cfg.matrix)}: {kinds}")
    return good[0], cands, model_results, searched, notes


def generate_kernel(cfg: GenerateConfig, evaluator=None, policy=None) -> dict:
    """Run the main job; returns the report dict (also written to the output folder)."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig
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
        best, cands, model_results, searched, notes = _choose(cfg, A, op, k, ev, ev.register(A, name), policy, out)
    finally:
        if own:
            ev.close()
    if cfg.compile_only:
        notes.append(f"unverified: without a GPU nothing is run or timed; verify it on a GPU with: "
                     f"sparserl check-kernel {out / 'kernel.cu'} --matrix {cfg.matrix}"
                     + (f" --op spmm --k {k}" if k else ""))
    rep = {"matrix": name, "path": cfg.matrix, "shape": list(A.shape), "nnz": int(A.nnz), "op": op.value, "k": k,
           "verdict": _verdict(best, cfg.compile_only),
           "source": _source_label(best, bool(model_results), cfg.compile_only),
           "verified": not cfg.compile_only, "model_used": bool(model_results), "best": best.result.to_dict(),
           "samples": {"n": len(model_results), "compiled": sum(r.compiled for r in model_results),
                       "correct": sum(r.correct for r in model_results)},
           "runners_up": _runners_up(cands, best, cfg.compile_only), "notes": notes, "config": asdict(cfg),
           "seconds": time.perf_counter() - t0}
    if searched is not None:
        rep["search"] = searched
    write_kernel_report(out, best.text, op, A, k, rep)
    rep["out"] = str(out)
    return rep

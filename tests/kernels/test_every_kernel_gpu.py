"""Every reference-library variant (both ops) and every template's seeds, verified against fp64 on a GPU.

The plan (:func:`plan`) names, for each kernel, the matrices it runs on: each library format has a
small and a medium matrix it converts (DIA on banded and stencil matrices, BSR on block matrices,
ELL on uniform rows ...); each template runs its seeds, drawn from the card of each matrix it is
listed for (specialised templates on the matrices they specialise to: diagonal offsets, block
rows, uniform or long rows baked in). SpMM runs with k = 8.

* CPU part (here): the plan covers every variant and every template on at least one small and one
  medium matrix, each template yields seeds on every matrix it is listed for, and every planned job
  gets through the harness's whole front in compile-only mode (extract, static check, compile with
  NVRTC or nvcc, PTX checks, conversion of the matrix and the LAUNCH lines planned on the host):
  what the GPU part will run is known to render, compile and convert.
* GPU part: every planned job through ONE Evaluator (parallel compiles, a single worker per GPU,
  cold regime, the fewest timing trials the config allows: only the verdict matters here); each
  must come back correct (the harness's full verification: seven inputs, NaN poison, guards, the
  fresh-valued twin, the determinism re-run, checked timed runs). The table of which kernel ran on
  which matrix is printed and written as JSON to ``$SPARSERL_GPU_REPORT`` (a folder) when set.

Mutations this file kills: a kernel whose CUDA is wrong on some structure (its verdict), a
variant or template left out of the plan or listed only on matrices its format refuses (the
coverage checks), a template whose seeds vanish on the matrices it is meant for.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

from sparserl.harness.compile import CompileOptions, available_backend
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.kernels.contract import Op, split_completion
from sparserl.kernels.library import all_variants
from sparserl.kernels.templates import templates
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card

SPMM_K = 8
"""Columns of X for SpMM (a multiple of 4: every vec=4 variant applies)."""
SMALL, MEDIUM = "small", "medium"


@dataclass(frozen=True)
class Mat:
    """One test matrix: a generator call and its size class."""

    name: str
    size: str
    family: str
    rows: int
    params: dict = field(default_factory=dict, hash=False)
    cols: int | None = None

    def build(self):
        return generate(self.family, self.rows, cols=self.cols, seed=1, **self.params)


MATRICES = {m.name: m for m in (
    # small: 12k-130k nonzeros; odd sizes, cut edge blocks, a few long rows
    Mat("random_s", SMALL, "random", 4001, {"nnz_per_row": 16}),
    Mat("random3_s", SMALL, "random", 4001, {"nnz_per_row": 3}),  # rows shorter than one 16-byte load
    Mat("powerlaw_s", SMALL, "powerlaw", 6000),
    Mat("skewed_s", SMALL, "skewed", 6000, {"long_len": 2000, "long_fraction": 0.002}),
    Mat("banded_s", SMALL, "banded", 4003, {"bands": 9}),
    Mat("stencil2d_s", SMALL, "stencil2d", 4900),
    Mat("block8_s", SMALL, "block", 4000, {"block": 8, "blocks_per_row": 4}),
    Mat("block4_cut_s", SMALL, "block", 4002, {"block": 4, "blocks_per_row": 3}, cols=3001),
    # medium: 0.6M-0.9M nonzeros; rows of 30000 entries (past every csr_adaptive long_len)
    Mat("random_m", MEDIUM, "random", 60_003, {"nnz_per_row": 12}),
    Mat("skewed_m", MEDIUM, "skewed", 100_000, {"short_len": 6, "long_len": 30_000, "long_fraction": 0.0001}),
    Mat("powerlaw_m", MEDIUM, "powerlaw", 80_000),
    Mat("stencil3d_m", MEDIUM, "stencil3d_7", 91_125),
    Mat("block8_m", MEDIUM, "block", 24_000, {"block": 8, "blocks_per_row": 4}),
)}

LIBRARY_MATRICES = {
    "CSR": ("powerlaw_s", "skewed_m"),
    "COO": ("skewed_s", "powerlaw_m"),
    "ELL": ("random_s", "random_m"),
    "SELL": ("powerlaw_s", "powerlaw_m"),
    "DIA": ("banded_s", "stencil3d_m"),
    "BSR": ("block8_s", "block8_m"),
    "HYB": ("skewed_s", "powerlaw_m"),
}
"""Where each format's library variants run (and the seeds of the templates made from them)."""

TEMPLATE_MATRICES = {
    "csr_adaptive": ("powerlaw_s", "skewed_s", "skewed_m"),
    "csr_adaptive_spec": ("random_s", "powerlaw_s", "skewed_s", "skewed_m", "powerlaw_m"),
    "csr_lanes": ("random_s", "powerlaw_s", "random_m"),
    "csr_lanes_spec": ("random_s", "random3_s", "block8_s", "random_m"),
    "csr_split_spec": ("powerlaw_s", "skewed_s", "powerlaw_m"),
    "dia_window": ("banded_s", "stencil2d_s", "stencil3d_m"),
    "dia_window_spec": ("banded_s", "stencil2d_s", "stencil3d_m"),
    "bsr_stream": ("block8_s", "block4_cut_s", "block8_m"),
    "bsr_stream_spec": ("block8_s", "block4_cut_s", "block8_m"),
    "hyb_vec": ("skewed_s", "powerlaw_s", "skewed_m", "powerlaw_m"),
}
"""Where the templates beyond the library's strategies run: the specialised ones on matrices whose
card they bake in (uniform rows, long rows, diagonal offsets, equal block rows; csr_split_spec where some
rows are longer than 256 and none over 16384)."""


@dataclass(frozen=True)
class Job:
    """One kernel on one matrix."""

    kernel: str
    """``variant:<library id>`` or ``seed:<template candidate id>``."""
    op: str
    k: int | None
    matrix: str
    text: str


@lru_cache(maxsize=1)
def matrices() -> dict:
    return {name: m.build() for name, m in MATRICES.items()}


@lru_cache(maxsize=1)
def cards() -> dict:
    return {name: matrix_card(A) for name, A in matrices().items()}


def _k(op: Op) -> int | None:
    return SPMM_K if op is Op.SPMM else None


def template_matrices(t) -> tuple[str, ...]:
    return TEMPLATE_MATRICES.get(t.name) or LIBRARY_MATRICES[t.format]


@lru_cache(maxsize=1)
def plan() -> tuple[Job, ...]:
    """Every library variant on its format's matrices, every template's seeds on its matrices."""
    jobs = []
    for v in all_variants():
        k = _k(v.op)
        assert v.applicable(k), v.id
        for m in LIBRARY_MATRICES[v.format]:
            jobs.append(Job(f"variant:{v.id}", v.op.value, k, m, v.render()))
    for t in templates():
        k = _k(t.op)
        for m in template_matrices(t):
            card = cards()[m]
            for p in t.seeds(card, k):
                jobs.append(Job(f"seed:{t.candidate(p).id}", t.op.value, k, m, t.render(p, card)))
    return tuple(jobs)


def unique_runs(jobs) -> list[tuple[str, str, int | None, str]]:
    """The distinct (text, op, k, matrix) of ``jobs``, grouped by matrix (a worker keeps few resident)."""
    order = list(MATRICES)
    runs = {(j.text, j.op, j.k, j.matrix) for j in jobs}
    return sorted(runs, key=lambda r: (order.index(r[3]), r[1], r[0]))


def coverage(jobs, ok=lambda job: True) -> dict[str, set[str]]:
    """Per kernel (variant or template), the size classes of the matrices it ran on (where ``ok``)."""
    out: dict[str, set[str]] = defaultdict(set)
    for j in jobs:
        if ok(j):
            out[_owner(j)].add(MATRICES[j.matrix].size)
    return out


def _owner(j: Job) -> str:
    """A variant's id, or a seed's template: ``template:<op>/<name>``."""
    if j.kernel.startswith("variant:"):
        return j.kernel
    op, name = j.kernel.removeprefix("seed:").split("/")[:2]
    return f"template:{op}/{name}"


def everything() -> set[str]:
    return {f"variant:{v.id}" for v in all_variants()} | {f"template:{t.op.value}/{t.name}" for t in templates()}


# -- CPU: the plan, rendered, compiled and planned on the host ----------------------------------


def test_plan_covers_every_variant_and_template_on_small_and_medium_matrices() -> None:
    jobs = plan()
    cov = coverage(jobs)
    assert len(all_variants()) == 120 and set(cov) == everything(), sorted(everything() - set(cov))
    missing = {owner: sorted({SMALL, MEDIUM} - sizes) for owner, sizes in cov.items() if sizes != {SMALL, MEDIUM}}
    assert not missing, missing
    for t in templates():  # every matrix a template is listed for suits it: it has seeds there
        for m in template_matrices(t):
            assert t.seeds(cards()[m], _k(t.op)), (t.name, m)
    spec = {t.name for t in templates() if t.specialised}
    assert spec == {"csr_adaptive_spec", "csr_lanes_spec", "csr_split_spec", "dia_window_spec", "bsr_stream_spec"}, spec


@pytest.fixture(scope="module")
def host_results():
    """Every distinct planned run through the harness's front in compile-only mode (compile cache:
    the user's, as the library compile test, so reruns take seconds)."""
    if available_backend(CompileOptions()) is None:
        pytest.skip("no CUDA compiler (NVRTC or nvcc)")
    runs = unique_runs(plan())
    with Evaluator(HarnessConfig(compile_only=True)) as ev:
        refs = {name: ev.register(A, name) for name, A in matrices().items()}
        results = ev.evaluate_many([(text, refs[m], op, k) for text, op, k, m in runs])
    return dict(zip(runs, results))


def test_every_planned_kernel_compiles_and_its_matrix_converts(host_results) -> None:
    bad = [(m, op, r.error_kind.value, r.message[:200], text.splitlines()[0])
           for (text, op, k, m), r in host_results.items()
           if not (r.compiled and r.error_kind is ErrorKind.NO_GPU)]
    assert not bad, bad[:5]
    for (text, op, k, m), r in host_results.items():
        assert r.format == split_completion(text, Op(op))[0].format


# -- GPU: every planned kernel runs and verifies ---------------------------------------------------


def _report(jobs, verdicts: dict, seconds: float) -> str:
    """Which kernel ran on which matrix, with its verdict; written to $SPARSERL_GPU_REPORT if set."""
    lines = [f"{len(jobs)} jobs, {len(verdicts)} distinct runs in {seconds:.1f} s"]
    by_kernel: dict[str, list[str]] = defaultdict(list)
    for j in jobs:
        r = verdicts[(j.text, j.op, j.k, j.matrix)]
        by_kernel[j.kernel].append(f"{j.matrix}:{'ok' if r.ok else r.error_kind.value}")
    lines += [f"{kernel:70s} {' '.join(ms)}" for kernel, ms in sorted(by_kernel.items())]
    folder = os.environ.get("SPARSERL_GPU_REPORT")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        rows = [asdict(j) | {"text": None, "verdict": verdicts[(j.text, j.op, j.k, j.matrix)].error_kind.value,
                             "message": verdicts[(j.text, j.op, j.k, j.matrix)].message,
                             "time_us": (verdicts[(j.text, j.op, j.k, j.matrix)].timings.get("cold").median_us
                                         if verdicts[(j.text, j.op, j.k, j.matrix)].ok else None)}
                for j in jobs]
        (Path(folder) / "every_kernel_gpu.json").write_text(json.dumps({"seconds": seconds, "jobs": rows}, indent=1))
    return "\n".join(lines)


@pytest.mark.gpu
def test_every_variant_and_template_seed_verifies_on_the_gpu(tmp_path_factory) -> None:
    jobs = plan()
    runs = unique_runs(jobs)
    cfg = HarnessConfig(regimes=("cold",), reward_regime="cold", cold_trials=3, warm_trials=3, warmup=0,
                        cache_dir=str(tmp_path_factory.mktemp("every_kernel")))
    t0 = time.perf_counter()
    with Evaluator(cfg) as ev:
        refs = {name: ev.register(A, name) for name, A in matrices().items()}
        results = ev.evaluate_many([(text, refs[m], op, k) for text, op, k, m in runs])
    verdicts = dict(zip(runs, results))
    print(_report(jobs, verdicts, time.perf_counter() - t0))
    failed = [(j.kernel, j.matrix, verdicts[(j.text, j.op, j.k, j.matrix)].error_kind.value,
               verdicts[(j.text, j.op, j.k, j.matrix)].message[:300]) for j in jobs
              if not verdicts[(j.text, j.op, j.k, j.matrix)].ok]
    assert not failed, f"{len(failed)} of {len(jobs)} jobs failed: {failed[:8]}"
    ran = coverage(jobs, lambda j: verdicts[(j.text, j.op, j.k, j.matrix)].ok)
    assert set(ran) == everything() and all(s == {SMALL, MEDIUM} for s in ran.values())
    for r in results:  # verified and timed, as the harness reports a correct kernel
        assert r.correct and r.max_scaled_error is not None and r.max_scaled_error <= 1.0
        assert r.timings["cold"].median_us > 0 and r.speedup and r.speedup > 0

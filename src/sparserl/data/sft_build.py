"""SFT data: (matrix, correct kernel) pairs from the reference library, checked by the harness.

For every matrix (generated families at seeded sizes, plus real matrices from a folder),
every applicable library variant is evaluated by the harness; the variants that come back
correct are the candidates, and the target is drawn among them (``target="correct"``, the
default, so SFT learns correctness and leaves speed to RL) or is the fastest
(``target="fastest"``). Without a GPU (``compile_only``) "correct" means compiled and the
format accepted the matrix, and no times are recorded.

Splits are by matrix and seeded; real matrices (a SuiteSparse folder) go to the test split
by default (``real_split="mixed"``: split like a family's). No two matrices share a structure, and none
repeats one of ``distinct_from``'s folders (:func:`make_matrices`): a held-out matrix is never a training
matrix under another name. Output folder: ``matrices/`` (one ``.npz`` per matrix), ``train.jsonl``,
``val.jsonl``, ``test.jsonl`` and ``summary.json``; each row a :class:`~sparserl.data.rows.SFTRow`
(rows/cols: up to ``coords`` sampled nonzeros).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sparserl.checks import require, require_folders
from sparserl.data.rows import KernelTimes, RowWriter, SFTRow
from sparserl.data.targets import taught_length
from sparserl.errors import SparseRLError
from sparserl.formats import accepts
from sparserl.harness.evaluator import Evaluator, HarnessConfig
from sparserl.harness.result import ErrorKind
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import family_names, generate, load_matrix, save_matrix
from sparserl.matrices.generators import draw_params, generated_name
from sparserl.matrices.card import structure_fingerprint
from sparserl.matrices.fingerprints import Fingerprints, structures_in
from sparserl.matrices.io import matrices_in
from sparserl.progress import progress

log = logging.getLogger(__name__)

TARGETS = ("correct", "fastest", "near_fastest")


@dataclass(frozen=True)
class SFTDataConfig:
    """What goes into the SFT data set."""

    out: str = "runs/data"
    """Output folder."""
    families: tuple[str, ...] = ()
    """Generator families (empty: the classic ones, ``family_names()``; application families only when named)."""
    matrices_per_family: int = 12
    """Generated matrices per family."""
    min_rows: int = 2_000
    max_rows: int = 200_000
    """Rows are drawn log-uniformly in [min_rows, max_rows]."""
    size_draw: str = "random"
    """'random': each matrix's rows drawn over the whole range; 'stratified': the range cut into
    ``matrices_per_family`` equal parts on a log scale and the i-th matrix of a family drawn in the i-th, so
    a family's sizes cover the range whatever the seed (eight random draws in [10k, 1M] left one family
    with five matrices below 100k rows, where the fastest format is not the one its 1M-row matrices need)."""
    vary_params: bool = False
    """Draw each generated matrix's structural parameters (:func:`~sparserl.matrices.generators.draw_params`:
    bands, row lengths, blocks per block row) instead of the family's defaults, so that the facts a specialised
    kernel bakes in differ from matrix to matrix: with the defaults a teacher's 105 specialised rows held 7
    distinct facts blocks, and its policy wrote facts from memory, never from the card (results of 2026-12-05,
    spec-facts-copy). Each matrix's draw is kept beside it (``NAME.params.json``)."""
    real_dir: str | None = None
    """A folder of .mtx / .mtx.gz / .npz matrices added as well (test split by default)."""
    real_split: str = "test"
    """Split for the real matrices: 'test' (default) or 'mixed' (split like the generated ones)."""
    ops: tuple[str, ...] = ("spmv",)
    """Operations: 'spmv' and/or 'spmm'."""
    ks: tuple[int, ...] = (32,)
    """SpMM column counts."""
    target: str = "correct"
    """'correct': a random correct variant; 'fastest': the fastest correct ones, in order;
    'near_fastest': random among the correct ones within ``near_fastest_ratio`` of the fastest."""
    targets_per_matrix: int = 2
    """Rows written per (matrix, op, k) in the train split (distinct variants when possible;
    'near_fastest' repeats its candidates to fill them, so every train matrix weighs the same)."""
    near_fastest_ratio: float = 1.10
    """'near_fastest': a candidate's cold time is at most this times the fastest one's."""
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    variants_per_matrix: int | None = None
    """Evaluate only this many library variants per matrix, drawn at random (seeded); None: all.
    Fewer variants per matrix buys more matrices for the same GPU time (targets stay correct)."""
    max_target_chars: int | None = None
    """Only library variants whose text as the policy is taught it (without comments) has at most
    this many characters are evaluated and written; None: every one. (The policy's held-out samples
    of ``csr_adaptive``'s kernels, 6.4k-8.8k characters, were correct once in 32.)"""
    coords: int = 1024
    """Sampled nonzeros stored in each row's rows/cols fields."""
    compile_only: bool = False
    """No GPU: 'correct' = compiled and accepted by the format (no times)."""
    distinct_from: tuple[str, ...] = ()
    """Data folders (or folders of matrices) whose structures no matrix here may repeat: the teacher's further
    matrices are made distinct from the data set's, so none of them is a held-out matrix again."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise SparseRLError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        bad = set(self.families) - set(family_names(include_application=True))
        if bad:  # the default set is the classic families; application families only when named
            raise SparseRLError(f"unknown families {sorted(bad)}; families are "
                                f"{family_names(include_application=True)}")
        if any(o not in ("spmv", "spmm") for o in self.ops) or not self.ops:
            raise SparseRLError("ops must be a non-empty subset of spmv, spmm")
        if not (0 <= self.val_fraction < 1 and 0 <= self.test_fraction < 1
                and self.val_fraction + self.test_fraction < 1):
            raise SparseRLError(f"--val-fraction and --test-fraction must each lie in [0, 1) and sum to below 1 "
                                f"(got {self.val_fraction:g} and {self.test_fraction:g})")
        if self.size_draw not in SIZE_DRAWS:
            raise SparseRLError(f"--size-draw is {' or '.join(SIZE_DRAWS)} (got {self.size_draw!r})")
        if self.real_split not in ("test", "mixed"):
            raise SparseRLError(f"--real-split is test or mixed (got {self.real_split!r})")
        if self.real_dir:
            require_folders("--real-dir", (self.real_dir,), "a folder of .mtx/.mtx.gz/.npz files")
            if not matrices_in(self.real_dir):  # said before any matrix is generated
                raise SparseRLError(f"--real-dir {self.real_dir}: no .mtx/.mtx.gz/.npz files in it")
        if self.variants_per_matrix is not None:
            require(self.variants_per_matrix >= 1, "--variants-per-matrix", ">= 1 (or left out for all)",
                    self.variants_per_matrix)
        require(self.near_fastest_ratio >= 1.0, "--near-fastest-ratio", ">= 1.0", self.near_fastest_ratio)
        if self.max_target_chars is not None:
            require(self.max_target_chars >= 1, "--max-target-chars", ">= 1 (or left out for no limit)",
                    self.max_target_chars)
        require(self.min_rows >= 1, "--min-rows", ">= 1", self.min_rows)
        require(self.max_rows >= self.min_rows, "--max-rows", f">= --min-rows ({self.min_rows})", self.max_rows)
        require(self.matrices_per_family >= 0, "--per-family", ">= 0", self.matrices_per_family)
        if self.matrices_per_family == 0 and not self.real_dir:
            raise SparseRLError("no matrices: --per-family 0 generates none and no --real-dir was given "
                                "(give --per-family N >= 1, or a folder of matrices with --real-dir)")
        require(self.targets_per_matrix >= 1, "--targets-per-matrix", ">= 1", self.targets_per_matrix)
        require(all(k >= 1 for k in self.ks), "--ks", "SpMM column counts >= 1", self.ks)
        require(self.coords >= 1, "coords", ">= 1", self.coords)
        require(self.seed >= 0, "--seed", ">= 0", self.seed)
        require_folders("--distinct-from", self.distinct_from, "a data folder or a folder of matrices")


SIZE_DRAWS = ("random", "stratified")


def draw_rows(i: int, cfg: SFTDataConfig, rng: np.random.Generator) -> int:
    """Rows of the ``i``-th generated matrix of a family (``cfg.size_draw``; one draw from ``rng`` either way,
    so 'random' gives the sizes it always gave for a seed)."""
    lo, hi = math.log(cfg.min_rows), math.log(cfg.max_rows)
    if cfg.size_draw == "stratified":
        n = max(cfg.matrices_per_family, 1)
        lo, hi = lo + (hi - lo) * i / n, lo + (hi - lo) * (i + 1) / n
    return int(math.exp(rng.uniform(lo, hi)))


MAX_REDRAWS = 32
"""Further sizes drawn for a generated matrix whose structure an earlier one has (families that ignore the seed,
such as diagonal, banded and the stencils, repeat a structure whenever two draws give the same grid) before
the build stops."""


@dataclass(frozen=True)
class MatrixEntry:
    name: str
    family: str
    path: str
    split: str


def _splits(n: int, cfg: SFTDataConfig, rng: np.random.Generator) -> list[str]:
    """Splits for ``n`` matrices of one group: floor(n * fraction) each to test and val, in a
    seeded random order, the rest (always at least one when n >= 1) to train."""
    n_test = int(n * cfg.test_fraction)
    n_val = min(int(n * cfg.val_fraction), max(0, n - n_test - 1))
    labels = ["test"] * n_test + ["val"] * n_val + ["train"] * (n - n_test - n_val)
    return [labels[i] for i in rng.permutation(n)]


def _params_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".npz") + ".params.json")


def _made_with(path: Path) -> dict[str, int] | None:
    """The parameters drawn for the matrix in ``path`` ({} for the family's defaults), or None when there is
    no such file."""
    if not path.exists():
        return None
    side = _params_path(path)
    return json.loads(side.read_text()) if side.exists() else {}


def _distinct_matrix(fam: str, i: int, cfg: SFTDataConfig, rng: np.random.Generator, out: Path,
                     prints: Fingerprints, taken: set[str]) -> tuple[str, Path, str]:
    """(name, file, fingerprint) of the ``i``-th matrix of ``fam``: a size and seed drawn (and its parameters,
    with ``cfg.vary_params``), the matrix made (unless its file is there, made with the same parameters), and
    drawn again while its structure is ``taken``."""
    for _ in range(MAX_REDRAWS + 1):
        rows = draw_rows(i, cfg, rng)
        seed = int(rng.integers(1 << 30))
        params = draw_params(fam, rng) if cfg.vary_params else {}
        name = generated_name(fam, i, rows)
        path = out / f"{name}.npz"
        if _made_with(path) == params:
            fp = prints.of(path)
        else:
            A = generate(fam, rows, seed=seed, **params)
            fp = structure_fingerprint(A)
            if fp not in taken:
                save_matrix(A, path, compress=False)  # scratch: deflating was 3/4 of the time
                prints.record(path, fp)
                if params:
                    _params_path(path).write_text(json.dumps(params) + "\n")
                else:
                    _params_path(path).unlink(missing_ok=True)
        if fp not in taken:
            return name, path, fp
        log.info("%s repeats an earlier matrix's structure: another size is drawn", name)
    raise SparseRLError(f"{fam}: {MAX_REDRAWS + 1} sizes drawn in [{cfg.min_rows}, {cfg.max_rows}] all repeat an "
                        "earlier matrix's structure (this family ignores the seed): widen --min-rows/--max-rows or "
                        "lower --per-family")


def make_matrices(cfg: SFTDataConfig) -> list[MatrixEntry]:
    """Generate (or list) the matrices and assign each to a split, seeded. No two have one structure, and none
    has the structure of a matrix in ``cfg.distinct_from``: a generated one that would is drawn again at
    another size (the seeded draws are unchanged where nothing repeats), a real one is left out with a warning.
    So no held-out matrix is a training matrix under another name."""
    out = Path(cfg.out) / "matrices"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    prints = Fingerprints(out)
    taken = set(structures_in(cfg.distinct_from))
    entries = []
    try:
        for fam in cfg.families or tuple(family_names()):
            splits = _splits(cfg.matrices_per_family, cfg, rng)
            for i in range(cfg.matrices_per_family):
                name, path, fp = _distinct_matrix(fam, i, cfg, rng, out, prints, taken)
                taken.add(fp)
                entries.append(MatrixEntry(name, fam, str(path), splits[i]))
        if cfg.real_dir:
            files = matrices_in(cfg.real_dir)
            if not files:
                raise SparseRLError(f"no .mtx/.mtx.gz/.npz files in {cfg.real_dir}")
            splits = ["test"] * len(files) if cfg.real_split == "test" else _splits(len(files), cfg, rng)
            for f, split in zip(files, splits):
                fp = prints.of(f)
                if fp in taken:
                    log.warning("%s is left out: its structure is an earlier matrix's", f.name)
                    continue
                taken.add(fp)
                entries.append(MatrixEntry(f.name.split(".")[0], "real", str(f), split))
    finally:
        prints.save()
    n_real = sum(e.family == "real" for e in entries)
    for split, frac in (("val", cfg.val_fraction), ("test", cfg.test_fraction)):
        if frac > 0 and not any(e.split == split for e in entries):
            groups = []  # what was rounded down: each generated family's share, the real matrices' share
            if cfg.matrices_per_family:
                groups.append(f"{cfg.matrices_per_family} per generated family x {frac:.2f}")
            if n_real and cfg.real_split == "mixed":
                groups.append(f"{n_real} real matrices x {frac:.2f}")
            elif n_real:
                groups.append(f"the {n_real} real matrices all go to the test split")
            log.warning("no matrix went to the %s split: the share is rounded down (%s); give more matrices "
                        "or a larger fraction", split, ", ".join(groups) or "no matrices")
    return entries


def build_sft_data(cfg: SFTDataConfig, evaluator=None) -> dict:
    """Build the data set; ``evaluator`` defaults to a harness Evaluator (compile-only if asked or no GPU).
    The summary counts the ``correct`` variants (``compiled`` ones in a compile-only build)."""
    from sparserl.encoding import sample_nonzeros  # torch

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = make_matrices(cfg)
    own = evaluator is None
    ev = evaluator or Evaluator(HarnessConfig(compile_only=cfg.compile_only, regimes=("cold",)))
    if not cfg.compile_only and not ev.has_gpu:
        raise SparseRLError("no GPU visible: building SFT data needs the harness on a GPU, or --compile-only")
    rng = np.random.default_rng(cfg.seed + 1)
    files = {s: RowWriter(out / f"{s}.jsonl") for s in ("train", "val", "test")}
    usable = "compiled" if cfg.compile_only else "correct"  # compile-only: nothing was verified
    stats = {"matrices": len(entries), "evaluations": 0, usable: 0, f"no_{usable}_variant": []}
    jobs = [(e, Op(o), k) for e in entries for o in cfg.ops for k in ((None,) if o == "spmv" else cfg.ks)]
    t0 = time.perf_counter()
    try:
        with progress() as bar:
            task = bar.add_task("sft data", total=len(jobs))
            for e, op, k in jobs:
                A = load_matrix(e.path)
                ref = ev.register(A, e.name)
                vs = taught_variants(op, k, cfg.max_target_chars)
                if cfg.variants_per_matrix is not None and cfg.variants_per_matrix < len(vs):
                    vs = [vs[i] for i in sorted(rng.choice(len(vs), cfg.variants_per_matrix, replace=False))]
                # near_fastest keeps variants within a small ratio of the fastest: one 100x slower need not be
                # verified to the end (such a variant then counts as not correct in the summary's figures)
                results = ev.evaluate_many([(v.render(), ref, op, k) for v in vs],
                                           contenders=cfg.target == "near_fastest" and cfg.near_fastest_ratio < 10)
                stats["evaluations"] += len(results)
                if cfg.compile_only:  # no worker converted the matrix: check the format accepts it here
                    accepted = _formats_accepting(A, vs)
                    good = [(v, r) for v, r in zip(vs, results)
                            if r.error_kind is ErrorKind.NO_GPU and accepted[(v.format, v.format_params)]]
                else:
                    good = [(v, r) for v, r in zip(vs, results) if r.ok]
                stats[usable] += len(good)
                bar.update(task, advance=1, description=f"sft data {e.name} {op.value}")
                if not good:
                    stats[f"no_{usable}_variant"].append(f"{e.name}/{op.value}")
                    continue
                n = cfg.targets_per_matrix if e.split == "train" else 1
                times = None if cfg.compile_only else [r.timings["cold"].median_us for _, r in good]
                picks = [good[i] for i in pick_targets(times, len(good), cfg.target, n, rng,
                                                       cfg.near_fastest_ratio)]
                r_idx, c_idx = sample_nonzeros(A, cfg.coords, cfg.seed)
                for v, res in picks:
                    measured = None if cfg.compile_only else KernelTimes(
                        res.timings["cold"].median_us, res.baseline["cold"].median_us, res.speedup, "cold")
                    files[e.split].write(SFTRow(
                        rows=r_idx.tolist(), cols=c_idx.tolist(), shape=(int(A.shape[0]), int(A.shape[1])),
                        code=v.render(), format=v.format, op=op.value, k=k, nnz=int(A.nnz), matrix=e.path,
                        family=e.family, split=e.split, variant=v.id, times=measured))
    finally:
        for f in files.values():
            f.close()
        if own:
            ev.close()
    summary = {"config": asdict(cfg), "rows": {s: f.count for s, f in files.items()}, "seconds": time.perf_counter() - t0,
               "splits": {s: sorted({e.name for e in entries if e.split == s}) for s in files}, **stats}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def taught_variants(op: Op, k: int | None, max_chars: int | None) -> list:
    """The library variants of ``op`` (and ``k``) whose taught text (:func:`taught_length`) has at
    most ``max_chars`` characters (every one when None)."""
    vs = variants(op, None, k)
    return vs if max_chars is None else [v for v in vs if taught_length(v.render()) <= max_chars]


def pick_targets(times: list[float] | None, n_good: int, target: str, n: int,
                 rng: np.random.Generator, ratio: float = 1.10) -> list[int]:
    """Indices (into the correct variants) of the rows to write for one (matrix, op, k).

    ``times``: each correct variant's cold median time, or None without a GPU, where every
    target falls back to 'correct' (a random draw, distinct variants). 'fastest': the ``n``
    fastest, fastest first. 'near_fastest': the variants within ``ratio`` of the fastest time,
    shuffled, repeated in that order to fill ``n`` rows.
    """
    if n_good == 0 or n < 1:
        return []
    if times is None or target == "correct":
        return [int(i) for i in rng.permutation(n_good)[:n]]
    if len(times) != n_good:
        raise SparseRLError(f"{len(times)} times for {n_good} correct variants")
    order = sorted(range(n_good), key=lambda i: times[i])
    if target == "fastest":
        return order[:n]
    if target != "near_fastest":
        raise SparseRLError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    best = times[order[0]]
    near = [i for i in order if times[i] <= best * ratio]
    near = [near[i] for i in rng.permutation(len(near))]
    return [near[j % len(near)] for j in range(n)]


def _formats_accepting(A, vs) -> dict[tuple, bool]:
    """Whether each (format, params) of ``vs`` converts ``A`` within the fill limits."""
    keys = {(v.format, v.format_params) for v in vs}
    return {key: accepts(A, key[0], dict(key[1])) for key in keys}

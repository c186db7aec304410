"""The answer to a kernel request, and the folder it is handed over in.

:class:`KernelReport` is what ``generate`` and ``search`` return: the kernel, its verdict and where
it came from, its measurements, the runners-up. :meth:`KernelReport.write` writes the folder:
``kernel.cu``, ``launch.json`` (format, launch lines and the launches they give for this matrix,
kernel arguments), ``report.json`` (:meth:`KernelReport.to_dict`) and ``report.md`` (verdict, times
against cuSPARSE, roofline fraction, conversion cost, runners-up).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparserl.errors import SparseRLError
from sparserl.formats import convert
from sparserl.harness.extract import Extracted, extract
from sparserl.harness.matrix_facts import materialise
from sparserl.harness.result import EvalResult
from sparserl.kernels.contract import evaluate_launches, kernel_params
from sparserl.request.candidates import Candidate, CandidatePool, Origin, RunnerUp
from sparserl.request.context import MatrixContext
from sparserl.request.second_look import SecondLook
from sparserl.search.store import kernel_sha

log = logging.getLogger(__name__)

NUM_SMS = 132
"""The SM count the launch geometry in launch.json is evaluated with (H100/H200)."""


def verdict(best: Candidate, verified: bool, look: SecondLook | None = None) -> str:
    """One line on the kernel handed back: how fast it is (by the second look's median when there was
    one), or that it is not verified."""
    if not verified:
        return "compiled, NOT verified (no GPU): do not use it before checking it on a GPU"
    sp = look.speedup if look is not None else best.result.speedup
    if sp is not None and sp > 1.0:
        return f"correct, {sp:.2f}x faster than cuSPARSE"
    return f"correct, but not faster than cuSPARSE ({sp or 0:.2f}x); returned the best correct kernel anyway"


def source_label(best: Candidate, used_model: bool, verified: bool) -> str:
    """Where the kernel handed back came from, in words (and, for a library kernel, why)."""
    if best.origin is Origin.MODEL:
        return "written by the model"
    if best.origin is Origin.MODEL_FILLED:
        return "written by the model, its block of facts from the matrix card (--fill-facts)"
    if best.origin is Origin.SEARCH:
        return best.source
    why = "no model was used" if not used_model else (
        "no sampled kernel was correct" if verified else "no sampled kernel compiled")
    if not verified:  # nothing was timed: the library kernel is the selector's choice when it compiles
        pick = ("the rule-based format selector's choice" if best.origin is Origin.SELECTOR
                else "the first compiling variant")
        return f"library kernel: {pick} ({why})"
    return f"library kernel: the fastest verified library variant ({why})"


@dataclass(frozen=True)
class Counts:
    """How many candidates of one kind a request drew, compiled and verified."""

    n: int
    compiled: int
    correct: int

    @classmethod
    def of(cls, results: list[EvalResult]) -> Counts:
        return cls(len(results), sum(r.compiled for r in results), sum(r.correct for r in results))


@dataclass
class KernelReport:
    """The kernel a request hands back and what is known about it (see the module docstring)."""

    matrix: str
    """The matrix's name."""
    path: str | None
    """Its file."""
    shape: tuple[int, int]
    nnz: int
    op: str
    k: int | None
    kernel: str
    """The kernel handed back: a contract completion (FORMAT/LAUNCH header + code)."""
    verdict: str
    source: str
    """Where it came from, in words (:func:`source_label`)."""
    verified: bool
    """Whether it was run and checked on a GPU (False: compile-only)."""
    best: EvalResult
    counts: Counts
    """The model's samples (``generate``) or the search's candidates (``search``)."""
    counted: str
    """What ``counts`` counts, in the report's words: 'samples drawn' or 'candidates evaluated'."""
    runners_up: list[RunnerUp]
    config: dict[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)
    model_used: bool | None = None
    """Whether a model proposed (``generate``; None for ``search``)."""
    search: dict[str, Any] | None = None
    """The search's summary (:func:`~sparserl.search.loop.search_summary`), when one ran."""
    out: str | None = None
    """The folder it was written to (:meth:`write`)."""
    second_look: SecondLook | None = None
    """The kernel's times when it was evaluated again before it was handed back
    (:mod:`sparserl.request.second_look`); the verdict's speedup is theirs."""
    fingerprint: str | None = None
    """The matrix's structure fingerprint (set by :meth:`write`): what the kernel was verified on."""

    @classmethod
    def of(cls, ctx: MatrixContext, best: Candidate, pool: CandidatePool, counts: list[EvalResult], counted: str,
           config: dict[str, Any], seconds: float, used_model: bool | None = None,
           second_look: SecondLook | None = None, **kw) -> KernelReport:
        """The report of ``best``, chosen from ``pool`` for ``ctx``; ``counts``: the results counted."""
        return cls(matrix=ctx.name, path=ctx.path, shape=ctx.shape, nnz=ctx.nnz, op=ctx.op.value, k=ctx.k,
                   kernel=best.text, verdict=verdict(best, pool.timed, second_look), second_look=second_look,
                   source=source_label(best, bool(used_model), pool.timed), verified=pool.timed, best=best.result,
                   counts=Counts.of(counts), counted=counted, runners_up=pool.runners_up(best), config=config,
                   seconds=seconds, model_used=used_model, **kw)

    def to_dict(self) -> dict[str, Any]:
        """report.json."""
        d = {"matrix": self.matrix, "path": self.path, "shape": list(self.shape), "nnz": self.nnz,
             **({"fingerprint": self.fingerprint} if self.fingerprint else {}), "op": self.op,
             "k": self.k, "verdict": self.verdict, "source": self.source, "verified": self.verified,
             "best": self.best.to_dict(), "samples": asdict(self.counts) | {"counted": self.counted},
             "runners_up": [asdict(r) for r in self.runners_up], "notes": list(self.notes), "config": self.config,
             "seconds": self.seconds}
        if self.model_used is not None:
            d["model_used"] = self.model_used
        if self.search is not None:
            d["search"] = self.search
        if self.second_look is not None:
            d["second_look"] = self.second_look.to_dict()
        if self.out is not None:
            d["out"] = self.out
        return d

    def markdown(self) -> str:
        """report.md (without a search's own section)."""
        b, c = self.best, self.counts
        lines = [f"# SparseRL kernel for {self.matrix}", "",
                 f"- matrix: {self.shape[0]} x {self.shape[1]}, {self.nnz} nonzeros; op {self.op}"
                 + (f", k = {self.k}" if self.k else ""),
                 f"- verdict: **{self.verdict}**", f"- source: {self.source}",
                 f"- {self.counted}: {c.n}, {c.compiled} compiled" + (f", {c.correct} correct" if self.verified else "")]
        lines += [f"- note: {n}" for n in self.notes]
        if b.speedup is not None:
            t, base = b.timings.get(b.regime), b.baseline.get(b.regime)
            lines += [f"- time ({b.regime} L2): kernel {t.median_us if t else 0:.2f} us, cuSPARSE "
                      f"{base.median_us if base else 0:.2f} us ({b.baseline_alg}): **{b.speedup:.2f}x**"
                      + (" (first timing)" if self.second_look is not None else "")]
            look = self.second_look
            roofline, break_even = (b.roofline, b.break_even_calls) if look is None else (look.roofline,
                                                                                          look.break_even_calls)
            if look is not None:
                lines.append(f"- {look.line()}")
            lines += [f"- roofline fraction: {roofline or 0:.2f}",
                      f"- format {b.format}: conversion {b.conversion_seconds * 1e3:.1f} ms on the host; "
                      + (f"pays off after {break_even:.0f} calls" if break_even is not None
                         else "not faster than cuSPARSE, so it never pays off")]
        if self.runners_up:
            timed = self.verified  # compile-only: nothing was timed, so no speedup column
            lines += ["", "## Runners-up (distinct kernels)", "",
                      "| source | format | verdict |" + (" speedup |" if timed else ""),
                      "| --- | --- | --- |" + (" --- |" if timed else "")]
            for r in self.runners_up:
                sp = f" {r.speedup:.2f}x |" if r.speedup else " - |"
                lines.append(f"| {r.source} | {r.format or '-'} | {r.verdict} |" + (sp if timed else ""))
        lines += ["", "Use it: `sparserl.load_kernel(folder)` returns a callable; see launch.json for the contract."]
        return "\n".join(lines) + "\n"

    def write(self, out: Path, ctx: MatrixContext, extra_md: str = "") -> None:
        """kernel.cu, launch.json, report.json and report.md (``extra_md`` appended) in ``out``. Every file is
        made first (the host conversion launch.json needs takes seconds on a large matrix), then each is put in
        place whole (written beside, renamed over), kernel.cu last: an interrupted write leaves the earlier files,
        or at worst, between two renames, a launch.json whose kernel hash the earlier kernel.cu does not match,
        which the loader refuses."""
        self.kernel = materialise(self.kernel, ctx.op, lambda: ctx.card)  # the matrix's facts it names, written in
        self.fingerprint = ctx.card.fingerprint
        launch = launch_info(self.kernel, ctx)
        self.out = str(out)
        files = {"kernel.cu": self.kernel, "launch.json": json.dumps(launch, indent=1),
                 "report.json": json.dumps(self.to_dict(), indent=1, default=str),
                 "report.md": self.markdown() + extra_md}
        out.mkdir(parents=True, exist_ok=True)
        _warn_if_another_matrix(out, launch)
        tmp = {name: out / f".{name}.{os.getpid()}.tmp" for name in files}
        try:
            for name, text in files.items():
                tmp[name].write_text(text)
            for name in ("launch.json", "report.json", "report.md", "kernel.cu"):  # kernel.cu, the loader's key, last
                os.replace(tmp[name], out / name)
        finally:
            for t in tmp.values():
                t.unlink(missing_ok=True)


def _warn_if_another_matrix(out: Path, launch: dict) -> None:
    """A warning when ``out`` holds the kernel of another matrix structure, about to be replaced (two matrices
    whose files share a name share the default folder)."""
    try:
        before = json.loads((out / "launch.json").read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return
    if before and before != launch["fingerprint"]:
        log.warning("%s held the kernel of another matrix (structure %s); it is replaced by this one's (%s)", out,
                    before[:12], launch["fingerprint"][:12])


def prepare_out(out: Path) -> None:
    """Make ``out`` and check a file can be written there, before the work whose results go there (a folder that
    is a file, or one without permission, fails at once instead of after every sample was drawn and timed)."""
    for up in (out, *out.parents):  # the first that exists must be a folder
        if up.exists():
            if not up.is_dir():
                raise SparseRLError(f"--out {out}: {up} is a file, not a folder (give a folder for kernel.cu, "
                                    "launch.json and the reports)")
            break
    out.mkdir(parents=True, exist_ok=True)
    probe = out / f".probe.{os.getpid()}.tmp"
    probe.write_text("")
    probe.unlink()


def launch_info(text: str, ctx: MatrixContext) -> dict[str, Any]:
    """launch.json: how to launch kernel ``text`` on the request's matrix, and which matrix structure and which
    text were verified (the loader checks both)."""
    ex = extract(text, ctx.op)
    assert isinstance(ex, Extracted)  # the kernel handed back was extracted by the harness
    fd = convert(ctx.A, ex.header.format, ex.header.params)
    cfgs = evaluate_launches(ex.header, ctx.op, fd.launch_env(ctx.op, ctx.k, NUM_SMS))
    return {
        "fingerprint": ctx.card.fingerprint, "shape": list(ctx.shape), "nnz": ctx.nnz,
        "kernel_sha256": kernel_sha(text),  # the store's key for a kernel text: the loader tells an edited one
        "op": ctx.op.value, "k": ctx.k, "format": fd.format, "format_params": fd.params,
        "launch_lines": [ln.render() for ln in ex.header.launches],
        "kernel_args": [f"{p.ctype} {p.name}" for p in kernel_params(fd.format, ctx.op)],
        "sizes": fd.sizes, "zero_fill_y": fd.zero_fill_y,
        "launches_for_this_matrix": [{"kernel": c.kernel, "grid": c.grid, "block": c.block, "smem": c.smem}
                                     for c in cfgs],
        "geometry_note": f"grid/block evaluated with num_sms = {NUM_SMS} (H100/H200); LAUNCH lines hold the formulas",
    }

"""The farm: one budgeted search per matrix of a collection, several at once, on one evaluator.

:func:`run_farm` reads like this:

1. the collection: files and folders (``*.mtx``, ``*.mtx.gz``, ``*.npz``), names made unique;
2. the output folder: a new farm refuses a folder that holds one (``--resume`` continues it);
   resuming first writes the journal's verified kernels that the store lacks (by uid);
3. the evaluator: the in-process one (this host's GPUs) or, with ``ray``, the cluster's
   (:class:`~.ray_evaluator.RayEvaluator`); without a GPU anywhere, compile-only, said once;
4. ``at_once`` searches run in threads over the matrices still to do, each with its own store
   connection, each verified kernel journalled (``verified.jsonl``) before the store gets it;
   a matrix that cannot be read is skipped and listed; each finished matrix is appended to
   ``matrices.jsonl`` (what ``--resume`` skips, by resolved path; a matrix finished compile-only is
   searched again where the evaluator can time) and gets ``search``'s report in ``<name>/``, its kernel
   chosen by a second look (``retime``; one that found no kernel for the machine's reasons fails its
   matrix, and a stop during it leaves the matrix interrupted, both searched again on ``--resume``); a
   search that raises (a full disk, a cluster gone) fails its matrix only, recorded in one line: the
   others go on, the command ends with one error, and ``--resume`` searches it again;
5. Ctrl-C (or SIGTERM) stops submitting: the candidates in flight finish and are kept, the
   summary is written, and ``--resume`` goes on from there; a store that stops answering does
   the same (one line), its unwritten kernels safe in the journal;
6. ``summary.md`` and ``summary.json`` (whatever happened): every matrix's best kernel against
   cuSPARSE, what was skipped or failed, the GPUs' throughput and health.

The journal and ``matrices.jsonl`` are appended to: a line cut by a kill stays alone on its line,
and ``--resume`` skips it and any line that is not a record this version reads (one warning each).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TextIO, TypeVar

from sparserl import interrupts
from sparserl.errors import SparseRLError
from sparserl.matrices.io import matrices_in
from sparserl.request.second_look import PASSES
from sparserl.search.loop import SearchConfig

log = logging.getLogger(__name__)

STATE = "matrices.jsonl"
JOURNAL = "verified.jsonl"
FINISHED = ("done", "no kernel", "unreadable", "too large")
"""The statuses of a finished matrix (what ``--resume`` skips; a failed or interrupted one is searched again)."""
SEARCHED = ("done", "no kernel")
"""The finished statuses of a matrix that was searched (compile-only or timed)."""
T = TypeVar("T")


@dataclass(frozen=True)
class FarmConfig:
    """One farm over a collection of matrices."""

    matrices: tuple[str, ...]
    """Matrix files and folders of them (.mtx, .mtx.gz, .npz)."""
    out: str = "runs/farm"
    """Output folder: summary.md/json, matrices.jsonl, verified.jsonl, one folder per matrix."""
    op: str = "spmv"
    k: int | None = None
    """SpMM columns."""
    search: SearchConfig = field(default_factory=SearchConfig)
    """Each matrix's search (budget, regime, seed ...); its ``parallel`` is per matrix (0: the farm picks)."""
    store: str | None = None
    """Best-known store: a file or a postgresql:// URL (default: best_known.sqlite under the cache root)."""
    ray: str | None = None
    """Ray cluster address (host:port, ray://host:port, auto); None: this host's GPUs, in process."""
    gpus: int | None = None
    """Use at most this many of the cluster's GPUs (None: all)."""
    at_once: int = 0
    """Matrices searched at the same time (0: one more than the GPUs; compile-only: two)."""
    compile_only: bool = False
    """Compile only, even with GPUs."""
    resume: bool = False
    """Continue the farm in ``out`` (its finished matrices are skipped)."""
    progress: bool = True
    """Show the progress display."""
    retime: int = PASSES
    """Before a matrix's kernel is written, its search's fastest are evaluated this many times again, fresh, and
    the lowest median is written (:mod:`sparserl.request.second_look`, as ``search`` does); one found wrong there
    leaves the store. 0: the first timings decide."""

    def __post_init__(self) -> None:
        if self.retime < 0:
            raise SparseRLError(f"--retime must be 0 (no second look) or more passes, got {self.retime}")
        if not self.matrices:
            raise SparseRLError("give the farm matrices: files or folders of .mtx, .mtx.gz or .npz")
        if self.op not in ("spmv", "spmm"):
            raise SparseRLError(f"--op must be spmv or spmm, got {self.op!r}")
        if self.op == "spmm" and (self.k is None or self.k < 1):
            raise SparseRLError("--op spmm needs --k K (K >= 1 columns of X)")
        if self.at_once < 0 or (self.gpus is not None and self.gpus < 0):
            raise SparseRLError("--at-once and --gpus must be >= 0")


@dataclass
class MatrixOutcome:
    """One matrix's line of the summary."""

    name: str
    path: str
    status: str
    """'done', 'no kernel' (none verified, or none compiled), 'unreadable', 'too large', 'interrupted', 'failed'."""
    message: str = ""
    rows: int | None = None
    cols: int | None = None
    nnz: int | None = None
    evaluated: int = 0
    seconds: float = 0.0
    timed: bool = False
    best_id: str | None = None
    best_format: str | None = None
    time_us: float | None = None
    cusparse_us: float | None = None
    speedup: float | None = None
    store_improved: bool = False
    failures: dict[str, int] = field(default_factory=dict)
    """Candidates that failed for a reason of the machine (internal_error, crashed, timeout), by kind."""

    @classmethod
    def from_row(cls, d: dict) -> "MatrixOutcome":
        """A line of ``matrices.jsonl`` (fields of another version left out), checked: TypeError or
        AttributeError where it is not one."""
        o = cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        count, number, text = (int, type(None)), (int, float, type(None)), (str, type(None))
        if not (all(isinstance(x, str) for x in (o.name, o.path, o.status, o.message))
                and isinstance(o.evaluated, int) and isinstance(o.seconds, (int, float))
                and all(isinstance(x, count) for x in (o.rows, o.cols, o.nnz))
                and all(isinstance(x, number) for x in (o.time_us, o.cusparse_us, o.speedup))
                and all(isinstance(x, text) for x in (o.best_id, o.best_format))
                and isinstance(o.timed, bool) and isinstance(o.failures, dict)):
            raise TypeError("not a matrix's row")
        return o


def collect(paths: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(unique name, path) of every matrix file named or in a folder named, in order."""
    from sparserl.request.context import matrix_name

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = matrices_in(p)
            if not found:
                log.warning("%s holds no .mtx, .mtx.gz or .npz file", p)
            files += found
        elif p.exists():
            files.append(p)
        else:
            raise SparseRLError(f"{p}: no such file or folder")
    out, seen = [], {}
    for f in files:
        name = matrix_name(str(f))
        n = seen[name] = seen.get(name, 0) + 1
        out.append((name if n == 1 else f"{name}-{n}", f))
    if not out:
        raise SparseRLError("no matrix files in " + ", ".join(paths))
    return out


class Journal:
    """``verified.jsonl``: every verified kernel, written before the store gets it (thread-safe)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.fh = append_lines(path)

    def matrix(self, card, name: str, source: str) -> None:
        self._line({"matrix": {"card": card.to_dict(), "name": name, "path": source}})

    def kernel(self, v) -> None:
        self._line({"kernel": asdict(v)})

    def _line(self, d: dict) -> None:
        with self.lock:
            self.fh.write(json.dumps(d) + "\n")
            self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def append_lines(path: Path) -> TextIO:
    """``path`` opened to append JSON lines, the first on a line of its own: after a last line cut by a
    kill, a newline first (else the next record would run on from the cut one, and be lost with it)."""
    cut = False
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
    fh = path.open("a")
    if cut:
        fh.write("\n")
        fh.flush()
    return fh


def read_lines(path: Path, parse: Callable[[Any], T]) -> list[T]:
    """``parse`` of each JSON line of ``path`` (none where it does not exist); a line that is not JSON (cut
    by a kill) or that ``parse`` refuses (ValueError, TypeError, KeyError, AttributeError: not a record
    this version reads) is skipped, and the skipped lines are counted in one warning."""
    if not path.exists():
        return []
    out, skipped = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if line.strip():
            try:
                out.append(parse(json.loads(line)))
            except (ValueError, TypeError, KeyError, AttributeError):
                skipped += 1
    if skipped:
        log.warning("%s: %d lines skipped (cut by a kill, or not a record this version reads)", path, skipped)
    return out


def replay(journal: Path, store_spec: str | None) -> int:
    """Write the journal's verified kernels the store lacks (by uid); how many were written."""
    from sparserl.matrices.card import MatrixCard
    from sparserl.search.store import VerifiedKernel, open_store

    fields = set(VerifiedKernel.__dataclass_fields__)

    def parse(d: dict) -> VerifiedKernel | tuple[MatrixCard, str, str]:
        if "kernel" in d:
            if set(d["kernel"]) != fields:  # another version's record: its uid may be missing
                raise KeyError("not a verified kernel's fields")
            return VerifiedKernel(**d["kernel"])
        m = d["matrix"]
        if not (isinstance(m["name"], str) and isinstance(m["path"], str)):
            raise TypeError("not a matrix's name and path")
        return MatrixCard.from_dict(m["card"]), m["name"], m["path"]

    matrices, kernels = {}, []
    for r in read_lines(journal, parse):
        if isinstance(r, VerifiedKernel):
            kernels.append(r)
        else:
            matrices[r[0].fingerprint] = r
    if not kernels:
        return 0
    with open_store(store_spec) as st:
        known = st.has_uids([v.uid for v in kernels])
        todo = [v for v in kernels if v.uid not in known]
        for fp in {v.fingerprint for v in todo}:
            m = matrices.get(fp)
            if m is not None:
                st.add_matrix(*m)
        written = sum(st.record_outcome(v).written for v in todo)
    if todo:
        log.info("resume: %d verified kernels from %s written to the store%s", written, journal,
                 f" ({len(todo) - written} not: found wrong on their matrix, or written meanwhile)"
                 if written < len(todo) else "")
    return written


def matrix_key(path: str | Path) -> str:
    """A matrix's key in ``matrices.jsonl``: its resolved path (``mats/a.mtx`` typed in the matrices'
    parent folder and its absolute path are one matrix; a row's path is kept as it was typed)."""
    return str(Path(path).resolve())


def _done_before(state: Path, timed: bool) -> dict[str, MatrixOutcome]:
    """The matrices ``state`` records as finished, by :func:`matrix_key`. Where the evaluator can time
    (``timed``), a matrix searched compile-only (its row not timed) is not finished: it is searched again."""
    out, untimed = {}, set()
    for o in read_lines(state, MatrixOutcome.from_row):
        if o.status not in FINISHED:
            continue
        if timed and o.status in SEARCHED and not o.timed:
            untimed.add(matrix_key(o.path))
        else:
            out[matrix_key(o.path)] = o
    if untimed - set(out):
        log.info("resume: %d matrices finished compile-only are searched again, timed", len(untimed - set(out)))
    return out


def open_farm_evaluator(cfg: FarmConfig):
    """The farm's evaluator (see the module docstring, step 3)."""
    from sparserl.devices import NO_GPU_NOTE, visible_gpus
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    regime = cfg.search.regime
    hcfg = HarnessConfig(compile_only=cfg.compile_only, regimes=(regime,), reward_regime=regime,
                         devices=tuple(visible_gpus()[:cfg.gpus]) if cfg.ray is None and cfg.gpus else None)
    if cfg.ray is None:  # this host's GPUs, in process; Ray is imported only for a cluster (the farm extra)
        ev = Evaluator(hcfg)
        if not cfg.compile_only and not ev.has_gpu:
            log.warning(NO_GPU_NOTE)
        return ev
    from sparserl.farm.ray_evaluator import RayEvaluator

    return RayEvaluator(hcfg, cfg.ray, gpus=cfg.gpus)


class _Counting:
    """The evaluator, counting finished candidates and machine failures as they come back."""

    MACHINE = ("internal_error", "crashed", "timeout", "compile_timeout")

    def __init__(self, ev):
        self.ev = ev
        self.lock = threading.Lock()
        self.done = 0
        self.looks = 0
        """Evaluations again (``fresh``: the second looks), not counted in ``done``."""
        self.failures: dict[str, int] = {}
        self.t0 = time.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ev, name)

    @property
    def has_gpu(self) -> bool:
        return self.ev.has_gpu

    def submit(self, *a, **kw) -> Future:
        f = self.ev.submit(*a, **kw)
        f.add_done_callback(self._count_look if kw.get("fresh") else self._count)
        return f

    def _count_look(self, f: Future) -> None:
        with self.lock:
            self.looks += 1

    def _count(self, f: Future) -> None:
        kind = f.result().error_kind.value
        with self.lock:
            self.done += 1
            if kind in self.MACHINE:
                self.failures[kind] = self.failures.get(kind, 0) + 1


class Farm:
    """One run of :func:`run_farm` (its state while it runs: what the display reads)."""

    def __init__(self, cfg: FarmConfig, ev):
        self.cfg, self.ev = cfg, _Counting(ev)
        self.out = Path(cfg.out)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: dict[str, MatrixOutcome] = {}
        self.running: set[str] = set()
        self.store_down: SparseRLError | None = None
        self.health_problems: dict[str, list[str]] = {}
        self.t0 = time.monotonic()
        self.journal = Journal(self.out / JOURNAL)
        self.state = append_lines(self.out / STATE)

    # -- one matrix ---------------------------------------------------------------------------

    def search_one(self, name: str, path: Path) -> MatrixOutcome:
        from sparserl.kernels.contract import Op
        from sparserl.matrices import load_matrix
        from sparserl.search.footprint import check_fits
        from sparserl.request.context import MatrixContext
        from sparserl.search.run import search_array, search_entry, write_report
        from sparserl.search.store import open_store
        from sparserl.search.store_backends import StoreError

        cfg = self.cfg
        if self.stop.is_set():
            return MatrixOutcome(name, str(path), "interrupted", "not started")
        try:
            A = load_matrix(str(path))
        except (SparseRLError, OSError, ValueError) as exc:
            log.warning("%s cannot be read, skipped: %s", path, exc)
            return MatrixOutcome(name, str(path), "unreadable", str(exc).splitlines()[0][:300])
        o = MatrixOutcome(name, str(path), "failed", rows=int(A.shape[0]), cols=int(A.shape[1]), nnz=int(A.nnz))
        op = Op(cfg.op)
        k = cfg.k if op is Op.SPMM else None
        if self.ev.has_gpu:
            try:
                check_fits(name, o.rows, o.cols, o.nnz, k)
            except SparseRLError as exc:
                o.status, o.message = "too large", str(exc)
                return o
        with self.lock:
            self.running.add(name)
        ctx = None
        try:
            ctx = MatrixContext(A, name, op, k, str(path))
            with open_store(cfg.store) as store:
                self.journal.matrix(ctx.card, name, str(path.resolve()))
                res = search_array(ctx, cfg.search, self.ev, store, run_config={"farm": asdict(cfg)},
                                   trace=self._folder(name) / "trace.jsonl", progress=False,
                                   journal=self.journal.kernel, stop=self.stop)
                o.evaluated, o.seconds, o.timed = res.evaluated, res.seconds, res.timed
                o.store_improved = res.store_improved
                o.failures = {}
                for e in res.entries:
                    kind = e.result.error_kind.value
                    if kind in _Counting.MACHINE:
                        o.failures[kind] = o.failures.get(kind, 0) + 1
                if res.best is not None:
                    self._best(o, res.best, cfg.search.regime)
                if res.stopped == "stopped":
                    o.status, o.message = "interrupted", f"stopped after {res.evaluated} candidates"
                    return o
                try:
                    rep = write_report(ctx, res, self._folder(name), {"farm": asdict(cfg)},
                                       evaluator=self.ev if res.timed else None, retime=cfg.retime, store=store,
                                       stop=self.stop)
                    o.status = "done"
                    if rep.second_look is not None:  # the kernel written (its facts written in), at the look's median
                        self._best(o, search_entry(res, rep.best), cfg.search.regime, rep.second_look)
                        o.seconds += rep.second_look.seconds
                except StoreError:
                    raise
                except SparseRLError as exc:
                    o.best_id = o.best_format = o.time_us = o.cusparse_us = o.speedup = None
                    lost = getattr(exc, "retraction_failed", None)
                    if isinstance(lost, StoreError):  # kernels found wrong may stay in the store: not finished
                        raise lost from exc
                    o.status, o.message = self._not_written(exc), str(exc)[:300]
                o.store_improved = res.store_improved  # read again where the look took kernels out of the store
            if not res.timed and res.best is None:  # compile-only: the first compiling candidate
                first = next((e for e in sorted(res.entries, key=lambda e: e.order)
                              if e.result.error_kind.value == "no_gpu"), None)
                if first is not None:
                    o.best_id, o.best_format = first.proposal.id, first.result.format
            return o
        except StoreError as exc:
            with self.lock:
                if self.store_down is None:
                    self.store_down = exc
            self.stop.set()
            o.status, o.message = "interrupted", str(exc)[:300]
            return o
        finally:
            with self.lock:
                self.running.discard(name)
            release = getattr(self.ev, "release", None)  # the Ray evaluator lets the matrix's bytes go
            if release is not None and ctx is not None:
                from sparserl.harness.matrix_files import matrix_key

                release(matrix_key(ctx.A))

    @staticmethod
    def _not_written(exc: SparseRLError) -> str:
        """A matrix's status when no kernel was written for it: 'interrupted' (stopped during the second look) and
        'failed' (the look confirmed none for the machine's reasons, or could not retract what it found wrong)
        are searched again by ``--resume``; 'no kernel' (none verified, or every one looked at found wrong) is
        final."""
        from sparserl.eval.retime import EvaluationsStopped
        from sparserl.request.second_look import SecondLookFailed

        if isinstance(exc, EvaluationsStopped):
            return "interrupted"
        if (isinstance(exc, SecondLookFailed) and exc.machine) or getattr(exc, "retraction_failed", None):
            return "failed"
        return "no kernel"

    @staticmethod
    def _best(o: MatrixOutcome, entry, regime: str, look=None) -> None:
        """``o``'s kernel: the search's ``entry`` (a :class:`~sparserl.search.loop.TraceEntry`), at the second
        ``look``'s median where there was one, else at its first timing."""
        r = entry.result
        base = r.baseline.get(regime)
        o.best_id, o.best_format = entry.proposal.id, r.format
        o.cusparse_us = base.median_us if base else None
        if look is None:
            o.time_us, o.speedup = entry.time_us(regime), r.speedup
        else:
            o.time_us, o.speedup = look.median_us, look.median_speedup

    def _folder(self, name: str) -> Path:
        p = self.out / name
        p.mkdir(parents=True, exist_ok=True)
        return p

    def finished(self, o: MatrixOutcome) -> None:
        with self.lock:
            self.outcomes[o.path] = o
            if o.status != "interrupted":
                self.state.write(json.dumps(asdict(o)) + "\n")
                self.state.flush()

    # -- what the display reads ---------------------------------------------------------------

    def snapshot(self) -> dict:
        with self.lock:
            outs = list(self.outcomes.values())
            running = sorted(self.running)
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        stats = self.ev.worker_stats() if hasattr(self.ev.ev, "worker_stats") else []
        best = sorted((o for o in outs if o.speedup), key=lambda o: -o.speedup)[:5]
        return {"done": sum(o.status in ("done", "no kernel") for o in outs),
                "skipped": sum(o.status in ("unreadable", "too large") for o in outs),
                "failed": sum(o.status == "failed" for o in outs), "running": running,
                "candidates": self.ev.done, "looks": self.ev.looks, "rate": self.ev.done / elapsed,
                "machine_failures": dict(self.ev.failures),
                "workers": [dict(w, rate=w["jobs"] / elapsed) for w in stats], "best": [(o.name, o.speedup)
                                                                                       for o in best],
                "timed": self.ev.has_gpu, "elapsed": elapsed, "health": dict(self.health_problems),
                "compiles": dict(getattr(self.ev.ev, "compiles", {}) or {})}

    def check_health(self, watch) -> None:
        """Each GPU's health once (the farm asks every minute); new problems are logged once."""
        try:
            if hasattr(self.ev.ev, "health"):
                found = self.ev.ev.health()
            else:
                from sparserl.farm.health import query

                stats = self.ev.worker_stats() if hasattr(self.ev.ev, "worker_stats") else []
                ours = {w["pid"] for w in stats if w.get("pid")}
                lat = max((w.get("sync_latency_ms") or 0.0 for w in stats), default=None)
                devs = {w["device"] for w in stats}
                found = {f"gpu{h.index}": replace(h, latency_ms=lat) for h in query(ours=ours) if h.index in devs}
        except Exception as exc:  # health is a report, never a reason to stop the farm
            log.debug("GPU health check failed: %s", exc)
            return
        for name, h in found.items():
            if h is not None and watch.note(name, h):
                self.health_problems[name] = h.problems

    def close(self) -> None:
        self.journal.close()
        self.state.close()


def run_farm(cfg: FarmConfig, evaluator=None) -> dict:
    """Run the farm (see the module docstring); returns the summary (also written to ``out``, whatever
    happens). ``evaluator``: an open evaluator to use (default: :func:`open_farm_evaluator`'s, closed at
    the end). Raises SparseRLError when the store stopped answering or a matrix's search failed (the
    others are searched and recorded), KeyboardInterrupt when interrupted."""
    items = _prepare(cfg)
    out = Path(cfg.out)
    own = evaluator is None
    ev = evaluator or open_farm_evaluator(cfg)
    try:
        before, todo = _to_do(cfg, items, ev.has_gpu)
        at_once, run_cfg = _width(cfg, ev)
        farm = Farm(run_cfg, ev)
        try:
            interrupted = _drive(farm, ev, todo, len(items), at_once)
        finally:
            farm.close()
            summary = _summarise(farm, ev, items, before, todo)
    finally:
        if own:
            ev.close()
    if farm.store_down is not None:
        raise SparseRLError(f"{farm.store_down}; the farm stopped: its verified kernels are kept in "
                            f"{out / JOURNAL}, continue with --resume when the store answers")
    if interrupted:
        raise KeyboardInterrupt
    failed = [o for o in farm.outcomes.values() if o.status == "failed"]
    if failed:
        raise SparseRLError(f"{len(failed)} of {len(todo)} matrices failed ({failed[0].name}: {failed[0].message}); "
                            f"the others are recorded in {out / 'summary.md'}; --resume searches them again")
    return summary


def _prepare(cfg: FarmConfig) -> list[tuple[str, Path]]:
    """The collection's matrices, after the checks that fail before any work (templates, output
    folder, store); resuming first replays the journal."""
    from sparserl.search.space import select_templates
    from sparserl.search.store import open_store

    select_templates(cfg.op, cfg.search.templates)  # an unknown template name fails before any work
    items = collect(cfg.matrices)
    out = Path(cfg.out)
    if (out / STATE).exists() and not cfg.resume:
        raise SparseRLError(f"{out} holds a farm already: --resume to continue it, or give another --out")
    out.mkdir(parents=True, exist_ok=True)
    open_store(cfg.store).close()  # a store that cannot be opened fails here, before any work
    if cfg.resume:
        replay(out / JOURNAL, cfg.store)
    return items


def _to_do(cfg: FarmConfig, items: list[tuple[str, Path]],
           timed: bool) -> tuple[dict[str, MatrixOutcome], list[tuple[str, Path]]]:
    """(the matrices finished before, by :func:`matrix_key`; those to do): ``timed``, whether the
    evaluator can time (see :func:`_done_before`)."""
    before = _done_before(Path(cfg.out) / STATE, timed) if cfg.resume else {}
    todo = [(n, p) for n, p in items if matrix_key(p) not in before]
    if before:
        log.info("resume: %d of %d matrices done before; %d to go", len(items) - len(todo), len(items), len(todo))
    return before, todo


def _width(cfg: FarmConfig, ev) -> tuple[int, FarmConfig]:
    """(matrices searched at once, the config with each search's candidates in flight filled in)."""
    n_gpus = len(ev.worker_stats()) if ev.has_gpu and hasattr(ev, "worker_stats") else 0
    if ev.has_gpu and n_gpus == 0:
        from sparserl.devices import visible_gpus

        n_gpus = max(1, len(visible_gpus()))
    at_once = cfg.at_once or (n_gpus + 1 if ev.has_gpu else 2)
    per = cfg.search.parallel or (4 if ev.has_gpu else max(2, getattr(ev, "cpus", 0) or 4))
    return at_once, replace(cfg, search=replace(cfg.search, parallel=per))


def _drive(farm: Farm, ev, todo: list[tuple[str, Path]], n_items: int, at_once: int) -> bool:
    """The searches of ``todo``, ``at_once`` at a time, with the display and the GPUs' health once a
    minute; the first Ctrl-C stops submitting (the searches in flight finish), a second one is raised
    (and so is any error of the farm's own, nothing more started). Returns whether it was interrupted."""
    from sparserl.farm.display import FarmDisplay
    from sparserl.farm.health import HealthWatch

    interrupted = False
    with FarmDisplay(farm, n_items, n_items - len(todo), enabled=farm.cfg.progress) as display, \
            ThreadPoolExecutor(max_workers=max(1, at_once), thread_name_prefix="farm") as pool:
        futures = {pool.submit(farm.search_one, n, p): (n, p) for n, p in todo}
        pending = set(futures)
        watch, last_health = HealthWatch(), 0.0
        try:
            while pending:
                try:
                    done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                    for f in done:
                        if not f.cancelled():
                            farm.finished(_outcome(f, *futures[f]))
                    if not interrupted:
                        interrupts.check()  # one swallowed where it landed stops the farm too
                    if ev.has_gpu and time.monotonic() - last_health > 60:
                        farm.check_health(watch)
                        last_health = time.monotonic()
                    display.refresh()
                except KeyboardInterrupt:
                    if interrupted:
                        raise
                    interrupted = True
                    farm.stop.set()
                    log.warning("stopping: the candidates in flight finish and are kept (Ctrl-C again to "
                                "stop at once); continue later with --resume")
                if farm.stop.is_set():
                    for f in pending:
                        f.cancel()
                    pending = {f for f in pending if not f.cancelled()}
        except BaseException:  # leaving: the matrices not started stay so (the pool would search them all)
            farm.stop.set()
            for f in pending:
                f.cancel()
            raise
    return interrupted


def _outcome(f: Future, name: str, path: Path) -> MatrixOutcome:
    """A finished search's outcome; one that raised (a full disk, a cluster gone) is its matrix failed,
    in one line (after an interrupt, interrupted: the error is the interrupt's). An interrupt is raised."""
    try:
        return f.result()
    except Exception as exc:
        msg = f"{type(exc).__name__}: {next(iter(str(exc).splitlines()), '')}"[:300]
        if interrupts.seen():
            return MatrixOutcome(name, str(path), "interrupted", msg)
        log.warning("%s: the search failed (--resume searches it again): %s", name, msg)
        log.debug("%s: the search's error", name, exc_info=exc)
        return MatrixOutcome(name, str(path), "failed", msg)


def _summarise(farm: Farm, ev, items: list[tuple[str, Path]], before: dict[str, MatrixOutcome],
               todo: list[tuple[str, Path]]) -> dict:
    """Every matrix's outcome (done before, this run's, never started) in the collection's order,
    written as the summary; returns it."""
    from sparserl.farm.summary import write_summary

    for n, p in todo:  # the matrices never started
        farm.outcomes.setdefault(str(p), MatrixOutcome(n, str(p), "interrupted", "not started"))
    outcomes = list(before.values()) + list(farm.outcomes.values())
    order = {matrix_key(p): i for i, (_, p) in enumerate(items)}
    outcomes.sort(key=lambda o: order.get(matrix_key(o.path), len(order)))
    return write_summary(farm.out, farm.cfg, outcomes, farm.snapshot(), ev.has_gpu)

"""The harness's front door: a completion and a matrix in, an :class:`EvalResult` out.

    ev = Evaluator(HarnessConfig())
    mat = ev.register(A, "bcsstk13")
    res = ev.evaluate(completion_text, mat, "spmv")
    ev.close()

Steps: extract (tolerant of markdown and chatter) -> contract and static checks on the source ->
compile (NVRTC or nvcc, cached, in this process's threads) -> checks on the compiled PTX ->
resources -> run in an isolated GPU worker (convert, verify on the matrix and on its fresh-valued
twin, time against cuSPARSE with every timed run checked). Without a GPU, or with
``compile_only=True``, the matrix is converted on the host and the LAUNCH lines evaluated against
it exactly as a worker would, then evaluation stops with ``error_kind=no_gpu`` and ``compiled``
set, which is what compile-only rewards read.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import scipy.sparse as sp

from sparserl.devices import gpus_arch, visible_gpus
from sparserl.errors import ContractError, SparseRLError
from sparserl.harness.compile import CompileOptions, compile_source, default_cache_dir
from sparserl.harness.extract import ExtractError, extract
from sparserl.harness.matrix_facts import extract_with_facts
from sparserl.harness.pool import PhaseLimits, WorkerPool
from sparserl.harness.result import HARNESS_VERSION, ErrorKind, EvalProfile, EvalResult, KernelTiming
from sparserl.harness.speed import SpeedConfig, slow_threshold_us
from sparserl.harness.static_check import static_check
from sparserl.harness.verify import VerifyConfig
from sparserl.harness.matrix_files import save_matrix_file
from sparserl.harness.worker import settings_dict
from sparserl.kernels.contract import Op
from sparserl.matrices.card import MatrixCard

log = logging.getLogger(__name__)

# verdicts that may say more about the machine's load or state than about the kernel
_NOT_REMEMBERED = (ErrorKind.CRASHED, ErrorKind.TIMEOUT, ErrorKind.COMPILE_TIMEOUT, ErrorKind.INTERNAL)


@dataclass(frozen=True)
class HarnessConfig:
    """How kernels are evaluated."""

    devices: tuple[int, ...] | None = None
    """GPUs to run workers on (one worker each); None = every visible GPU."""
    compile_only: bool = False
    """Stop after compiling (no GPU needed): results have error_kind 'no_gpu'."""
    regimes: tuple[str, ...] = ("cold", "warm")
    """L2 regimes to time: 'cold' (flushed before each run) and/or 'warm' (back to back)."""
    reward_regime: str = "cold"
    """The regime speedup and roofline refer to."""
    cold_trials: int = 41
    """Timed runs in the cold regime (median reported)."""
    warm_trials: int = 7
    """Timed graph replays in the warm regime."""
    warm_target_ms: float = 0.5
    """Warm regime: length of one timed replay (sets the repetitions per replay)."""
    warmup: int = 2
    """Untimed runs before timing."""
    max_smem_bytes: int = 100 * 1024
    """Shared memory per block (static + dynamic) above this is a resource_limit failure."""
    max_registers: int = 255
    """Registers per thread above this (never, on sm_90) flags over_resource_limit."""
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    limits: PhaseLimits = field(default_factory=PhaseLimits)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    """The evaluation path (batched, or the earlier sequential one: ``SpeedConfig.classic()``),
    adaptive cold timing, early stopping of hopeless kernels, time limits scaled to the matrix."""
    compile: CompileOptions = field(default_factory=CompileOptions)
    cache_dir: str | None = None
    """Compile cache, saved matrices and baselines; default $SPARSERL_CACHE_DIR or ~/.cache/sparserl."""
    compile_jobs: int = 0
    """Parallel compiles in evaluate_many (0 = CPU cores)."""
    memo: int = 4096
    """Remember this many results: the same completion text on the same matrix content, op and k,
    under the same verification and timing settings and harness version, gets the first result
    instead of a new run (RL samples one kernel for a matrix many times). Crashes, time-outs
    (compile included) and internal errors are not remembered. The price: a racy kernel that
    passed its two verification runs once is not checked again. 0 turns it off."""
    host_num_sms: int = 132
    """The SM count LAUNCH expressions see when a completion is planned on the host (compile-only
    evaluation, no GPU to ask): an H200's."""
    scrub_shared: bool = True
    """Cold regime: after the L2 flush, overwrite every SM's shared memory, so that no timed run can
    read what an earlier launch left there (:class:`~sparserl.harness.timing.FlushBuffer`); cuSPARSE's
    runs alike. False only to measure what the scrub costs or prevents (``benchmarks/scrub_cost.py``)."""
    preconvert: bool = True
    """Batched path: convert a matrix's pattern into a completion's format in this process's compile
    threads, while the worker is busy with other candidates, and hand the worker the result
    (:mod:`sparserl.harness.preconvert`); False: the worker converts."""

    memory_reserve: float = 0.3
    """The share of the GPU's memory a worker keeps free: before it makes a conversion it does not have,
    it lets go of other matrices and then this matrix's least recently used conversions until that
    much is free (:mod:`sparserl.harness.memory`). Verdicts and timings do not depend on it."""

    def __post_init__(self) -> None:
        if not self.regimes or any(r not in ("cold", "warm") for r in self.regimes):
            raise SparseRLError(f"regimes must be a non-empty subset of ('cold', 'warm'), got {self.regimes}")
        if self.reward_regime not in self.regimes:
            raise SparseRLError(f"reward_regime {self.reward_regime!r} must be one of the timed regimes {self.regimes}")
        if self.cold_trials < 3 or self.warm_trials < 3:
            raise SparseRLError("need at least 3 timing trials per regime")
        if self.memo < 0:
            raise SparseRLError("memo must be >= 0")
        if not 0.0 <= self.memory_reserve < 1.0:
            raise SparseRLError(f"memory_reserve must be in [0, 1), got {self.memory_reserve}")

    @property
    def root(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir().parent


@dataclass(frozen=True)
class MatrixRef:
    """A matrix registered with the evaluator (saved where workers can load it)."""

    key: str
    path: str
    name: str
    shape: tuple[int, int]
    nnz: int

    def job(self) -> dict:
        return {"key": self.key, "path": self.path, "name": self.name}


def _headline(log_text: str) -> str:
    """The one line of a failed build's log a message should carry: its first error, else its last line."""
    lines = [line.strip() for line in log_text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and "errors detected" not in line]
    return (errors or lines or ["compile failed"])[0 if errors else -1][:300]


def _profile(front: dict[str, float], payload: dict) -> EvalProfile:
    """One evaluation's profile: the parent's steps (extract, checks, compile), the wait for a
    worker, the round trip to it beyond its own time, and the worker's steps."""
    worker = payload.get("profile") or {}
    seconds = dict(front)
    if "queue_seconds" in payload:
        seconds["queue"] = payload["queue_seconds"]
    if "call_seconds" in payload and "worker_seconds" in payload:
        seconds["ipc"] = max(0.0, payload["call_seconds"] - payload["worker_seconds"])
    seconds.update(worker.get("seconds", {}))
    counts = dict(worker.get("counts", {}))
    if "checked_timed_outputs" in payload:
        counts["checked_outputs"] = payload["checked_timed_outputs"]
    return EvalProfile(seconds=seconds, counts=counts)


def _copy_future(src: Future, dst: Future) -> None:
    """Give ``dst`` the finished ``src``'s result or exception."""
    if (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


class Evaluator:
    """Evaluates completions on matrices; owns the GPU worker pool (if any)."""

    def __init__(self, config: HarnessConfig | None = None):
        self.config = config or HarnessConfig()
        self._pool: WorkerPool | None = None
        self._pool_lock = threading.Lock()
        self._devices = list(self.config.devices) if self.config.devices is not None else None
        self._compile_pool = ThreadPoolExecutor(max_workers=self.config.compile_jobs or None,
                                                thread_name_prefix="compile")
        self._memo: OrderedDict[tuple, Future] = OrderedDict()
        self._memo_lock = threading.Lock()
        self._host_plans: OrderedDict[tuple, object] = OrderedDict()
        self._host_lock = threading.Lock()
        self._best: dict[tuple, float] = {}
        self._best_lock = threading.Lock()
        self._preconverter = None
        self._preconverter_lock = threading.Lock()
        self._cards: OrderedDict[str, MatrixCard] = OrderedDict()
        self._cards_lock = threading.Lock()
        self.memo_hits = 0
        """Submissions answered from the memo (see ``HarnessConfig.memo``)."""
        self._arch: str | None = None

    # -- setup ---------------------------------------------------------------------------

    @property
    def has_gpu(self) -> bool:
        if self.config.compile_only:
            return False
        if self._devices is None:
            self._devices = visible_gpus()
        return bool(self._devices)

    @property
    def arch(self) -> str | None:
        """The architecture of the GPUs kernels are timed on (sm_XY); None without a GPU (compile-only)
        or when its GPUs are of different architectures."""
        if self._arch is None and self.has_gpu:
            self._arch = gpus_arch(self._devices)
        return self._arch if self.has_gpu else None

    @property
    def pool(self) -> WorkerPool:
        with self._pool_lock:
            return self._pool or self._start_pool()

    def _start_pool(self) -> WorkerPool:
        if self._pool is None:
            if not self.has_gpu:
                raise SparseRLError("no CUDA GPU is visible (or CuPy is missing): evaluation can only compile")
            cfg = self.config
            settings = settings_dict(cfg) | {"cache_dir": str(cfg.root)}
            self._pool = WorkerPool(self._devices, settings, cfg.limits)
        return self._pool

    @contextlib.contextmanager
    def gpu_lease(self, device):
        """Hold a GPU against the harness's timing while computing on it (a context manager).
        ``device`` is a CUDA index or a ``torch.device``; a no-op without GPUs or for a CPU. The
        workers are started first if they do not exist yet, so even the first lease holds the
        lock their timing waits for (and from it on, that GPU's jobs ask for the lease to time)."""
        index = getattr(device, "index", device)
        pool = self.pool if getattr(device, "type", "cuda") == "cuda" and self.has_gpu else None
        with pool.gpu_lease(index or 0) if pool is not None else contextlib.nullcontext():
            yield

    def register(self, A: sp.csr_array, name: str = "matrix") -> MatrixRef:
        """Make ``A`` (canonical CSR) available to the workers."""
        key, path = save_matrix_file(A, self.config.root / "matrices")
        return MatrixRef(key, str(path), name, (int(A.shape[0]), int(A.shape[1])), int(A.nnz))

    # -- evaluation ----------------------------------------------------------------------

    def _front(self, text: str, matrix: MatrixRef, op: Op, k: int | None, t0: float,
               plan_on_host: bool | None = None):
        """Extraction, checks and compile: returns (job, None) or (None, failure result).
        ``plan_on_host``: convert the matrix and plan the launches here (default: without a GPU)."""
        front: dict[str, float] = {}

        def timed(name: str, fn, *args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                front[name] = front.get(name, 0.0) + time.perf_counter() - t

        fail = lambda kind, msg, **kw: EvalResult.failure(  # noqa: E731
            op.value, k, matrix.name, kind, msg, eval_seconds=time.perf_counter() - t0,
            profile=EvalProfile(seconds=dict(front)), **kw)
        ex = timed("extract", extract, text, op)
        if isinstance(ex, ExtractError):
            return None, fail(ErrorKind(ex.kind), ex.message)
        try:  # the matrix's facts the code names: their definitions written from its card
            ex = extract_with_facts(ex, op, lambda: timed("card", self._card, matrix))
        except ContractError as exc:
            return None, fail(ErrorKind.CONTRACT, str(exc), format=ex.header.format)
        if isinstance(ex, ExtractError):  # the definitions took the text over the length limit
            return None, fail(ErrorKind(ex.kind), ex.message)
        viol = timed("static_check", static_check, ex.code, ex.header, op)
        if viol is not None:
            return None, fail(ErrorKind(viol.kind), viol.message, format=ex.header.format)
        built = timed("compile", compile_source, ex.code, self.config.compile, self.config.root / "cubin")
        if not built.ok:
            kind = {"timeout": ErrorKind.COMPILE_TIMEOUT, "compiler_failure": ErrorKind.INTERNAL}.get(
                built.error_kind, ErrorKind.COMPILE)
            return None, fail(kind, _headline(built.log), log_tail=built.log[-2000:], format=ex.header.format,
                              compiled=False)
        if built.ptx_violation is not None:
            return None, fail(ErrorKind.STATIC, built.ptx_violation, format=ex.header.format, compiled=False)
        plan = (not self.has_gpu) if plan_on_host is None else plan_on_host
        if plan and (refused := timed("plan", self._plan_on_host, ex.header, matrix, op, k)) is not None:
            return None, fail(*refused, format=ex.header.format, compiled=True)
        pattern = (timed("preconvert", self._preconvert, ex.header, matrix)
                   if self.config.preconvert and self.config.speed.batched and self.has_gpu else None)
        names = set(ex.header.kernel_names(op))
        res = [r for r in built.resources if r.name in names]
        regs = max((r.registers for r in res), default=None)
        spills = sum(r.spill_store_bytes + r.spill_load_bytes for r in res)
        job = {
            "op": op.value, "k": k, "matrix": matrix.job(), "header": ex.header.render(),
            "cubin_path": built.cubin_path, "uses_atomics": built.uses_atomics,
            "static_smem": {r.name: r.smem_bytes for r in res}, "regimes": list(self.config.regimes),
            "reward_regime": self.config.reward_regime, "verify": asdict(self.config.verify),
        }
        if pattern is not None:
            job["pattern"] = pattern
        extra = {"format": ex.header.format, "registers": regs, "spill_bytes": spills,
                 "over_resource_limit": bool(regs and regs > self.config.max_registers), "front": front}
        return (job, extra), None

    def _card(self, matrix: MatrixRef) -> MatrixCard:
        """The card of a registered matrix, for the facts a kernel names (:mod:`sparserl.harness.matrix_facts`);
        the last few kept."""
        from sparserl.harness.matrix_files import load_matrix_file
        from sparserl.matrices.card import matrix_card

        with self._cards_lock:
            card = self._cards.get(matrix.key)
            if card is not None:
                self._cards.move_to_end(matrix.key)
        if card is None:
            card = matrix_card(load_matrix_file(matrix.path))
            with self._cards_lock:
                self._cards[matrix.key] = card
                while len(self._cards) > 16:
                    self._cards.popitem(last=False)
        return card

    def _preconvert(self, header, matrix: MatrixRef) -> str:
        """The folder of the pattern's conversion into the header's format, made now if not yet
        (:mod:`sparserl.harness.preconvert`)."""
        from sparserl.harness.preconvert import Preconverter

        with self._preconverter_lock:
            if self._preconverter is None:
                self._preconverter = Preconverter(self.config.root / "conversions")
        return self._preconverter.folder(matrix.key, matrix.path, header.format, header.params)

    def _plan_on_host(self, header, matrix: MatrixRef, op: Op, k: int | None) -> tuple[ErrorKind, str] | None:
        """Without a GPU: convert on the host and evaluate the LAUNCH lines exactly as a worker
        would (:func:`~sparserl.harness.launcher.plan_launches`); the refusal, or None."""
        from sparserl.errors import FormatError
        from sparserl.formats import convert
        from sparserl.harness.launcher import plan_launches
        from sparserl.harness.matrix_files import load_matrix_file

        key = (matrix.key, header.format, tuple(sorted(header.params.items())), op, k)
        with self._host_lock:
            env = self._host_plans.get(key)
            if env is None:
                try:  # only the launch environment is kept, not the converted arrays
                    env = convert(load_matrix_file(matrix.path), header.format, header.params).launch_env(
                        op, k, self.config.host_num_sms)
                except FormatError as exc:
                    env = str(exc)
                self._host_plans[key] = env
                while len(self._host_plans) > 64:
                    self._host_plans.popitem(last=False)
        if isinstance(env, str):
            return ErrorKind.FORMAT_REFUSED if "would store" in env else ErrorKind.CONTRACT, env
        launches = plan_launches(header, op, env)
        if isinstance(launches, str):
            return ErrorKind.CONTRACT, launches
        return None

    def _finish(self, payload: dict, extra: dict, matrix: MatrixRef, op: Op, k: int | None, t0: float) -> EvalResult:
        kind = ErrorKind(payload.get("error_kind", "internal_error"))
        if payload.get("matrix_rebuilt"):
            log.warning("%s: the worker found %s changed before this job's first launch (an earlier kernel "
                        "wrote outside its buffers) and rebuilt the matrix; this job ran on the rebuilt one",
                        matrix.name, ", ".join(payload["matrix_rebuilt"]))
        timings = {r: KernelTiming(**t) for r, t in payload.get("timings", {}).items()}
        baseline = {r: KernelTiming(**t) for r, t in payload.get("baseline", {}).items()}
        fields = {k2: payload[k2] for k2 in ("message", "log_tail", "format", "max_scaled_error", "baseline_alg",
                                             "regime", "speedup", "roofline", "conversion_seconds",
                                             "break_even_calls", "smem_bytes", "gpu", "arch",
                                             "checked_timed_outputs", "host") if k2 in payload}
        loaded = payload.get("loaded_registers")
        if loaded is not None:  # the driver's count of the loaded cubin, beside the compiler's report
            extra = extra | {"registers": max(loaded, extra.get("registers") or 0)}
            if loaded > self.config.max_registers:
                extra["over_resource_limit"] = True
        over = extra.get("over_resource_limit", False) or payload.get("over_resource_limit", False)
        return EvalResult(
            op=op.value, k=k, matrix=matrix.name, error_kind=kind, compiled=True,
            correct=kind.verified, timings=timings, baseline=baseline,
            **{**{k2: v for k2, v in extra.items() if k2 not in ("over_resource_limit", "front")}, **fields},
            over_resource_limit=over, eval_seconds=time.perf_counter() - t0,
            profile=_profile(extra.get("front", {}), payload),
        )

    def evaluate(self, text: str, matrix: MatrixRef, op: Op | str = Op.SPMV, k: int | None = None,
                 best_us: float | None = None) -> EvalResult:
        """Evaluate one completion (blocking); ``best_us`` as for :meth:`submit`."""
        return self.submit(text, matrix, op, k, best_us=best_us).result()

    def note_best(self, matrix: MatrixRef, op: Op | str, k: int | None, best_us: float | None,
                  regime: str | None = None) -> None:
        """Tell the evaluator the best time known for a kernel on ``matrix`` (in ``regime``, default
        the reward regime; other regimes are ignored): later submissions on it stop early when
        hopeless (``HarnessConfig.speed.early_stop``). The best of all notes is kept."""
        op = Op(op)
        if best_us is None or not best_us > 0 or (regime or self.config.reward_regime) != self.config.reward_regime:
            return
        key = (matrix.key, op.value, k if op is Op.SPMM else None)
        with self._best_lock:
            self._best[key] = min(best_us, self._best.get(key, best_us))

    def best_known(self, matrix: MatrixRef, op: Op | str, k: int | None) -> float | None:
        """The best time noted for ``matrix`` (:meth:`note_best`), or None."""
        op = Op(op)
        with self._best_lock:
            return self._best.get((matrix.key, op.value, k if op is Op.SPMM else None))

    def submit(self, text: str, matrix: MatrixRef, op: Op | str = Op.SPMV, k: int | None = None,
               best_us: float | None = None, contender: bool = False, fresh: bool = False) -> Future:
        """Evaluate asynchronously: compile on a CPU thread, then run on the next free GPU worker.

        ``best_us``: the best time known for a kernel on this matrix in the reward regime (the best
        of it and what :meth:`note_best` was told is used): a verified kernel slower than
        ``speed.early_stop`` times it (or cuSPARSE's time, if faster) stops early, ``slow``.

        ``contender``: the caller asks only whether the kernel could be the fastest (the library
        oracle). Where the job has the GPU whole, a verification whose first launch predicts more
        than ``speed.contender_scale`` x min(best known, cuSPARSE) a launch stops there, ``timeout``
        (:func:`~sparserl.harness.speed.contender_limit`). Every other verdict is the one an
        ordinary job gives. Never for rewards: such a kernel is scored wrong.

        A completion already submitted on the same (matrix, op, k) shares the first one's result;
        a remembered ``slow`` verdict only while it is still slow against the best known now; an
        ordinary submission never shares a contender job's result before it is known (a contender's
        ``timeout`` is not remembered). ``fresh``: evaluated again whatever was submitted before, not
        remembered, and stopped early only against the caller's ``best_us``, not the best noted (a
        benchmark that times two picks again side by side compares full timings: a pick 3x slower
        than the other would otherwise be stopped after a few runs)."""
        op = Op(op)
        if op is Op.SPMM and (k is None or k < 1):
            raise SparseRLError("SpMM needs k >= 1")
        if op is Op.SPMV:
            k = None
        noted = None if fresh else self.best_known(matrix, op, k)
        known = [t for t in (best_us, noted) if t is not None and t > 0]
        best = min(known) if known else None
        if fresh:
            return self._submit(text, matrix, op, k, best, contender, fresh=True)
        if not self.config.memo:
            return self._submit(text, matrix, op, k, best, contender)
        key = self._memo_key(text, matrix, op, k)
        with self._memo_lock:
            if key in self._memo and self._still_valid(self._memo[key], best, contender):
                self._memo.move_to_end(key)
                self.memo_hits += 1
                shared = self._memo[key]
                return shared if shared.done() else self._follow(shared, text, matrix, op, k, best, contender)
            out = self._submit(text, matrix, op, k, best, contender)
            self._memo[key] = out
            while len(self._memo) > self.config.memo:
                self._memo.popitem(last=False)

        def forget_infrastructure_failures(f: Future) -> None:
            if f.result().error_kind in _NOT_REMEMBERED:
                with self._memo_lock:
                    if self._memo.get(key) is f:
                        del self._memo[key]

        out.add_done_callback(forget_infrastructure_failures)
        return out

    def _follow(self, shared: Future, text: str, matrix: MatrixRef, op: Op, k: int | None, best_us: float | None,
                contender: bool) -> Future:
        """A submission's share of a job still running: its result once done, unless that is a ``slow``
        verdict this submission's best time would not give (the job was sent with a lower best): then the
        kernel is evaluated again for it, timed in full."""
        out: Future = Future()
        out.contender = contender

        def done(f: Future) -> None:
            if self._still_valid(f, best_us, contender):
                _copy_future(f, out)
                return
            try:
                again = self._submit(text, matrix, op, k, best_us, contender)
            except Exception as exc:  # closed meanwhile
                out.set_exception(exc)
                return
            again.add_done_callback(lambda g: _copy_future(g, out))

        shared.add_done_callback(done)
        return out

    def _still_valid(self, remembered: Future, best_us: float | None, contender: bool = False) -> bool:
        """Whether a remembered result answers a new submission: always, unless it is a ``slow``
        verdict that the best time known now would not stop (then the kernel is evaluated again), or
        a contender job's (:meth:`submit`) that an ordinary submission would have to wait for, or
        that timed out."""
        if getattr(remembered, "contender", False) and not contender:
            if not remembered.done() or (remembered.exception() is None
                                         and remembered.result().error_kind is ErrorKind.TIMEOUT):
                return False
        if not remembered.done() or remembered.exception() is not None:
            return True
        r = remembered.result()
        if r.error_kind is not ErrorKind.SLOW:
            return True
        t = r.timings.get(r.regime)
        base = r.baseline.get(r.regime)
        limit = slow_threshold_us(self.config.speed.early_stop, best_us, base.median_us if base else None)
        return t is not None and limit is not None and t.median_us > limit

    def _memo_key(self, text: str, matrix: MatrixRef, op: Op, k: int | None) -> tuple:
        """Everything that makes a remembered verdict valid: the code, the matrix's content (its key
        is a content hash) and name, op, k, how kernels are verified and timed, the harness version."""
        c = self.config
        settings = (c.compile_only, c.regimes, c.reward_regime, c.cold_trials, c.warm_trials, c.warm_target_ms,
                    c.warmup, c.max_smem_bytes, c.max_registers, c.verify, c.compile, c.host_num_sms, c.speed,
                    c.scrub_shared)
        return (hashlib.sha256(text.encode()).hexdigest(), matrix.key, matrix.name, op.value, k, settings,
                HARNESS_VERSION)

    def _submit(self, text: str, matrix: MatrixRef, op: Op, k: int | None, best_us: float | None = None,
                contender: bool = False, fresh: bool = False) -> Future:
        t0 = time.perf_counter()
        front = self._compile_pool.submit(self._front, text, matrix, op, k, t0)
        out: Future = Future()
        out.contender = contender  # read by _still_valid

        def after_front(f: Future) -> None:
            try:
                ready, failed = f.result()
            except Exception as exc:  # a harness bug: report, never raise into the trainer
                out.set_result(EvalResult.failure(op.value, k, matrix.name, ErrorKind.INTERNAL, str(exc)[:300]))
                return
            if failed is not None:
                out.set_result(failed)
                return
            job, extra = ready
            if not self.has_gpu:
                front = extra.pop("front")
                out.set_result(EvalResult.failure(op.value, k, matrix.name, ErrorKind.NO_GPU,
                                                  "compiled; not run (no GPU or compile-only)", compiled=True,
                                                  eval_seconds=time.perf_counter() - t0,
                                                  profile=EvalProfile(seconds=front), **extra))
                return
            job["best_us"] = best_us
            if contender:
                job["contender"] = True
            try:
                fut = self.pool.submit("eval", job)
            except Exception as exc:
                out.set_result(EvalResult.failure(op.value, k, matrix.name, ErrorKind.INTERNAL, str(exc)[:300],
                                                  compiled=True))
                return
            fut.add_done_callback(lambda g: out.set_result(
                self._finish(g.result(), extra, matrix, op, k, t0) if g.exception() is None else
                EvalResult.failure(op.value, k, matrix.name, ErrorKind.INTERNAL, str(g.exception())[:300],
                                   compiled=True)))

        front.add_done_callback(after_front)
        return out

    def evaluate_many(self, items: list[tuple[str, MatrixRef, Op | str, int | None]],
                      contenders: bool = False) -> list[EvalResult]:
        """Evaluate several completions: compiles in parallel, runs on all GPU workers.
        ``contenders``: each is a contender job (:meth:`submit`): only the fastest verified matters."""
        futures = [self.submit(t, m, o, k, contender=contenders) for t, m, o, k in items]
        return [f.result() for f in futures]

    def baseline(self, matrix: MatrixRef, op: Op | str = Op.SPMV, k: int | None = None) -> dict:
        """cuSPARSE's times on ``matrix`` in every configured regime (needs a GPU)."""
        op = Op(op)
        return self.pool.run("baseline", {"op": op.value, "k": k if op is Op.SPMM else None,
                                          "matrix": matrix.job(), "regimes": list(self.config.regimes)})

    def worker_stats(self) -> list[dict]:
        """Per GPU worker: its device, GPU, process id, jobs done and seconds busy (empty before any ran)."""
        import socket

        if self._pool is None:
            return []
        return [{"name": f"gpu{w.device}", "host": socket.gethostname(), "device": w.device,
                 "gpu": w.info.get("gpu"), "pid": w.info.get("pid"), "jobs": w.jobs, "busy_s": w.busy_s,
                 "sync_latency_ms": w.info.get("sync_latency_ms")} for w in self._pool.workers]

    def close(self) -> None:
        self._compile_pool.shutdown(wait=True)
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._preconverter is not None:
            self._preconverter.close()
            self._preconverter = None

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

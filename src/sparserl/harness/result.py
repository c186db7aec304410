"""The typed record of one kernel evaluation: what every reward reads.

Every failure anywhere in the harness (extraction, contract, static checks, compile,
conversion, launch, crash, hang, wrong answer, ...) becomes an :class:`EvalResult`
with ``ok=False`` and an :class:`ErrorKind`; nothing a completion does raises in the
caller.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum

HARNESS_VERSION = 7  # 7: the tolerance capped at rows of 65536; reduced precision refused
"""Bumped whenever a verdict or a time could change for the same kernel: part of every remembered
verdict's key (the evaluator's memo), of the cuSPARSE baseline cache and of the best-known store.
2: timed runs prepared and checked like verification runs, fresh values, guards on both sides,
compiled-code checks. 3: the cold flush also overwrites shared memory, and so does each warm
repetition's preparation (for cuSPARSE's runs too); the
source check lexes numbers as the compiler does and bounds macro and scope nesting; the compiled-code
check follows module addresses through control (jump tables and indirect calls included) and refuses L2
eviction policies (evict-last loads would keep the matrix in L2 through the flush). 4: verification's re-run on a
y holding another output, one cold timed run on the last run's output; static shared memory and registers read
from the loaded cubin. 5: a carriage return outside a CRLF refused (nvcc ends a line there); the compiled-code
check follows an address rebuilt by loads at addresses computed from its bits (its pieces taken by shifts, masks,
narrowing conversions, vector moves or the carry flag; registers inline PTX names without a '%' followed), and
refuses module data declared inside a function. 6: ``A_alt``'s values have one sign per row and timed runs'
x is non-negative (no cancellation in any timed row, so a kernel that leaves out the tail of a long row is
caught), and a non-negative input is verified on ``A`` and on ``A_alt``. 7: the tolerance stops growing at rows of
65536 entries, and reduced-precision arithmetic is refused from the compiled code."""


class ErrorKind(str, Enum):
    """Why an evaluation did not produce a correct, timed kernel."""

    NONE = "none"
    EXTRACT = "extract_error"  # no FORMAT:/LAUNCH: header or no code found in the text
    CONTRACT = "contract_error"  # header or signature breaks the contract
    STATIC = "static_check"  # banned construct (host code, asm, printf, global state, ...)
    COMPILE = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    FORMAT_REFUSED = "format_refused"  # the converter refused the format for this matrix (fill limit)
    RESOURCE = "resource_limit"  # shared memory or registers past the configured limit
    LAUNCH = "launch_error"  # the launch itself failed (bad config for this kernel, missing kernel)
    CRASHED = "crashed"  # illegal address, trap, ... (the worker was restarted)
    TIMEOUT = "timeout"  # did not finish in time (the worker was killed and restarted), or its first
    # verification launch showed that the others would not (stopped there; speed.predicted_overrun)
    INCORRECT = "incorrect"  # wrong values, unwritten rows (NaN poison), ...
    INPUT_MODIFIED = "input_modified"  # wrote to the matrix arrays or x
    NONDETERMINISTIC = "nondeterministic"  # two runs on the same input disagree (no atomics used)
    SLOW = "slow"  # verified correct, stopped early: slower than the early-stop factor x the best known
    NO_GPU = "no_gpu"  # compile-only evaluation: nothing was run
    INTERNAL = "internal_error"  # a harness bug, reported rather than raised

    @property
    def compiled(self) -> bool:
        """Whether a result with this kind got as far as a successful compile."""
        return self not in _NOT_COMPILED

    @property
    def verified(self) -> bool:
        """Whether a result with this kind passed every check: correct, and timed (``slow``: timed
        until it was clear it is far slower than the best known; its time is that measurement)."""
        return self in (ErrorKind.NONE, ErrorKind.SLOW)


_NOT_COMPILED = {ErrorKind.EXTRACT, ErrorKind.CONTRACT, ErrorKind.STATIC, ErrorKind.COMPILE,
                 ErrorKind.COMPILE_TIMEOUT}


@dataclass(frozen=True)
class KernelTiming:
    """Device time per run in one L2 regime (see :mod:`sparserl.harness.timing`)."""

    regime: str
    median_us: float
    p10_us: float
    p90_us: float
    spread: float
    trials: int | None = None
    """Timed samples behind the median (cold: runs, adaptive; warm: graph replays)."""


@dataclass(frozen=True)
class EvalProfile:
    """Where one evaluation's wall time went (:mod:`sparserl.harness.profile` names the steps)."""

    seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds per step, each step's own time (nested steps are not counted twice)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Launches, timed runs, checked outputs and host waits of the evaluation."""

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


@dataclass(frozen=True)
class EvalResult:
    """One completion evaluated on one matrix."""

    op: str
    """'spmv' or 'spmm'."""
    k: int | None
    """SpMM columns (None for SpMV)."""
    matrix: str
    """Name of the matrix (for reports)."""
    error_kind: ErrorKind
    """NONE when the kernel compiled, verified correct and was timed; SLOW when it verified correct
    and its timing stopped early (its time is what was measured by then)."""
    message: str = ""
    """One line on what went wrong (or empty)."""
    log_tail: str = ""
    """Tail of the compiler or worker output, for debugging."""
    format: str | None = None
    """Storage format the completion asked for."""
    compiled: bool = False
    correct: bool = False
    """Passed every check (``error_kind`` NONE or SLOW): rewards score it by its measured speed."""
    max_scaled_error: float | None = None
    """Worst |y - ref| / tolerance over the verification inputs (<= 1 passes)."""
    timings: dict[str, KernelTiming] = field(default_factory=dict)
    """Kernel time per regime ('cold', 'warm')."""
    baseline: dict[str, KernelTiming] = field(default_factory=dict)
    """cuSPARSE's best time per regime, measured the same way in the same worker."""
    baseline_alg: str | None = None
    regime: str = "cold"
    """The regime ``speedup`` and ``roofline`` refer to (the reward's)."""
    speedup: float | None = None
    """t_cusparse / t_kernel in ``regime``."""
    roofline: float | None = None
    """Compulsory bytes / t_kernel / measured copy bandwidth, in ``regime``."""
    conversion_seconds: float = 0.0
    """Host time to convert CSR into the kernel's format."""
    break_even_calls: float | None = None
    """Calls after which the conversion has paid for itself against cuSPARSE (None: never)."""
    registers: int | None = None
    """Most registers per thread over the launched kernels."""
    smem_bytes: int | None = None
    """Most shared memory per block (static + dynamic) over the launched kernels."""
    spill_bytes: int | None = None
    over_resource_limit: bool = False
    gpu: str | None = None
    arch: str | None = None
    eval_seconds: float = 0.0
    """Wall time of the whole evaluation (compile included)."""
    checked_timed_outputs: int = 0
    """Timed runs whose output was compared with the reference (every cold run, and per warm sample
    the last run and one chosen at random)."""
    harness_version: int = HARNESS_VERSION
    profile: EvalProfile | None = None
    """Per-step wall times of this evaluation (None when it did not reach the harness's steps)."""
    host: str | None = None
    """The machine whose GPU ran it, when that is not this one (a farm's node)."""

    @property
    def ok(self) -> bool:
        """Verified correct and timed: ``none``, or ``slow`` (stopped early as hopeless, its time the
        few runs it took). Every consumer that ranks or rewards kernels reads this; ``error_kind is
        ErrorKind.NONE`` alone says the timing ran in full."""
        return self.error_kind.verified

    def to_dict(self) -> dict:
        d = asdict(self)
        d["error_kind"] = self.error_kind.value
        return d

    @classmethod
    def failure(cls, op: str, k: int | None, matrix: str, kind: ErrorKind, message: str, **kw) -> "EvalResult":
        return cls(op=op, k=k, matrix=matrix, error_kind=kind, message=message,
                   compiled=kw.pop("compiled", kind.compiled), **kw)

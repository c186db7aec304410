"""Test doubles for the search's tests.

:class:`FakeTimingDouble` stands in for the harness's GPU path only: it compiles and runs nothing,
and answers every submission with a real :class:`EvalResult` whose kernel time is a function
the test gives of the candidate (through its text). It lets the search *policy* be tested on
a CPU; the harness itself is tested elsewhere, the search's real compile-only path runs
through the real Evaluator in test_cli.py, and the search and improve loops run with the real
harness on a GPU in test_search_gpu.py and tests/improve/test_improve_gpu.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sparserl.harness.evaluator import MatrixRef
from sparserl.harness.result import ErrorKind, EvalResult, KernelTiming
from sparserl.search.space import normalised

CUSPARSE_US = 100.0


@dataclass(frozen=True)
class WrongButTimed:
    """``time_of``'s answer for an incorrect kernel whose result nonetheless carries a kernel time
    (fast, typically): what a search must never rank, whatever the time says."""

    t_us: float


def timed_result(op: str, k, name: str, t_us: float | ErrorKind | WrongButTimed | None, regime: str = "cold",
                 cusparse_us: float = CUSPARSE_US, arch: str = "sm_90") -> EvalResult:
    """A correct, timed result (t_us), an incorrect one (None), an incorrect one with a time
    (:class:`WrongButTimed`), or a failure of the kind given."""
    if isinstance(t_us, WrongButTimed):
        kt = KernelTiming(regime, t_us.t_us, t_us.t_us, t_us.t_us, 0.0)
        base = KernelTiming(regime, cusparse_us, cusparse_us, cusparse_us, 0.0)
        return EvalResult(op=op, k=k, matrix=name, error_kind=ErrorKind.INCORRECT, compiled=True, correct=False,
                          message="incorrect (double)", timings={regime: kt}, baseline={regime: base},
                          baseline_alg="double", regime=regime, speedup=cusparse_us / t_us.t_us, format="CSR",
                          arch=arch, gpu="double")
    if t_us is None or isinstance(t_us, ErrorKind):
        kind = t_us or ErrorKind.INCORRECT
        return EvalResult.failure(op, k, name, kind, f"{kind.value} (double)", compiled=True,
                                  arch=arch, gpu="double")
    kt = KernelTiming(regime, t_us, t_us, t_us, 0.0)
    base = KernelTiming(regime, cusparse_us, cusparse_us, cusparse_us, 0.0)
    return EvalResult(op=op, k=k, matrix=name, error_kind=ErrorKind.NONE, compiled=True, correct=True,
                      timings={regime: kt}, baseline={regime: base}, baseline_alg="double", regime=regime,
                      speedup=cusparse_us / t_us, roofline=0.5, format="CSR", arch=arch, gpu="double")


class FakeTimingDouble:
    """A GPU-path double (see the module docstring), for CPU unit tests only: it reports
    ``has_gpu`` but runs nothing. ``time_of(text)``: the kernel time in us, None for an incorrect
    kernel, or an ErrorKind for that failure. ``delay``: seconds each evaluation takes (on threads)."""

    has_gpu = True

    def __init__(self, time_of: Callable[[str], float | None], delay: float = 0.0, workers: int = 2,
                 interrupt_after: int | None = None, arch: str = "sm_90"):
        self.time_of, self.delay, self.arch = time_of, delay, arch
        self.interrupt_after = interrupt_after
        self.submitted: list[str] = []
        self.fresh: list[bool] = []  # each submission's ``fresh`` flag, in order
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers) if delay else None

    def register(self, A, name: str = "matrix") -> MatrixRef:
        return MatrixRef("double", "/nonexistent", name, (int(A.shape[0]), int(A.shape[1])), int(A.nnz))

    def gpu_lease(self, device):
        import contextlib

        return contextlib.nullcontext()

    def _result(self, text: str, ref: MatrixRef, op, k) -> EvalResult:
        if self.delay:
            time.sleep(self.delay)
        return timed_result(getattr(op, "value", op), k, ref.name, self.time_of(text), arch=self.arch)

    def submit(self, text: str, ref: MatrixRef, op, k=None, fresh: bool = False) -> Future:
        with self.lock:
            if self.interrupt_after is not None and len(self.submitted) >= self.interrupt_after:
                raise KeyboardInterrupt
            self.submitted.append(text)
            self.fresh.append(fresh)
        if self.pool is not None:
            return self.pool.submit(self._result, text, ref, op, k)
        f: Future = Future()
        f.set_result(self._result(text, ref, op, k))
        return f

    def evaluate_many(self, items, contenders: bool = False) -> list[EvalResult]:
        return [self.submit(t, m, o, k).result() for t, m, o, k in items]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def by_text(times: dict[str, float | None], default: float | None = None) -> Callable[[str], float | None]:
    """``time_of`` from a table keyed by text (whitespace-insensitive)."""
    table = {normalised(t): v for t, v in times.items()}
    return lambda text: table.get(normalised(text), default)


def racy_landscape(faster_again: float = 0.0) -> tuple[Callable[[str], float | None], dict[str, int]]:
    """``time_of`` for :class:`FakeTimingDouble`, and the kernels' ranks it fills in (normalised text -> the order
    first seen): the first kernel proposed is the fastest at first (5 us) and wrong on every later evaluation (a
    racy kernel that passed once); the others take 20 + their rank us at first, ``faster_again`` us less when
    evaluated again."""
    order: dict[str, int] = {}
    seen: dict[str, int] = {}

    def time_of(text: str) -> float | None:
        key = normalised(text)
        rank = order.setdefault(key, len(order))
        seen[key] = seen.get(key, 0) + 1
        if rank == 0:
            return 5.0 if seen[key] == 1 else None
        return 20.0 + rank - (faster_again if seen[key] > 1 else 0.0)

    return time_of, order


def racy_beside(known: str, steady: Callable[[str], float | None]) -> tuple[Callable[[str], float | None], dict[str, int]]:
    """``time_of`` for a search that starts from a store whose best is ``known``: the first other kernel proposed is
    the fastest at first (5 us) and wrong on every later evaluation (a racy kernel that passed once); every other
    kernel takes ``steady``'s time. The dict it fills: that kernel's normalised text -> its evaluations."""
    seen: dict[str, int] = {}

    def time_of(text: str) -> float | None:
        key = normalised(text)
        if key != normalised(known) and (not seen or key in seen):
            seen[key] = seen.get(key, 0) + 1
            return 5.0 if seen[key] == 1 else None
        return steady(text)

    return time_of, seen

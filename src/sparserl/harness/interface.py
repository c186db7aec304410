"""The evaluator interface: what the search, RL rollouts and the farm ask of whoever judges kernels.

Two implementations serve it: :class:`~sparserl.harness.evaluator.Evaluator`, in this process with
one worker per local GPU (the default), and :class:`~sparserl.farm.ray_evaluator.RayEvaluator`, a
Ray cluster's GPUs (one actor per GPU) and CPUs (compiles as tasks). Code that takes an evaluator
types it with :class:`KernelEvaluator` and never asks which one it got; the farm picks one from a
config and an optional Ray address (:func:`sparserl.farm.run.open_farm_evaluator`).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import scipy.sparse as sp

    from sparserl.harness.evaluator import HarnessConfig, MatrixRef
    from sparserl.harness.result import EvalResult
    from sparserl.kernels.contract import Op


@runtime_checkable
class KernelEvaluator(Protocol):
    """Compiles, verifies and times completions on registered matrices (see the module docstring)."""

    @property
    def has_gpu(self) -> bool:
        """Whether kernels run (False: compile-only, every result ``no_gpu``)."""
        ...

    @property
    def arch(self) -> str | None:
        """The GPU architecture kernels are timed on (sm_XY); None when nothing is timed or it is not one."""
        ...

    def register(self, A: sp.csr_array, name: str = "matrix") -> MatrixRef:
        """Make ``A`` available to whatever runs the kernels; the handle evaluations name it by."""
        ...

    def submit(self, text: str, matrix: MatrixRef, op: Op | str = ..., k: int | None = None) -> Future:
        """Evaluate asynchronously: a future of the :class:`EvalResult` (never an exception from the kernel)."""
        ...

    def evaluate(self, text: str, matrix: MatrixRef, op: Op | str = ..., k: int | None = None) -> EvalResult:
        """Evaluate one completion (blocking)."""
        ...

    def evaluate_many(self, items: list[tuple[str, MatrixRef, Op | str, int | None]],
                      contenders: bool = False) -> list[EvalResult]:
        """Evaluate several completions at once, results in their order (``contenders``: only the
        fastest verified one matters, :meth:`Evaluator.submit <sparserl.harness.evaluator.Evaluator.submit>`)."""
        ...

    def gpu_lease(self, device):
        """A context manager holding a local GPU against timing while the caller computes on it."""
        ...

    def close(self) -> None:
        """Stop the workers (or let go of the cluster)."""
        ...

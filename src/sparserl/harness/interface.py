"""The evaluator interface: what the search, RL rollouts and the farm ask of whoever judges kernels.

Two implementations serve it: :class:`~sparserl.harness.evaluator.Evaluator`, in this process with
one worker per local GPU (the default), and :class:`~sparserl.farm.ray_evaluator.RayEvaluator`, a
Ray cluster's GPUs (one actor per GPU) and CPUs (compiles as tasks). Code that takes an evaluator
types it with :class:`KernelEvaluator` and never asks which one it got; :func:`open_evaluator`
picks one from a config and an optional Ray address.
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

    def register(self, A: sp.csr_array, name: str = "matrix") -> MatrixRef:
        """Make ``A`` available to whatever runs the kernels; the handle evaluations name it by."""
        ...

    def submit(self, text: str, matrix: MatrixRef, op: Op | str = ..., k: int | None = None) -> Future:
        """Evaluate asynchronously: a future of the :class:`EvalResult` (never an exception from the kernel)."""
        ...

    def evaluate(self, text: str, matrix: MatrixRef, op: Op | str = ..., k: int | None = None) -> EvalResult:
        """Evaluate one completion (blocking)."""
        ...

    def evaluate_many(self, items: list[tuple[str, MatrixRef, Op | str, int | None]]) -> list[EvalResult]:
        """Evaluate several completions at once, results in their order."""
        ...

    def gpu_lease(self, device):
        """A context manager holding a local GPU against timing while the caller computes on it."""
        ...

    def close(self) -> None:
        """Stop the workers (or let go of the cluster)."""
        ...


def open_evaluator(config: HarnessConfig | None = None, ray: str | None = None, **farm) -> KernelEvaluator:
    """The in-process evaluator, or with ``ray`` (a Ray address: ``host:port``, ``auto``,
    ``ray://host:10001``) the farm's (``farm``: :class:`~sparserl.farm.ray_evaluator.RayEvaluator`'s
    options). Ray is imported only in the second case (the ``farm`` extra)."""
    from sparserl.harness.evaluator import Evaluator, HarnessConfig

    config = config or HarnessConfig()
    if ray is None:
        return Evaluator(config)
    from sparserl.farm.ray_evaluator import RayEvaluator

    return RayEvaluator(config, ray, **farm)

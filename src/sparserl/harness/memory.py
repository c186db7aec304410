"""What a GPU worker lets go of before it converts a matrix again, so its caches never fill the GPU.

A worker keeps every matrix it has seen lately (:class:`~sparserl.harness.resident.MatrixCache`) and,
for each, every conversion a candidate asked for, with a pristine copy of each. A search of a few
hundred candidates on a 1M-row matrix asks for dozens of (format, parameters) conversions, each as
large as the matrix or larger; kept all, they filled an 80 GB GPU by the seventh matrix of a benchmark
and every later evaluation failed for want of memory. Before a worker makes a conversion it does not
have, it asks the device how much is free; below the reserve it drops, least recently used first,
the other matrices it keeps and then this matrix's other conversions, until the estimate says the
reserve is free again. :func:`shed_plan` decides that from sizes alone (pure, tested on the CPU).

Dropping is safe for the checks: a dropped conversion is converted and uploaded again from the host
copy when a candidate next asks for it, with a fresh pristine copy and fingerprint.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

GiB = float(1 << 30)


@dataclass(frozen=True)
class ShedPlan:
    """What to drop: whole matrices (by key) and conversions of the current matrix (by key), in order."""

    matrices: list[Hashable] = field(default_factory=list)
    conversions: list[Hashable] = field(default_factory=list)
    freed_bytes: int = 0
    """The sizes of what is dropped, added up (an estimate of what the device gets back)."""

    @property
    def empty(self) -> bool:
        return not self.matrices and not self.conversions


def reserve_bytes(total: int, reserve_fraction: float) -> int:
    """The free memory a worker keeps before it makes a new conversion."""
    if not 0.0 <= reserve_fraction < 1.0:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction}")
    return int(total * reserve_fraction)


def shed_plan(free: int, total: int, reserve_fraction: float, matrices: Sequence[tuple[Hashable, int]],
              conversions: Sequence[tuple[Hashable, int]]) -> ShedPlan:
    """What to drop so that ``free`` bytes reach the reserve (``reserve_fraction`` of ``total``).

    ``matrices``: the other resident matrices as (key, bytes), least recently used first (never the
    current one); ``conversions``: the current matrix's conversions as (key, bytes), least recently
    used first (never the one about to be made: it is not made yet). Whole matrices go first (a
    matrix not in use costs nothing to drop but its reload), then conversions. Nothing is dropped
    while the reserve is free; when everything is dropped and it is still not, that is the plan."""
    need = reserve_bytes(total, reserve_fraction) - free
    plan_m: list[Hashable] = []
    plan_c: list[Hashable] = []
    freed = 0
    for key, size in matrices:
        if freed >= need:
            break
        plan_m.append(key)
        freed += max(0, int(size))
    for key, size in conversions:
        if freed >= need:
            break
        plan_c.append(key)
        freed += max(0, int(size))
    return ShedPlan(plan_m, plan_c, freed)

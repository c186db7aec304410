"""Independent CPU work mapped over threads: numpy and scipy release the GIL for most of their work,
so loading, generating and describing several matrices at once uses the machine's cores."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8
"""Threads at most: each holds one matrix's working arrays at a time, so this also bounds the
memory the work takes on top of the matrices themselves."""


def workers_for(jobs: int, workers: int | None = None) -> int:
    """Threads for ``jobs`` independent pieces of work: ``workers`` when given, else the machine's
    cores up to :data:`MAX_WORKERS`; never more than the jobs, never fewer than one."""
    want = workers if workers is not None else min(MAX_WORKERS, os.cpu_count() or 1)
    return max(1, min(want, jobs))


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None,
                 name: str = "warm") -> list[R]:
    """``[fn(x) for x in items]`` in threads, results in order; one thread runs it in place. An
    exception from ``fn`` is raised here (the first in item order)."""
    n = workers_for(len(items), workers)
    if n <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix=name) as pool:
        return list(pool.map(fn, items))

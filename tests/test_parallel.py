"""Independent work mapped over threads: results in item order, the first error in item order, and
really more than one thread at once; the thread count bounded by the work."""

from __future__ import annotations

import threading
import time

import pytest

from sparserl import parallel


def test_parallel_map_keeps_the_order_and_uses_threads() -> None:
    names: set[str] = set()
    barrier = threading.Barrier(2, timeout=10)  # passes only if two calls run at once

    def fn(x: int) -> int:
        names.add(threading.current_thread().name)
        if x < 2:
            barrier.wait()
        time.sleep(0.02 * (6 - x))  # the early items end last: the results must still come in item order
        return x * x

    assert parallel.parallel_map(fn, list(range(6)), workers=2, name="t") == [0, 1, 4, 9, 16, 25]
    assert names and all(n.startswith("t") for n in names)
    assert parallel.parallel_map(lambda x: threading.current_thread().name, [1], workers=4) == [
        threading.current_thread().name]  # one item: in place, no pool


def test_parallel_map_raises_the_first_error_in_item_order() -> None:
    def fn(x: int) -> int:
        if x in (1, 3):
            raise ValueError(f"bad {x}")
        return x

    with pytest.raises(ValueError, match="bad 1"):
        parallel.parallel_map(fn, [0, 1, 2, 3], workers=2)


@pytest.mark.parametrize("jobs, workers, want", [(0, None, 1), (3, 16, 3), (100, 2, 2), (5, 0, 1)])
def test_workers_are_bounded_by_the_jobs(jobs: int, workers: int | None, want: int) -> None:
    assert parallel.workers_for(jobs, workers) == want
    assert parallel.workers_for(1000) <= parallel.MAX_WORKERS

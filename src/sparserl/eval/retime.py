"""A second look: kernels already measured, timed again side by side.

A search's best is the luckiest of many timings (the best of 64 candidates, many of them near-identical),
so a ratio between two searches' or a search's and an oracle's bests carries that selection. Timing the
picks again, fresh (never answered from the harness's memo), one evaluation at a time and every other pass
in the reverse order, and comparing the passes' medians, does not (``benchmarks/search_bench.py``,
``benchmarks/guided_search.py``).
"""

from __future__ import annotations

import statistics

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op


class EvaluationsStopped(SparseRLError):
    """A stop was asked for between the evaluations of :func:`evaluate_again`."""


def evaluate_again(ev, ref, op: Op | str, k: int | None, texts: list[str], passes: int, stop=None) -> list[list]:
    """Each text evaluated ``passes`` more times through ``ev`` (an ``Evaluator``), fresh (never answered from
    its memo), one evaluation at a time, every other pass in the reverse order: the ``EvalResult`` objects, text by
    text. ``stop``: a ``threading.Event``; once set, no further evaluation starts (:class:`EvaluationsStopped`)."""
    out: list[list] = [[] for _ in texts]
    order = list(range(len(texts)))
    for p in range(passes):
        for i in order if p % 2 == 0 else order[::-1]:
            if stop is not None and stop.is_set():
                raise EvaluationsStopped("stopped while kernels were evaluated again")
            out[i].append(ev.submit(texts[i], ref, op, k, fresh=True).result())
    return out


def retime(ev, ref, op: Op | str, k: int | None, texts: dict[str, str], passes: int, regime: str
           ) -> dict[str, list[float | None]]:
    """Each named kernel evaluated again as :func:`evaluate_again` does: its times in us (None where an
    evaluation was not a verified, timed kernel), by name."""
    names = list(texts)
    results = evaluate_again(ev, ref, op, k, [texts[n] for n in names], passes)
    return {n: [r.timings[regime].median_us if r.ok and regime in r.timings else None for r in rs]
            for n, rs in zip(names, results)}


def retime_distinct(ev, ref, op: Op | str, k: int | None, texts: dict[str, str], passes: int, regime: str
                    ) -> dict[str, list[float | None]]:
    """:func:`retime`, where names with the same kernel (its text up to white space) share one evaluation a
    pass: one kernel is never timed against itself."""
    same: dict[str, str] = {}  # name -> the first name with its kernel
    for name, text in texts.items():
        same[name] = next((n for n in same if same[n] == n and texts[n].split() == text.split()), name)
    got = retime(ev, ref, op, k, {n: texts[n] for n in texts if same[n] == n}, passes, regime)
    return {name: list(got[same[name]]) for name in texts}


def median_us(times: list[float | None] | None) -> float | None:
    """The median of one kernel's second-look times; None when it has none or one of them failed."""
    if not times or any(t is None for t in times):
        return None
    return statistics.median(times)

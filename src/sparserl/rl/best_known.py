"""The best-known store as RL's teacher (reward ``relative_best``).

Before a batch is scored, each correct sample's time is compared with the store's best time for
its matrix structure (fingerprint), op, k, GPU architecture, timing regime and harness version:
``reward = clip(log2(t_best / t))`` above the compile/correct ladder, so matching the best known
earns about 0 and only beating it earns more (:func:`sparserl.rewards.relative_best_reward`).
Every sample of a batch is scored against the best as it stood *before* the batch. Then the
correct samples faster than that best are written to the store (the fastest of them becomes the
new best), so the next batch must beat them. A matrix with nothing in the store yet is scored
against cuSPARSE (clipped_log's speed term), and its correct samples start its entry.

The bar is never above the sample's own cuSPARSE time (a kernel slower than cuSPARSE earns no
more than clipped_log gives it, whatever the store holds), and a best from another GPU of the same
architecture is scaled to the sample's GPU by the two cuSPARSE times (:meth:`BestKnown.best_us`).

``reward/new_best_known`` counts new best-known kernels: the store entries (matrix structure, op,
k, architecture, regime) whose bar the batch raised, once each however many of its samples beat
the bar, where the bar is as above: the store's best before the batch, or cuSPARSE where that is
faster or nothing is known (a first correct kernel slower than cuSPARSE starts the entry but beats
nothing).

Timing noise: the store keeps the fastest measurement ever seen, so the bar only ever drops;
a sample as fast as the best scores slightly below 0 on average. Seed the store with
``sparserl search`` on the training matrices for a bar that the library's best already sets.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparserl.harness.result import EvalResult
from sparserl.rewards import kernel_us

if TYPE_CHECKING:
    from sparserl.search.store import BestStore

log = logging.getLogger(__name__)


@dataclass
class BestKnown:
    """Best times read from, and new bests written to, a :class:`~sparserl.search.store.BestStore`."""

    store: BestStore
    regime: str = "cold"
    model: str | None = None
    """The policy's name, recorded with the kernels it wrote."""
    run_id: str = field(default_factory=lambda: f"rl-{uuid.uuid4().hex[:12]}")
    _cards: dict = field(default_factory=dict)
    _sinks: dict = field(default_factory=dict)

    def card(self, item):
        """The matrix card of an RL item's matrix (computed once per matrix)."""
        from sparserl.matrices.card import matrix_card

        key = id(item.A)
        if key not in self._cards:
            self._cards[key] = matrix_card(item.A)
        return self._cards[key]

    def best_us(self, item, r: EvalResult) -> float | None:
        """The bar (us) for ``r``: the store's best time under ``r``'s key, never above ``r``'s own
        cuSPARSE time, or None (nothing known, or ``r`` not timed).

        A best measured on another GPU of the same architecture (an H200's for an H100's sample) is
        brought to ``r``'s GPU by the two cuSPARSE times (its speedup over cuSPARSE is what carries
        over). The cap keeps a store whose best is slower than cuSPARSE (a first correct kernel that
        was stopped early as slow, say) from paying a sample for beating it while it is slower than
        cuSPARSE."""
        if not r.ok or kernel_us(r) is None:
            return None
        return self._bar(self._rows(item, r), r)

    def _rows(self, item, r: EvalResult) -> list:
        """The store's best rows under ``r``'s key (:meth:`key`)."""
        fp = self.card(item).fingerprint  # a whole fingerprint: the store's prefix match is exact here
        return self.store.best(fingerprint=fp, op=item.op.value, k=item.k, arch=r.arch or "unknown",
                               regime=r.regime, harness_version=str(r.harness_version))

    @staticmethod
    def _bar(rows: list, r: EvalResult) -> float | None:
        """:meth:`best_us` from the rows read: each scaled to ``r``'s GPU, the least, capped by cuSPARSE."""
        base = r.baseline.get(r.regime)
        t_base = base.median_us if base is not None and base.median_us > 0 else None
        bars = [row.time_us * t_base / row.cusparse_us
                if t_base is not None and row.gpu != r.gpu and row.cusparse_us > 0 else row.time_us for row in rows]
        best = min(bars, default=None)
        return best if best is None or t_base is None else min(best, t_base)

    def bests(self, items: list, results: list[EvalResult]) -> list[float | None]:
        """:meth:`best_us` of each (item, result), all read before anything of the batch is written
        (one store query per matrix and key: a batch holds each matrix's samples in a row; the bar is
        then made for each result, whose GPU and cuSPARSE time are its own)."""
        rows: dict[tuple, list] = {}
        out = []
        for it, r in zip(items, results):
            if not r.ok or kernel_us(r) is None:
                out.append(None)
                continue
            key = self.key(it, r)
            if key not in rows:
                rows[key] = self._rows(it, r)
            out.append(self._bar(rows[key], r))
        return out

    def key(self, item, r: EvalResult) -> tuple:
        """The store entry a timed result of ``item`` competes in."""
        return (self.card(item).fingerprint, item.op.value, item.k, r.arch or "unknown", r.regime,
                str(r.harness_version))

    def record(self, items: list, texts: list[str], results: list[EvalResult],
               before: list[float | None]) -> set[tuple]:
        """Write the correct samples faster than the store's own best before the batch to the store
        (whatever the bar they were scored against: a store whose best is slower than cuSPARSE still
        improves); returns the entries (:meth:`key`) whose bar the batch raised: a new best faster than
        ``before`` (their bar when scored), or than cuSPARSE where nothing was known (module docstring)."""
        from sparserl.search.loop import StoreSink, TraceEntry
        from sparserl.search.space import Provenance, text_proposal

        raised: set[tuple] = set()
        stored: dict[tuple, float | None] = {}  # the store's own best time per entry before the batch
        for it, r in zip(items, results):
            if r.ok and kernel_us(r) is not None and (key := self.key(it, r)) not in stored:
                stored[key] = min((row.time_us for row in self._rows(it, r)), default=None)
        for it, text, r, b in zip(items, texts, results, before):
            t = kernel_us(r) if r.ok else None
            if t is None or r.regime not in r.baseline:
                continue
            own = stored[self.key(it, r)]
            if own is not None and t >= own:  # the store keeps what beats its own best, capped bar or not
                continue
            card = self.card(it)
            sink = self._sinks.get(card.fingerprint)
            if sink is None:
                from sparserl.search.run import coords_later

                sink = self._sinks[card.fingerprint] = StoreSink(
                    self.store, card, it.name, None, coords_later(it.A), {"rl": self.run_id}, model=self.model)
            entry = TraceEntry(0, text_proposal(text, it.op, Provenance.POLICY_SAMPLE, note="RL rollout"), r, 0.0)
            became_best = sink.write(f"{self.run_id}-{card.fingerprint[:8]}", it.op, it.k, r.regime, entry)
            if became_best and t < (b if b is not None else r.baseline[r.regime].median_us):
                raised.add(self.key(it, r))
        if raised:
            log.info("RL found %d new best-known kernels (written to %s)", len(raised),
                     getattr(self.store, "path", "the store"))
        return raised

    def close(self) -> None:
        for sink in self._sinks.values():
            sink.finish("finished")

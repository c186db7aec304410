"""The second look before a kernel is handed back (``sparserl.request.second_look``), on the CPU.

The evaluations are :class:`tests.search.doubles.FakeTimingDouble`'s (it runs nothing; each kernel's time
is what the test says, evaluation by evaluation), so what is tested here is the choice: which candidates
are looked at again, which one is handed back, and what the report says about it. The real path (the
harness's fresh evaluations on a GPU) runs in ``tests/eval/test_generate.py``
(``test_no_trained_model_on_a_gpu_returns_the_best_verified_library_kernel``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind
from sparserl.kernels.contract import Op
from sparserl.kernels.library import get_variant
from sparserl.matrices import generate
from sparserl.request.candidates import CandidatePool, Origin
from sparserl.request.context import MatrixContext
from sparserl.request.report import KernelReport, verdict
from sparserl.request.second_look import MOST, SecondLook, SecondLookFailed, second_look
from sparserl.search.space import normalised
from tests.search.doubles import CUSPARSE_US, FakeTimingDouble, racy_beside, racy_landscape

KERNELS = [get_variant(v).render() for v in ("spmv/csr_vector/-/tpr=4,block=256", "spmv/csr_vector/-/tpr=8,block=256",
                                               "spmv/csr_vector/-/tpr=16,block=256", "spmv/csr_vector/-/tpr=32,block=256",
                                               "spmv/csr_scalar/-/block=256")]


class Sequence:
    """``time_of``: each kernel's times evaluation by evaluation (the last one repeats); None: incorrect, an
    ErrorKind: that failure; a kernel not listed: ``default``."""

    def __init__(self, times: dict[str, list], default: float | None = None):
        self.times = {normalised(t): list(v) for t, v in times.items()}
        self.default = default

    def __call__(self, text: str):
        seq = self.times.get(normalised(text), [self.default])
        return seq.pop(0) if len(seq) > 1 else seq[0]


def same(a: str, b: str) -> bool:
    """The same kernel, up to layout (the pool keeps the text as the harness extracted it)."""
    return normalised(a) == normalised(b)


def pool_of(times: dict[str, list[float | None]]):
    """A pool whose candidates were evaluated once (their first times) through a double that answers the
    later evaluations from the rest of each list."""
    ev = FakeTimingDouble(Sequence(times))
    ctx = MatrixContext(generate("banded", 300, seed=1), "banded_300", Op.SPMV)
    pool = CandidatePool(ctx, timed=True)
    pool.evaluate(ev, [(t, Origin.MODEL) for t in times])
    return pool, ev


def test_the_fastest_by_a_second_look_is_handed_back_and_reported():
    # the first timings favour KERNELS[0] (10.0 against 10.2); evaluated again, KERNELS[1] is faster
    pool, ev = pool_of({KERNELS[0]: [10.0, 11.0, 11.2, 10.9], KERNELS[1]: [10.2, 10.4, 10.3, 10.5],
                        KERNELS[2]: [20.0]})
    assert same(pool.best().text, KERNELS[0])
    pick, look = second_look(pool, ev, "cold", passes=3)
    assert same(pick.text, KERNELS[1])  # killed by: keeping the first timings' best
    assert look.changed and look.looked_at == 2 and look.dropped == 0  # KERNELS[2] is past the 5% bar
    assert look.times_us == [10.4, 10.3, 10.5] and look.median_us == 10.4
    assert look.first_us == 10.2
    assert look.speedup == pytest.approx(CUSPARSE_US / 10.4)  # killed by: reporting the first timing's speedup
    assert ev.fresh[-6:] == [True] * 6 and ev.fresh[:3] == [False] * 3  # never answered from the memo
    # every other pass in the reverse order
    assert [normalised(t) for t in ev.submitted[3:]] == [normalised(k) for k in
                                                          (KERNELS[0], KERNELS[1], KERNELS[1], KERNELS[0],
                                                           KERNELS[0], KERNELS[1])]


def test_a_kernel_that_fails_its_second_look_is_never_handed_back():
    pool, ev = pool_of({KERNELS[0]: [9.0, 9.0, None, 9.0], KERNELS[1]: [9.3, 9.4, 9.4, 9.4]})
    pick, look = second_look(pool, ev, "cold", passes=3)
    assert same(pick.text, KERNELS[1])  # killed by: a median over the passes that succeeded
    assert look.dropped == 1 and look.changed
    assert "incorrect when evaluated again" in pool.dropped[normalised(KERNELS[0])]
    assert [normalised(c.text) for c in pool.found_wrong] == [normalised(KERNELS[0])]
    assert [r.verdict for r in pool.runners_up(pick)][0].startswith("correct once, then dropped: incorrect")
    assert all(not same(c.text, KERNELS[0]) for c in pool.usable())  # never handed back later either


def test_when_every_rival_fails_the_next_fastest_are_looked_at():
    pool, ev = pool_of({KERNELS[0]: [9.0, None], KERNELS[1]: [9.1, None], KERNELS[2]: [15.0, 15.5],
                        KERNELS[3]: [30.0]})
    pick, look = second_look(pool, ev, "cold", passes=2)
    assert same(pick.text, KERNELS[2]) and look.dropped == 2 and look.looked_at == 3
    assert look.median_us == 15.5


def test_every_kernel_failing_its_second_look_is_an_error():
    pool, ev = pool_of({KERNELS[0]: [9.0, None], KERNELS[1]: [9.1, None]})
    with pytest.raises(SecondLookFailed, match="every verified kernel looked at again for banded_300 was dropped"):
        second_look(pool, ev, "cold", passes=1)
    assert len(pool.dropped) == 2 and pool.best() is None


def test_a_pass_failing_for_the_machine_is_left_out_and_one_never_confirmed_is_dropped():
    pool, ev = pool_of({KERNELS[0]: [10.0, 10.5, ErrorKind.INTERNAL, 10.7],
                        KERNELS[1]: [10.1, ErrorKind.INTERNAL]})
    pick, look = second_look(pool, ev, "cold", passes=3)
    assert same(pick.text, KERNELS[0]) and look.times_us == [10.5, 10.7] and look.median_us == pytest.approx(10.6)
    assert not look.changed and look.dropped == 1  # killed by: changed always true
    assert pool.dropped[normalised(KERNELS[1])].startswith("not confirmed: every evaluation again failed for the "
                                                           "machine's reasons (internal_error)")
    assert pool.found_wrong == []  # the machine's failure: not the kernel's, so it does not leave the store


def test_the_look_gives_up_after_most_kernels():
    texts = [get_variant(v).render() for v in ("spmv/csr_vector/-/tpr=2,block=128", "spmv/csr_vector/-/tpr=4,block=128",
                                               "spmv/csr_vector/-/tpr=8,block=128", "spmv/csr_vector/-/tpr=16,block=128",
                                               "spmv/csr_vector/-/tpr=32,block=128", "spmv/csr_scalar/-/block=128")]
    pool, ev = pool_of({t: [10.0 + i / 100, None] for i, t in enumerate(KERNELS + texts)})
    assert len(KERNELS + texts) > MOST
    with pytest.raises(SecondLookFailed):
        second_look(pool, ev, "cold", passes=1)
    assert len(pool.dropped) == MOST  # killed by: walking every candidate of a 64-candidate search


def test_the_defaults_look_at_three_within_five_percent_three_times():
    pool, ev = pool_of({KERNELS[0]: [10.0], KERNELS[1]: [10.1], KERNELS[2]: [10.2], KERNELS[3]: [10.3],
                        KERNELS[4]: [20.0]})
    n = len(ev.submitted)
    pick, look = second_look(pool, ev, "cold")
    assert look.looked_at == 3 and look.passes == 3  # killed by: TOP raised
    assert len(ev.submitted) - n == 9 and len(look.times_us) == 3  # killed by: PASSES lowered
    pool, ev = pool_of({KERNELS[0]: [10.0], KERNELS[1]: [10.6]})
    assert second_look(pool, ev, "cold")[1].looked_at == 1  # 6% slower: killed by WITHIN widened


def test_the_rivals_are_the_distinct_kernels_within_the_bar_at_most_top():
    spaced = KERNELS[0].replace("\n", "\n\n")  # the same kernel, laid out otherwise: looked at once
    pool, ev = pool_of({KERNELS[0]: [10.0], spaced: [10.0], KERNELS[1]: [10.1], KERNELS[2]: [10.2],
                        KERNELS[3]: [10.3], KERNELS[4]: [10.6]})
    pick, look = second_look(pool, ev, "cold", passes=1, top=3, within=0.05)
    assert look.looked_at == 3  # 10.0, 10.1, 10.2 (10.3 is within the bar but past top; 10.6 past the bar)
    looked = {normalised(t) for t in ev.submitted[6:]}
    assert looked == {normalised(k) for k in KERNELS[:3]}
    pick, look = second_look(pool, ev, "cold", passes=1, top=5, within=0.05)
    assert look.looked_at == 4  # 10.6 > 10.0 * 1.05: killed by a bar that lets every candidate in


def test_nothing_is_looked_at_without_passes_or_compile_only():
    pool, ev = pool_of({KERNELS[0]: [10.0]})
    n = len(ev.submitted)
    assert second_look(pool, ev, "cold", passes=0) is None
    pool.timed = False
    assert second_look(pool, ev, "cold", passes=3) is None
    assert len(ev.submitted) == n


def test_the_report_and_verdict_read_the_second_look():
    pool, ev = pool_of({KERNELS[0]: [10.0, 12.5]})
    pick, look = second_look(pool, ev, "cold", passes=3)
    assert verdict(pick, True, look) == f"correct, {CUSPARSE_US / 12.5:.2f}x faster than cuSPARSE"
    rep = KernelReport.of(pool.ctx, pick, pool, [c.result for c in pool.candidates], "samples drawn", {}, 1.0,
                          second_look=look)
    md = rep.markdown()
    assert "(first timing)" in md and "second look: median 12.50 us over 3 fresh evaluations" in md
    assert f"roofline fraction: {0.5 * 10.0 / 12.5:.2f}" in md  # the look's, not the first timing's 0.50
    assert rep.to_dict()["second_look"]["median_us"] == 12.5
    assert "second_look" not in KernelReport.of(pool.ctx, pick, pool, [], "samples drawn", {}, 1.0).to_dict()


def test_generate_hands_back_the_second_looks_choice(tmp_path):
    pytest.importorskip("torch")
    from sparserl.generate import GenerateConfig, generate_kernel
    from sparserl.matrices import save_matrix
    from tests.eval.test_generate import FixedSampler

    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    ev = FakeTimingDouble(Sequence({KERNELS[0]: [10.0, 11.0], KERNELS[1]: [10.2, 10.4]}))
    rep = generate_kernel(GenerateConfig(matrix=str(tmp_path / "a.mtx"), samples=2, out=str(tmp_path / "g")),
                          evaluator=ev, policy=FixedSampler(KERNELS[:2]))
    assert same(rep.kernel, KERNELS[1]) and rep.second_look.changed  # killed by: generate not taking the look's pick
    assert rep.second_look.median_us == 10.4 and "second look" in (tmp_path / "g" / "report.md").read_text()
    rep = generate_kernel(GenerateConfig(matrix=str(tmp_path / "a.mtx"), samples=2, out=str(tmp_path / "h"), retime=0),
                          evaluator=FakeTimingDouble(Sequence({KERNELS[0]: [10.0, 11.0], KERNELS[1]: [10.2, 10.4]})),
                          policy=FixedSampler(KERNELS[:2]))
    assert same(rep.kernel, KERNELS[0]) and rep.second_look is None


def test_a_search_report_is_chosen_by_a_second_look(tmp_path):
    from sparserl.search.run import SearchJob, search_matrix
    from sparserl.matrices import save_matrix
    from sparserl.search.loop import SearchConfig

    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    # every candidate 20 us, two of them faster at first and the first of those slower when evaluated again
    firsts = {}

    def time_of(text: str):
        key = normalised(text)
        n = firsts.setdefault(key, len(firsts))
        seen = time_of.count.get(key, 0)
        time_of.count[key] = seen + 1
        if n == 0:
            return 10.0 if seen == 0 else 12.0
        if n == 1:
            return 10.3 if seen == 0 else 10.5
        return 20.0
    time_of.count = {}
    ev = FakeTimingDouble(time_of)
    job = SearchJob(matrix=str(tmp_path / "a.mtx"), search=SearchConfig(budget=6, seed=0, cost_model="none"),
                    store=str(tmp_path / "best.sqlite"), out=str(tmp_path / "s"))
    rep, res = search_matrix(job, evaluator=ev)
    look = rep.second_look
    assert look is not None and look.changed and look.median_us == 10.5 and look.looked_at == 2
    assert firsts[normalised(rep.kernel)] == 1  # killed by: the search's report keeping its first timings' best


def test_the_report_reads_break_even_from_the_second_look():
    """A kernel 1.01x slower than cuSPARSE at first (101 us against 100) and 1.01x faster in the second look:
    the verdict, the roofline and the break-even all say the look's figure (the break-even line said 'never
    pays off' beside a verdict of 'faster')."""
    pool, ev = pool_of({KERNELS[0]: [101.0, 99.0]})
    pick, look = second_look(pool, ev, "cold", passes=1)
    rep = KernelReport.of(pool.ctx, pick, pool, [c.result for c in pool.candidates], "samples drawn", {}, 1.0,
                          second_look=look)
    md = rep.markdown()
    assert "1.01x faster than cuSPARSE" in rep.verdict and "never pays off" not in md and "pays off after" in md


def test_generate_falls_back_to_the_library_when_every_sample_is_dropped(tmp_path):
    pytest.importorskip("torch")
    from sparserl.generate import GenerateConfig, generate_kernel
    from sparserl.matrices import save_matrix
    from tests.eval.test_generate import FixedSampler

    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    ev = FakeTimingDouble(Sequence({KERNELS[0]: [10.0, None]}, default=50.0))  # the library: 50 us, steady
    rep = generate_kernel(GenerateConfig(matrix=str(tmp_path / "a.mtx"), samples=2, out=str(tmp_path / "g")),
                          evaluator=ev, policy=FixedSampler(KERNELS[:1]))
    assert rep.source.startswith("library kernel") and rep.second_look.median_us == 50.0
    assert any("the library's kernels were evaluated next" in n for n in rep.notes)
    assert any("dropped by the second look" in n for n in rep.notes)
    ev = FakeTimingDouble(Sequence({KERNELS[0]: [10.0, None]}, default=50.0))
    with pytest.raises(SecondLookFailed):
        generate_kernel(GenerateConfig(matrix=str(tmp_path / "a.mtx"), samples=2, out=str(tmp_path / "h"),
                                       library_fallback=False), evaluator=ev, policy=FixedSampler(KERNELS[:1]))


class ClosingDouble(FakeTimingDouble):
    """A double that refuses work once closed, as the real evaluator does."""

    closed = False

    def submit(self, *a, **kw):
        assert not self.closed, "submitted to a closed evaluator"
        return super().submit(*a, **kw)

    def close(self) -> None:
        self.closed = True


def test_the_look_runs_before_the_evaluator_a_request_made_is_closed(tmp_path, monkeypatch):
    """generate and search close the evaluator they made themselves; the second look must come first (killed
    by: the close moved before the look in either)."""
    pytest.importorskip("torch")
    import sparserl.generate
    import sparserl.search.run
    from sparserl.generate import GenerateConfig, generate_kernel
    from sparserl.matrices import save_matrix
    from sparserl.search.loop import SearchConfig
    from sparserl.search.run import SearchJob, search_matrix

    made: list[ClosingDouble] = []

    def evaluator(config):
        made.append(ClosingDouble(lambda text: 10.0 + len(text) % 7))
        return made[-1]

    for module in (sparserl.generate, sparserl.search.run):
        monkeypatch.setattr(module, "Evaluator", evaluator)
    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    rep = generate_kernel(GenerateConfig(matrix=str(tmp_path / "a.mtx"), model=str(tmp_path / "none"),
                                         out=str(tmp_path / "g")))
    assert rep.second_look is not None and made[-1].closed
    rep, _ = search_matrix(SearchJob(matrix=str(tmp_path / "a.mtx"), search=SearchConfig(budget=4, cost_model="none"),
                                     store=str(tmp_path / "s.sqlite"), out=str(tmp_path / "s")))
    assert rep.second_look is not None and made[-1].closed
    rep, _ = search_matrix(SearchJob(matrix=str(tmp_path / "a.mtx"), search=SearchConfig(budget=4, cost_model="none"),
                                     store=str(tmp_path / "s.sqlite"), out=str(tmp_path / "t"), retime=0))
    assert rep.second_look is None  # killed by: the search's report ignoring --retime


def _stored_text(tmp_path, sha: str) -> str:
    from sparserl.search.store import BestStore

    with BestStore(tmp_path / "best.sqlite") as st:
        return st.kernel_text(sha)


def test_a_kernel_found_wrong_leaves_the_store_the_search_wrote(tmp_path):
    """The search stores every verified candidate by its first evaluation; one the second look finds wrong on fresh
    inputs is retracted, and the store's best is the next (killed by: the retraction not called, which left the
    wrong kernel the store's best for `tune` and the next search); the store remembers it found wrong, and why."""
    from sparserl.matrices import save_matrix
    from sparserl.matrices.card import matrix_card
    from sparserl.search.loop import SearchConfig
    from sparserl.search.run import SearchJob, search_matrix
    from sparserl.search.store import BestStore

    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    time_of, order = racy_landscape()  # the fastest at first, wrong when evaluated again
    ev = FakeTimingDouble(time_of)
    job = SearchJob(matrix=str(tmp_path / "a.mtx"), search=SearchConfig(budget=5, seed=0, cost_model="none"),
                    store=str(tmp_path / "best.sqlite"), out=str(tmp_path / "s"))
    rep, res = search_matrix(job, evaluator=ev)
    wrong = next(k for k, r in order.items() if r == 0)
    assert normalised(rep.kernel) != wrong and rep.second_look.dropped == 1
    assert any("left the best-known store" in n for n in rep.notes)
    with BestStore(tmp_path / "best.sqlite") as st:
        rows = st.best(fingerprint=matrix_card(generate("banded", 300, seed=1)).fingerprint)
        texts = {normalised(t) for t in (r.text for r in rows)}
        results = st.results(fingerprint=rows[0].fingerprint)
        found = st.db.execute("SELECT kernel_sha, reason FROM found_wrong").fetchall()
    assert wrong not in texts and rows[0].time_us == 21.0
    assert len(results) == res.store_writes - 1
    # remembered as found wrong, with the second look's verdict (killed by: the reason not passed on)
    assert [(normalised(_stored_text(tmp_path, f["kernel_sha"])), f["reason"]) for f in found] == \
        [(wrong, "incorrect when evaluated again (incorrect (double))")]


def test_a_search_whose_new_best_was_found_wrong_does_not_claim_the_store(tmp_path):
    """A second search on a store, whose only kernel faster than the store's best is fastest once and wrong when
    evaluated again: the look takes it out, the first search's kernel is the best again, and the report's store line
    says the best known stays faster (killed by: ``store_improved`` kept from the search's recordings, which the
    racy kernel's had set). The first search, on an empty store, set the best (the control)."""
    from sparserl.matrices import save_matrix
    from sparserl.search.loop import SearchConfig
    from sparserl.search.run import SearchJob, search_matrix, store_line
    from sparserl.search.store import BestStore

    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    job = SearchJob(matrix=str(tmp_path / "a.mtx"), search=SearchConfig(budget=4, seed=0, cost_model="none"),
                    store=str(tmp_path / "best.sqlite"), out=str(tmp_path / "s1"))
    steady = lambda text: 20.0 + len(normalised(text)) % 7  # noqa: E731
    _, first = search_matrix(job, evaluator=FakeTimingDouble(steady))
    assert first.store_improved and "this run set the best known" in store_line(first)
    with BestStore(tmp_path / "best.sqlite") as st:
        (known,) = st.best()
    time_of, seen = racy_beside(known.text, steady)  # the first kernel other than the known best: racy

    rep, res = search_matrix(replace(job, out=str(tmp_path / "s2")), evaluator=FakeTimingDouble(time_of))
    assert len(seen) == 1 and rep.second_look.dropped == 1
    with BestStore(tmp_path / "best.sqlite") as st:
        (best,) = st.best()
    assert best.kernel_sha == known.kernel_sha and not res.store_improved
    assert "the best known stays faster" in (tmp_path / "s2" / "report.md").read_text()


def test_generate_takes_a_sample_found_wrong_out_of_the_store_its_search_wrote(tmp_path):
    """generate --search: the samples enter the search, which stores them; one the second look finds wrong leaves
    the store, also when generate then fails (killed by: the retraction skipped, or skipped on the error path)."""
    pytest.importorskip("torch")
    from sparserl.generate import GenerateConfig, generate_kernel
    from sparserl.matrices import save_matrix
    from sparserl.search.store import BestStore, kernel_sha
    from tests.eval.test_generate import FixedSampler

    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    for fallback in (True, False):
        store = tmp_path / f"best_{fallback}.sqlite"
        ev = FakeTimingDouble(Sequence({KERNELS[0]: [5.0, None]}, default=None))  # everything else wrong at once
        cfg = GenerateConfig(matrix=str(tmp_path / "a.mtx"), samples=1, search=2, store=str(store),
                             out=str(tmp_path / f"g{fallback}"), library_fallback=fallback)
        with pytest.raises(SparseRLError):
            generate_kernel(cfg, evaluator=ev, policy=FixedSampler(KERNELS[:1]))
        with BestStore(store) as st:
            shas = {r.kernel_sha for r in st.results()}
        texts = [t for t in ev.submitted if same(t, KERNELS[0])]
        assert texts and not any(kernel_sha(t) in shas for t in texts), fallback


def _wrong_when_evaluated_again(text: str, seen: dict) -> float | None:
    """Every kernel correct at first (20 us and up, by first appearance), wrong every time after."""
    key = normalised(text)
    seen[key] = seen.get(key, 0) + 1
    return 20.0 + len(seen) if seen[key] == 1 else None


def _failing_retraction(monkeypatch):
    from sparserl.search.store import BestStore
    from sparserl.search.store_backends import StoreError

    calls = []

    def retract(self, *args, **kw):
        calls.append(args)
        raise StoreError(f"best-known store {self.path}: retracting a kernel: disk I/O error")

    monkeypatch.setattr(BestStore, "retract", retract)
    return calls


def test_a_store_failing_to_retract_does_not_hide_why_the_look_failed(tmp_path, monkeypatch, caplog):
    """The search's second look drops every kernel (SecondLookFailed) and the retraction after it fails too: the
    look's error is the one raised and the store's is logged; after a look that handed a kernel back, the store's
    failure is the search's error (killed by: the retraction in a bare ``finally``, whose error replaced the look's;
    the store's error swallowed after a look that returned)."""
    import logging

    from sparserl.matrices import save_matrix
    from sparserl.search.loop import SearchConfig
    from sparserl.search.run import SearchJob, search_matrix
    from sparserl.search.store_backends import StoreError

    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    calls = _failing_retraction(monkeypatch)
    seen: dict = {}
    job = SearchJob(matrix=str(tmp_path / "a.mtx"), search=SearchConfig(budget=4, seed=0, cost_model="none"),
                    store=str(tmp_path / "best.sqlite"), out=str(tmp_path / "s"))
    with caplog.at_level(logging.ERROR, logger="sparserl.search.run"):
        with pytest.raises(SecondLookFailed):
            search_matrix(job, evaluator=FakeTimingDouble(lambda t: _wrong_when_evaluated_again(t, seen)))
    assert calls and any("disk I/O error" in r.getMessage() and "may stay in the best-known store" in r.getMessage()
                         for r in caplog.records)
    order: dict[str, int] = {}
    count: dict[str, int] = {}

    def one_wrong(text: str):  # the fastest at first is wrong when evaluated again; the rest hold
        key = normalised(text)
        n = order.setdefault(key, len(order))
        count[key] = count.get(key, 0) + 1
        return (5.0 if count[key] == 1 else None) if n == 0 else 20.0 + n

    job = SearchJob(matrix=str(tmp_path / "a.mtx"), search=SearchConfig(budget=4, seed=0, cost_model="none"),
                    store=str(tmp_path / "best.sqlite"), out=str(tmp_path / "t"))
    with pytest.raises(StoreError, match="disk I/O error"):
        search_matrix(job, evaluator=FakeTimingDouble(one_wrong))


def test_generate_keeps_why_the_look_failed_when_the_store_fails_to_retract(tmp_path, monkeypatch, caplog):
    """generate --search: every kernel dropped (SecondLookFailed, no library fallback) and the retraction failing
    beside it: the look's error is raised, the store's logged (killed by: the retraction in a bare ``finally``)."""
    pytest.importorskip("torch")
    import logging

    from sparserl.generate import GenerateConfig, generate_kernel
    from sparserl.matrices import save_matrix
    from tests.eval.test_generate import FixedSampler

    save_matrix(generate("banded", 300, seed=1), tmp_path / "a.mtx")
    calls = _failing_retraction(monkeypatch)
    seen: dict = {}
    cfg = GenerateConfig(matrix=str(tmp_path / "a.mtx"), samples=1, search=2, store=str(tmp_path / "best.sqlite"),
                         out=str(tmp_path / "g"), library_fallback=False)
    with caplog.at_level(logging.ERROR, logger="sparserl.search.run"):
        with pytest.raises(SecondLookFailed):
            generate_kernel(cfg, evaluator=FakeTimingDouble(lambda t: _wrong_when_evaluated_again(t, seen)),
                            policy=FixedSampler(KERNELS[:1]))
    assert calls and any("disk I/O error" in r.getMessage() for r in caplog.records)


def test_every_layout_of_a_kernel_found_wrong_is_retracted_and_any_store_error_stays_beside_the_look_s():
    """The pool takes texts that differ in whitespace only for one kernel, the store keys them by the exact text:
    a kernel found wrong leaves the store under each layout the pool held (killed by: the found-wrong text alone
    retracted). A retraction failing with an error the store did not wrap (its driver's OSError) beside a look
    that raised leaves the look's error the one raised (killed by: only SparseRLError caught there)."""
    from types import SimpleNamespace

    from sparserl.search.run import retract_found_wrong, retracting_found_wrong

    text = "FORMAT: CSR\nextern \"C\" __global__ void k() {}\n"
    layout = text.replace("void k", "void  k")
    other = "FORMAT: COO\nextern \"C\" __global__ void j() {}\n"
    res = SimpleNamespace(arch="sm_90", harness_version="h1")
    found = SimpleNamespace(text=text, result=res)
    pool = SimpleNamespace(found_wrong=[found], dropped={normalised(text): "wrong: y differs"},
                           candidates=[found, SimpleNamespace(text=layout, result=res),
                                       SimpleNamespace(text=other, result=res)])
    calls = []

    class Store:
        def retract(self, *key, reason):
            calls.append((key[-1], reason))
            return 1

    ctx = SimpleNamespace(card=SimpleNamespace(fingerprint="f"), op=SimpleNamespace(value="spmv"), k=None)
    assert retract_found_wrong(Store(), ctx, pool, "cold") == 2
    assert sorted(t for t, _ in calls) == sorted([text, layout]) and {r for _, r in calls} == {"wrong: y differs"}

    def broken():
        raise OSError("disk full")

    with pytest.raises(ValueError, match="the look"):
        with retracting_found_wrong(pool, broken):
            raise ValueError("the look")


def test_the_speedup_at_the_look_s_median() -> None:
    """cuSPARSE's time over the median where it was timed in the regime; else the first speedup scaled by the two
    times (killed by: the first speedup returned as it is, or None where it can be scaled)."""
    look = SecondLook(passes=3, regime="cold", times_us=[19.0, 20.0, 21.0], median_us=20.0, first_us=25.0,
                      speedup=5.0, first_speedup=4.0, roofline=None, break_even_calls=None, looked_at=1, dropped=0,
                      changed=False, seconds=0.1)
    assert look.median_speedup == 5.0
    assert replace(look, speedup=None).median_speedup == pytest.approx(5.0)  # 4.0 x 25 / 20
    assert replace(look, speedup=None, first_speedup=None).median_speedup is None

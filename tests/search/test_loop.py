"""The search loop, driven by a test double of the GPU timing (tests/search/doubles.py): it finds the
best point of a small space within its budget, puts seeds first, stops on time, takes policy
proposals and refinements, and loses no verified result when interrupted or killed."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparserl.errors import SparseRLError
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.kernels.templates import get_template, templates
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.search.loop import SearchConfig, StoreSink, run_search
from sparserl.search.space import CandidateSpace, Provenance, normalised, text_proposal
from sparserl.search.store import BestStore
from tests.search.doubles import FakeTimingDouble, WrongButTimed, by_text

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def block():
    A = generate("block", 2000, seed=1)
    return A, matrix_card(A)


def bsr_times(card, optimum: dict[str, int]) -> tuple[dict[str, float], dict[str, str]]:
    """Kernel time of every bsr_group point: 10 us plus one per step (along each parameter's
    domain) away from ``optimum`` (a separable, unimodal landscape). Also text -> id."""
    space = CandidateSpace(card, Op.SPMV, None, [get_template("spmv", "bsr_group")])
    t = space.by_name["bsr_group"]
    times, ids = {}, {}
    for p in space.all_points():
        d = sum(abs(par.values.index(p.param_dict[par.name]) - par.values.index(optimum[par.name]))
                for par in t.space)
        times[p.text], ids[normalised(p.text)] = 10.0 + d, p.id
    return times, ids


def far_from_seeds(card) -> dict[str, int]:
    """A valid bsr_group point at least two steps from every seed."""
    t = get_template("spmv", "bsr_group")
    seeds = t.seeds(card, None)
    space = CandidateSpace(card, Op.SPMV, None, [t])
    for p in space.all_points():
        q = p.param_dict
        dist = min(sum(abs(par.values.index(q[par.name]) - par.values.index(s[par.name])) for par in t.space)
                   for s in seeds)
        if dist >= 2:
            return q
    raise AssertionError("every point is near a seed")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_finds_the_best_point_of_a_small_space_within_budget(block, seed: int) -> None:
    A, card = block
    opt = far_from_seeds(card)
    times, ids = bsr_times(card, opt)
    ev = FakeTimingDouble(by_text(times))
    cfg = SearchConfig(budget=40, templates=("bsr_group",), seed=seed, parallel=2)
    res = run_search(A, "block", "spmv", None, cfg, ev, card=card, progress=False)
    best_id = get_template("spmv", "bsr_group").candidate(opt).id
    assert res.best is not None and res.best.proposal.id == best_id, res.best.proposal.id
    assert res.best.time_us("cold") == 10.0 and res.best.result.speedup == pytest.approx(10.0)
    assert res.evaluated <= 40 < len(times), "found it without evaluating the whole space"
    assert res.best.proposal.provenance in (Provenance.MUTATION, Provenance.SWITCH, Provenance.RANDOM)
    seen = [e.proposal.id for e in res.entries]
    assert len(seen) == len(set(seen)) and len(ev.submitted) == len({normalised(t) for t in ev.submitted})
    assert all(ids[normalised(e.proposal.text)] == e.proposal.id for e in res.entries)


def test_seeds_come_first_known_best_then_selector(block) -> None:
    A, card = block
    known = variants("spmv", "CSR")[3]
    ev = FakeTimingDouble(lambda text: 50.0)
    cfg = SearchConfig(budget=12, parallel=1)
    res = run_search(A, "block", "spmv", None, cfg, ev, card=card, progress=False,
                     selector_point=("csr_vector", {"tpr": 8, "block": 128}, "selector"),
                     known=[(known.id, known.render())])
    order = sorted(res.entries, key=lambda e: e.order)
    assert order[0].proposal.provenance is Provenance.KNOWN and order[0].proposal.id == known.id
    assert order[1].proposal.id == "spmv/csr_vector/-/tpr=8,block=128" and order[1].proposal.note == "selector"
    cap = 6  # seed_share 0.5 of 12
    assert all(e.proposal.provenance in (Provenance.KNOWN, Provenance.SEED) for e in order[:cap])
    assert res.evaluated == 12 and res.stopped == "budget"


def test_stops_on_the_time_limit(block) -> None:
    A, card = block
    ev = FakeTimingDouble(lambda text: 20.0, delay=0.05, workers=2)
    try:
        t0 = time.monotonic()
        res = run_search(A, "block", "spmv", None, SearchConfig(budget=10_000, seconds=0.4, parallel=2), ev,
                         card=card, progress=False)
        took = time.monotonic() - t0
    finally:
        ev.close()
    assert res.stopped == "seconds"
    assert 4 <= res.evaluated < 60 and took < 1.5


def test_stops_when_the_space_is_exhausted(block) -> None:
    A, card = block
    ev = FakeTimingDouble(lambda text: 20.0)
    res = run_search(A, "block", "spmv", None, SearchConfig(budget=50, templates=("coo_atomic",)), ev, card=card,
                     progress=False)
    assert res.stopped == "exhausted" and res.evaluated == 1


def test_incorrect_kernels_never_win(block) -> None:
    """The CSR scalar and tpr=8 library kernels (5) are the fastest of the space (1 us, cuSPARSE 100 us)
    but incorrect: the search evaluates them (they are seeds) and none of them becomes a new best or
    the winner, which is the fastest correct kernel (5 us).

    Mutation killed: ``TraceEntry.time_us`` returning a time for a result that is not ok (an incorrect
    kernel then wins at 1 us). The earlier version of this test marked kernels wrong by ids that the
    rendered texts do not contain: its wrong set was empty and it could not fail."""
    A, card = block
    vs = variants("spmv")
    wrong = {normalised(v.render()) for v in vs if v.id.startswith("spmv/csr_scalar/") or "tpr=8," in v.id}
    assert len(wrong) == 5  # csr_scalar x2, csr_vector tpr=8 x2, csr_lanes tpr=8
    times = {v.render(): (WrongButTimed(1.0) if normalised(v.render()) in wrong else 5.0 if v.format == "CSR"
                          else 40.0) for v in vs}
    ev = FakeTimingDouble(by_text(times, 60.0))
    res = run_search(A, "block", "spmv", None, SearchConfig(budget=30), ev, card=card, progress=False)
    met = [e for e in res.entries if normalised(e.proposal.text) in wrong]
    assert met and all(not e.result.ok and not e.new_best for e in met), "the wrong kernels were evaluated"
    assert res.best is not None and res.best.result.ok and normalised(res.best.proposal.text) not in wrong
    assert res.best.time_us("cold") == 5.0
    assert all(e.result.ok or not e.new_best for e in res.entries)


class NotingDouble(FakeTimingDouble):
    """A double with the evaluator's ``note_best``; results for texts in ``slow`` come back ``slow``
    (verified, timed until stopped early), as the harness reports a hopeless kernel."""

    def __init__(self, time_of, slow=frozenset()):
        super().__init__(time_of)
        self.slow = {normalised(t) for t in slow}
        self.notes: list[tuple[float, str]] = []

    def note_best(self, ref, op, k, best_us, regime=None) -> None:
        self.notes.append((best_us, regime))

    def _result(self, text, ref, op, k):
        import dataclasses

        from sparserl.harness.result import ErrorKind

        r = super()._result(text, ref, op, k)
        return dataclasses.replace(r, error_kind=ErrorKind.SLOW) if normalised(text) in self.slow else r


def test_each_new_best_is_noted_and_slow_kernels_are_ranked(block) -> None:
    """The search tells the evaluator every new best time (so later candidates far slower stop early),
    and a kernel stopped early (slow: verified, with its measured time) is ranked like any correct one.
    Kills a loop that ranks only ``ok`` results (a search where everything is slow would find nothing)."""
    A, card = block
    texts = {v.render(): 5.0 + i for i, v in enumerate(variants("spmv"))}
    ev = NotingDouble(by_text(texts, 100.0))
    res = run_search(A, "block", "spmv", None, SearchConfig(budget=20, parallel=1), ev, card=card, progress=False)
    bests = [e.time_us("cold") for e in sorted(res.entries, key=lambda e: e.index) if e.new_best]
    assert [t for t, _ in ev.notes] == bests and all(r == "cold" for _, r in ev.notes)
    assert all(a > b for a, b in zip(bests, bests[1:]))
    slow = NotingDouble(lambda text: 400.0, slow=set(texts) | {p.text for p in CandidateSpace(
        card, Op.SPMV, None, templates("spmv")).all_points()})
    res = run_search(A, "block", "spmv", None, SearchConfig(budget=6, parallel=1), slow, card=card, progress=False)
    assert all(e.result.error_kind.value == "slow" for e in res.entries)
    assert res.best is not None and res.best.time_us("cold") == 400.0
    lines = [e.to_dict("cold") for e in res.entries]  # the trace says which stopped early
    assert all(x["verdict"] == "correct" and x["stopped_early"] and x["time_us"] == 400.0 for x in lines)


class FakeProposer:
    """Stands in for the policy: fixed samples; a refinement is the next of a list of texts."""

    name = "fake-policy"

    def __init__(self, samples: list[str], refinements: list[str]):
        self.samples, self.refinements = samples, refinements
        self.refine_calls: list[tuple[str, object]] = []

    def sample(self, n: int) -> list[str]:
        return [self.samples[i % len(self.samples)] for i in range(n)]

    def refine(self, previous, result, n):
        self.refine_calls.append((previous, result))
        out, self.refinements = self.refinements[:n], self.refinements[n:]
        return out


def test_policy_samples_and_refinements(block) -> None:
    A, card = block
    csr = variants("spmv", "CSR")
    sampled = csr[0].render() + "__device__ int sampled_here;\n"  # new texts (no template point), as a policy writes
    better = csr[1].render() + "__device__ int refined_here;\n"
    times = {sampled: 30.0, better: 8.0}
    ev = FakeTimingDouble(by_text(times, 50.0))
    prop = FakeProposer(["Here is a kernel:\n" + sampled], [better] + [csr[2].render()] * 20)
    cfg = SearchConfig(budget=24, policy_share=0.25, policy_batch=1, parallel=1)
    res = run_search(A, "block", "spmv", None, cfg, ev, card=card, proposer=prop, progress=False)
    kinds = [e.proposal.provenance for e in res.entries]
    assert kinds.count(Provenance.POLICY_SAMPLE) == 1 and kinds.count(Provenance.POLICY_REFINE) == 1
    (sample,) = [e for e in res.entries if e.proposal.provenance is Provenance.POLICY_SAMPLE]
    assert normalised(sample.proposal.text) == normalised(sampled), "chatter dropped by the extractor"
    prev, shown = prop.refine_calls[0]
    assert normalised(prev) == normalised(sampled) and shown.ok and shown.timings["cold"].median_us == 30.0
    assert res.best.proposal.provenance is Provenance.POLICY_REFINE and res.best.time_us("cold") == 8.0
    assert res.best.proposal.parent == sample.proposal.id
    # the rest of its refinements repeat a seed: no budget spent on them, and the policy is asked no more
    assert len(prop.refine_calls) <= 1 + 3 and res.evaluated == 24


def one_step_from(card, opt: dict[str, int]) -> dict[str, int]:
    """A bsr_group point one step from ``opt`` that no seed is."""
    t = get_template("spmv", "bsr_group")
    seeds = t.seeds(card, None)
    return next(q for q in t.neighbours(opt, card, None) if q not in seeds)


def as_written(text: str) -> str:
    """A template's kernel as a policy may write it: chatter, a fence, comments in the code."""
    return "Here is a kernel:\n```cuda\n" + text.replace("\n\n", "\n\n// one block per group\n", 1) + "```\n"


def test_the_search_moves_from_a_policy_kernel_that_is_a_template_point(block) -> None:
    """The policy writes a template point's kernel (comments and chatter around it) one step from the optimum,
    which no seed is near: the search takes that point's neighbours and finds the optimum as a mutation of the
    policy's kernel, which is judged as written (its own text and id). Mutation killed: ``from_text`` not saying
    which point the text is (``text_proposal`` alone): free text has no neighbours, the search never gets there
    (one parent, no switches or random points here)."""
    A, card = block
    opt = far_from_seeds(card)
    times, _ = bsr_times(card, opt)
    near = get_template("spmv", "bsr_group").render(one_step_from(card, opt), card)
    written = as_written(near)
    times[text_proposal(written, Op.SPMV, Provenance.POLICY_SAMPLE).text] = times[near]  # what the harness gets
    ev = FakeTimingDouble(by_text(times))
    cfg = SearchConfig(budget=20, templates=("bsr_group",), seed_share=0.1, beam=1, switch=0.0, explore=0.0,
                       policy_share=0.1, policy_batch=1, parallel=1)
    res = run_search(A, "block", "spmv", None, cfg, ev, card=card, proposer=FakeProposer([written], []),
                     progress=False)
    (sample,) = [e.proposal for e in res.entries if e.proposal.provenance is Provenance.POLICY_SAMPLE]
    assert sample.id.startswith("text/") and "one block per group" in sample.text, "judged as written"
    assert sample.template == "bsr_group" and sample.param_dict == one_step_from(card, opt)
    assert res.best.time_us("cold") == 10.0 and res.best.proposal.param_dict == opt
    assert res.best.proposal.provenance is Provenance.MUTATION and res.best.proposal.parent == sample.id
    # policy_points off (the benchmark's text arm): the same kernel is free text, and nothing moves from it
    res = run_search(A, "block", "spmv", None, dataclasses.replace(cfg, policy_points=False), FakeTimingDouble(
        by_text(times)), card=card, proposer=FakeProposer([written], []), progress=False)
    (sample,) = [e.proposal for e in res.entries if e.proposal.provenance is Provenance.POLICY_SAMPLE]
    assert sample.template is None and not any(e.proposal.parent == sample.id for e in res.entries)


def test_a_policy_kernel_of_a_point_already_tried_spends_no_budget(block) -> None:
    """The policy writes, comments aside, the kernel of the first seed: it is that point, already evaluated, so
    it is not evaluated again (the same kernel, the same verdict). Mutation killed: ``claim`` ignoring the
    point's id (the policy's text then spends a candidate on a kernel already judged)."""
    A, card = block
    t = get_template("spmv", "bsr_group")
    first = t.render(t.seeds(card, None)[0], card)
    ev = FakeTimingDouble(lambda text: 20.0)
    cfg = SearchConfig(budget=6, templates=("bsr_group",), policy_share=0.5, policy_batch=1, parallel=1)
    res = run_search(A, "block", "spmv", None, cfg, ev, card=card, proposer=FakeProposer([as_written(first)], []),
                     progress=False)
    assert normalised(ev.submitted[0]) == normalised(first)
    assert not any("one block per group" in x for x in ev.submitted)
    assert all(e.proposal.provenance is not Provenance.POLICY_SAMPLE for e in res.entries)
    assert res.evaluated == 6


def test_every_way_a_kernel_enters_as_text_is_read_as_its_point_and_the_point_is_not_tried_again(block) -> None:
    """A stored kernel kept as text (the store's best under a text id), a policy sample and a policy refinement,
    each a seed point's kernel with a comment, enter as those points (judged as written); when the seeds reach those
    points later, they are not evaluated again. Mutations killed: the stored text or the refinements read as free
    text, and ``claim`` checking a point's id without remembering it (the seed then evaluated a second time)."""
    A, card = block
    t = get_template("spmv", "bsr_group")
    seeds = [p for p in (CandidateSpace(card, Op.SPMV, None, [t]).point(t, q, Provenance.SEED)
                         for q in t.seeds(card, None)) if p is not None]
    assert len(seeds) >= 4
    stored, sampled, refined = (as_written(p.text) for p in seeds[-3:])
    ev = FakeTimingDouble(lambda text: 20.0)
    cfg = SearchConfig(budget=len(seeds) + 4, templates=("bsr_group",), seed_share=1.0, policy_share=0.25,
                       policy_batch=1, parallel=1)
    res = run_search(A, "block", "spmv", None, cfg, ev, card=card, known=[("text/0123456789abcdef", stored)],
                     proposer=FakeProposer([sampled], [refined]), progress=False)
    by = {p: [e.proposal for e in res.entries if e.proposal.provenance is p]
          for p in (Provenance.KNOWN, Provenance.POLICY_SAMPLE, Provenance.POLICY_REFINE)}
    assert [p.point_id for p in by[Provenance.KNOWN]] == [seeds[-3].id]
    assert [p.point_id for p in by[Provenance.POLICY_SAMPLE]] == [seeds[-2].id]
    assert [p.point_id for p in by[Provenance.POLICY_REFINE]] == [seeds[-1].id]
    ids = [e.proposal.id for e in res.entries]
    assert not {s.id for s in seeds[-3:]} & set(ids), "a point read from text is not tried again"
    assert {s.id for s in seeds[:-3]} <= set(ids), "every other seed was"


def test_prior_samples_spend_no_budget(block) -> None:
    from tests.search.doubles import timed_result

    A, card = block
    prior = [(variants("spmv", "ELL")[0].render(), timed_result("spmv", None, "block", 12.0))]
    ev = FakeTimingDouble(lambda text: 40.0)
    res = run_search(A, "block", "spmv", None, SearchConfig(budget=5), ev, card=card, prior=prior, progress=False)
    assert len(res.entries) == 6 and res.evaluated == 5
    assert res.entries[0].counted is False and res.entries[0].proposal.provenance is Provenance.POLICY_SAMPLE
    assert res.best is res.entries[0]
    assert len(ev.submitted) == 5


def test_trace_lines_are_written_as_results_arrive(block, tmp_path: Path) -> None:
    A, card = block
    ev = FakeTimingDouble(lambda text: 25.0)
    res = run_search(A, "block", "spmv", None, SearchConfig(budget=6), ev, card=card, progress=False,
                     trace=tmp_path / "trace.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == [e.proposal.id for e in res.entries]
    assert all(x["verdict"] == "correct" and x["time_us"] == 25.0 and x["speedup"] == 4.0 for x in lines)
    assert not any(x["stopped_early"] for x in lines)
    assert {"provenance", "parent", "text", "cusparse_us", "order"} <= set(lines[0])


def test_keyboard_interrupt_keeps_every_verified_result(block, tmp_path: Path) -> None:
    A, card = block
    store = BestStore(tmp_path / "s.db")
    sink = StoreSink(store, card, "block", None, ([0], [0]), {"test": True})
    ev = FakeTimingDouble(lambda text: 30.0 - len(text) % 7, interrupt_after=5)
    with pytest.raises(KeyboardInterrupt):
        run_search(A, "block", "spmv", None, SearchConfig(budget=20, parallel=1), ev, card=card, sink=sink,
                   progress=False, run_id="r1")
    store.close()
    with BestStore(tmp_path / "s.db") as st:
        assert st.counts()["results"] == 5
        assert st.conn.execute("SELECT status FROM runs WHERE run_id = 'r1'").fetchone()[0] == "interrupted"
        assert len(st.best()) == 1


KILLED_SEARCH = """
import sys
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.search.loop import SearchConfig, StoreSink, run_search
from sparserl.search.store import BestStore
from tests.search.doubles import FakeTimingDouble
A = generate("block", 2000, seed=1)
card = matrix_card(A)
sink = StoreSink(BestStore(sys.argv[1]), card, "block", None, ([0], [0]), {})
ev = FakeTimingDouble(lambda text: 10.0 + len(text) % 13, delay=0.1, workers=1)
run_search(A, "block", "spmv", None, SearchConfig(budget=500, parallel=1), ev, card=card, sink=sink,
           progress=False, run_id="killed")
"""


def test_a_killed_search_loses_nothing_verified(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{REPO}")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SEARCH, str(db)], env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        n = 0
        while time.monotonic() < deadline and n < 4:
            time.sleep(0.2)
            if db.exists():
                try:
                    with BestStore(db) as st:
                        n = st.counts()["results"]
                except SparseRLError:
                    pass  # caught mid-creation
            assert proc.poll() is None, "the search ended by itself"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert n >= 4
    with BestStore(db) as st:
        assert st.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert st.counts()["results"] >= n
        assert st.conn.execute("SELECT status FROM runs WHERE run_id = 'killed'").fetchone()[0] == "running"
        (b,) = st.best()
        assert b.time_us == min(r.time_us for r in st.results())


def test_config_is_validated() -> None:
    for bad in (dict(budget=0), dict(budget=-3), dict(seconds=0), dict(regime="hot"), dict(seed_share=2.0),
                dict(policy_share=1.0), dict(beam=0)):
        with pytest.raises(SparseRLError):
            SearchConfig(**bad)


def test_after_one_seed_each_the_fastest_template_gets_its_other_seeds(block) -> None:
    A, card = block
    n_templates = sum(1 for t in templates("spmv") if t.seeds(card, None))  # those that fit this matrix
    group = {p.text for p in CandidateSpace(card, Op.SPMV, None, [get_template("spmv", "bsr_group")]).all_points()}
    ev = FakeTimingDouble(lambda text: 10.0 if text in group else 50.0)  # bsr_group, every point of it, is fastest
    cfg = SearchConfig(budget=n_templates + 5, seed_share=1.0, parallel=1)
    res = run_search(A, "block", "spmv", None, cfg, ev, card=card, progress=False)
    order = [e.proposal for e in sorted(res.entries, key=lambda e: e.order)]
    assert len({p.template for p in order[:n_templates]}) == n_templates, "one seed of every template first"
    assert all(p.template == "bsr_group" and p.provenance is Provenance.SEED for p in order[n_templates:])


def test_a_format_the_harness_refuses_is_not_proposed_again(block) -> None:
    from sparserl.harness.result import ErrorKind

    A, card = block
    ev = FakeTimingDouble(lambda text: ErrorKind.FORMAT_REFUSED if text.startswith("FORMAT: DIA") else 30.0)
    res = run_search(A, "block", "spmv", None, SearchConfig(budget=60, parallel=1), ev, card=card, progress=False)
    dia = [e for e in res.entries if e.proposal.text.startswith("FORMAT: DIA")]
    assert len(dia) == 1 and dia[0].result.error_kind is ErrorKind.FORMAT_REFUSED
    assert res.refused.get("DIA", 0) >= 1, "later DIA points were skipped, not evaluated"
    assert res.evaluated == 60


def test_a_stored_kernel_the_template_no_longer_renders_is_free_text(block) -> None:
    A, card = block
    point = get_template("spmv", "csr_vector").candidate({"tpr": 8, "block": 128})
    current = get_template("spmv", "csr_vector").render({"tpr": 8, "block": 128}, card)
    older = current + "__device__ int an_older_rendering;\n"  # other code: no longer the point's kernel
    ev = FakeTimingDouble(lambda text: 20.0)
    res = run_search(A, "block", "spmv", None, SearchConfig(budget=30, seed_share=1.0), ev, card=card,
                     known=[(point.id, older)], progress=False)
    known = min(res.entries, key=lambda e: e.order).proposal
    assert known.provenance is Provenance.KNOWN and known.id.startswith("text/") and known.text == older
    mine = [e for e in res.entries if e.proposal.id == point.id]
    assert len(mine) == 1 and mine[0].proposal.text == current, "the template's own point is still evaluated"
    # the same text as the template renders: the known kernel is that template point (it can be mutated)
    res2 = run_search(A, "block", "spmv", None, SearchConfig(budget=3), FakeTimingDouble(lambda text: 20.0), card=card,
                      known=[(point.id, current)], progress=False)
    k2 = min(res2.entries, key=lambda e: e.order).proposal
    assert k2.id == point.id and k2.template == "csr_vector" and k2.provenance is Provenance.KNOWN


def test_filled_proposals_are_noted_in_the_trace_and_the_candidates_source(block) -> None:
    """A proposal the proposer wrote the card's facts into (its ``last_filled``), and a sample drawn before the
    search with its filled flag, carry ``FILLED_NOTE`` in the trace, and the request's candidate of a filled
    proposal says so in its source; an unfilled one does not. The proposals are template points' kernels, read as
    their points, and keep the proposer's notes. Mutations killed: the proposer's flags not read, the prior's flag
    dropped, the note left out of ``search_candidates``, a point written into the note of a text read as one (the
    source then loses its label)."""
    from sparserl.search.loop import FILLED_NOTE
    from sparserl.search.run import search_candidates
    from tests.search.doubles import timed_result

    A, card = block
    csr = variants("spmv", "CSR")
    filled, plain = csr[0].render() + "// filled\n", csr[1].render() + "// plain\n"  # template points, as written

    class FillingProposer(FakeProposer):
        def sample(self, n: int) -> list[str]:
            out = [(filled, plain)[i % 2] for i in range(n)]
            self.last_filled = tuple(t is filled for t in out)
            return out

        def refine(self, previous, result, n):
            self.last_filled = ()
            return []

    ev = FakeTimingDouble(lambda text: 20.0)
    prior = [(csr[2].render() + "// before\n", timed_result("spmv", None, "block", 12.0), True),
             (csr[3].render() + "// before, as written\n", timed_result("spmv", None, "block", 13.0))]
    cfg = SearchConfig(budget=16, policy_share=0.5, policy_batch=2, parallel=1)  # the prior count in the quota
    res = run_search(A, "block", "spmv", None, cfg, ev, card=card, proposer=FillingProposer([], []), prior=prior,
                     progress=False)
    notes = {normalised(e.proposal.text).split("// ")[-1]: e.proposal.note for e in res.entries
             if e.proposal.provenance is Provenance.POLICY_SAMPLE}
    assert notes["filled"] == FILLED_NOTE and notes["plain"] == "", notes
    assert all(e.proposal.point_id for e in res.entries if e.proposal.provenance is Provenance.POLICY_SAMPLE), \
        "template points: read as points, their notes as the proposer's"
    assert notes["before"] == f"drawn before the search, {FILLED_NOTE}"
    assert notes["before, as written"] == "drawn before the search"
    sources = {normalised(c.text).split("// ")[-1]: c.detail for c in search_candidates(res)}
    assert sources["filled"].endswith(f"({FILLED_NOTE})") and FILLED_NOTE not in sources["plain"]
